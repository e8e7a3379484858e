"""The `sglang` extra against the pinned SGLang's own requirements, offline:
the release scripts/setup.sh installs without its dependencies carries its
requirement list (the wheel's metadata), so a pin of ours that SGLang's
release refuses fails here. scripts/resolve_sglang.sh runs pip's full
resolver over the extra (not in CI: it reads the whole dependency tree) and
commits what it chose as constraints/sglang.txt; this checks that file is
not stale."""

from __future__ import annotations

import importlib.metadata
import tomllib
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parents[2]
PROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
EXTRA = [Requirement(r) for r in PROJECT["optional-dependencies"]["sglang"]]
# What '.[sglang]' installs at pinned versions: the core and the extra.
PINS = {canonicalize_name(r.name): r for r in [Requirement(r) for r in PROJECT["dependencies"]] + EXTRA}


def _pinned_version(requirement: Requirement) -> str:
    (spec,) = requirement.specifier
    assert spec.operator == "==", f"{requirement} is not pinned"
    return spec.version


def _sglang_requirements(extras: set[str]) -> list[Requirement]:
    """The installed SGLang's requirements with `extras` requested, its
    self-references (`sglang[x]` inside `[all]`) followed."""
    wanted, seen, found = set(extras), set(), []
    while wanted - seen:
        extra = (wanted - seen).pop()
        seen.add(extra)
        for line in importlib.metadata.requires("sglang") or []:
            req = Requirement(line)
            if req.marker is not None and not req.marker.evaluate({"extra": extra}):
                continue
            if canonicalize_name(req.name) == "sglang":
                wanted |= req.extras
            else:
                found.append(req)
    return found


def test_the_extra_pins_plain_sglang_and_it_is_the_one_installed():
    (sglang,) = [r for r in EXTRA if canonicalize_name(r.name) == "sglang"]
    assert sglang.extras == set()  # [all] pulls [diffusion]: PyYAML==6.0.1 against our pyyaml pin
    assert importlib.metadata.version("sglang") == _pinned_version(sglang)


def test_our_pins_satisfy_the_pinned_sglangs_requirements():
    (sglang,) = [r for r in EXTRA if canonicalize_name(r.name) == "sglang"]
    refused = [
        f"{PINS[canonicalize_name(req.name)]} against sglang's {req}"
        for req in _sglang_requirements({""} | sglang.extras)
        if canonicalize_name(req.name) in PINS
        and not req.specifier.contains(_pinned_version(PINS[canonicalize_name(req.name)]), prereleases=True)
    ]
    assert refused == []


def test_sglang_all_would_conflict_as_the_check_says():
    """The check above sees what broke `sglang[all]`."""
    conflicting = [req for req in _sglang_requirements({"", "all"}) if canonicalize_name(req.name) == "pyyaml"]
    assert conflicting and not any(r.specifier.contains(_pinned_version(PINS["pyyaml"])) for r in conflicting)


def test_the_committed_resolution_matches_the_pins():
    lines = (ROOT / "constraints" / "sglang.txt").read_text().splitlines()
    resolved = dict(line.split("==") for line in lines if line and not line.startswith("#"))
    resolved = {canonicalize_name(name): version for name, version in resolved.items()}
    assert {name: resolved.get(name) for name in PINS} == {name: _pinned_version(r) for name, r in PINS.items()}
