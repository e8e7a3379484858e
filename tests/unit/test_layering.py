"""The pure core stays pure: no Ray, engines or network at module level in
orchestrator/ (engine adapters may import their engine, lazily); only
deployments/ imports Ray Serve."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
FORBIDDEN_IN_CORE = {"ray", "vllm", "sglang", "httpx", "aiohttp", "requests", "zmq", "socket_server"}
ENGINE_LIBS = {"vllm", "sglang"}


def _module_level_imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    names = set()
    for node in tree.body:
        if isinstance(node, ast.Import):
            names |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module.split(".")[0])
    return names


def _all_imports(path: Path) -> set[str]:
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module.split(".")[0])
    return names


def test_core_has_no_ray_engine_or_network_imports_at_module_level():
    leaks = {
        str(p.relative_to(ROOT)): sorted(_module_level_imports(p) & FORBIDDEN_IN_CORE)
        for p in (ROOT / "orchestrator").rglob("*.py")
    }
    assert {k: v for k, v in leaks.items() if v} == {}


def test_only_engine_adapters_import_engine_libraries():
    users = {
        str(p.relative_to(ROOT))
        for p in (ROOT / "orchestrator").rglob("*.py")
        if _all_imports(p) & ENGINE_LIBS
    }
    # vllm_plugin.py is the vLLM adapter's half that vLLM loads into its own engine processes.
    assert users <= {"orchestrator/engines/vllm_engine.py", "orchestrator/engines/vllm_plugin.py",
                     "orchestrator/engines/sglang_engine.py"}


def test_ray_is_imported_only_by_deployments():
    for package in ("orchestrator", "harness"):
        users = [str(p.relative_to(ROOT)) for p in (ROOT / package).rglob("*.py") if "ray" in _all_imports(p)]
        assert users == [], f"{package} imports ray: {users}"
