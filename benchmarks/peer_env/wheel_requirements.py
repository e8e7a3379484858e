"""Requires-Dist of wheels whose markers hold in this interpreter's environment (base plus extras), less the
skipped names, as a JSON list. Run by benchmarks/dynamo_peer.py in Dynamo's venv (it needs `packaging`):

    python wheel_requirements.py '[["a.whl", ...], ["vllm"], ["skipped-name", ...]]'
"""

import json
import sys
import zipfile
from email.parser import Parser

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name


def requirements(wheels: list[str], extras: list[str], skipped: list[str]) -> list[str]:
    skipped = {canonicalize_name(n) for n in skipped}
    out = []
    for wheel in wheels:
        with zipfile.ZipFile(wheel) as z:
            name = next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))
            meta = Parser().parsestr(z.read(name).decode())
        for line in meta.get_all("Requires-Dist") or []:
            req = Requirement(line)
            if canonicalize_name(req.name) in skipped:
                continue
            if req.marker is not None and not any(req.marker.evaluate({"extra": e}) for e in ["", *extras]):
                continue
            req.marker = None
            out.append(str(req))
    return sorted(set(out))


if __name__ == "__main__":
    print(json.dumps(requirements(*json.loads(sys.argv[1]))))
