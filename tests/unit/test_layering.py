"""The pure core stays pure: no Ray, engines or network at module level in
orchestrator/ (engine adapters may import their engine, lazily); only
deployments/ imports Ray Serve; only the engine registry maps an engine kind
to behaviour."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
FORBIDDEN_IN_CORE = {"ray", "vllm", "sglang", "httpx", "aiohttp", "requests", "zmq", "socket_server"}
# Our packages, each scanned for engine imports and engine-kind dispatch.
PACKAGES = ("orchestrator", "deployments", "tools", "benchmarks")
# Engine library -> the only files that may import it.
ENGINE_LIB_USERS = {
    # vllm_plugin.py is the vLLM adapter's half that vLLM loads into its own engine processes;
    # scheduler_cost.py times vLLM's own KV event classes against our decoder; lora_costs.py times vLLM's
    # engine itself (a prompt block, an adapter's first use), the costs the LoRA routing weighs.
    "vllm": {
        "orchestrator/engines/vllm_engine.py",
        "orchestrator/engines/vllm_plugin.py",
        "orchestrator/engines/vllm_tool_parsers.py",
        "orchestrator/engines/vllm_reasoning_parsers.py",
        "benchmarks/scheduler_cost.py",
        "benchmarks/lora_costs.py",
    },
    "sglang": {"orchestrator/engines/sglang_engine.py"},
    # tiny_model.py writes the tiny test model's weights (torch + transformers); it runs no engine.
    # h100_step_profile.py times decoder layers on a GPU with nothing but PyTorch (no engine there).
    "torch": {"orchestrator/tiny_model.py", "benchmarks/gpu/h100_step_profile.py"},
}
ENGINE_KINDS = {"vllm", "sim", "sglang"}
REGISTRY = "orchestrator/engines/__init__.py"
# Comparisons with an engine kind that are no dispatch: file -> why.
KIND_COMPARISONS_ALLOWED = {
    "benchmarks/gpu/sglang_pd.py": "checks that the replicas it started report kind sglang",
}


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


def _sources() -> list[Path]:
    return [p for package in PACKAGES for p in sorted((ROOT / package).rglob("*.py"))]


def test_engine_libraries_are_imported_only_by_their_adapters():
    users = {lib: set() for lib in ENGINE_LIB_USERS}
    for path in _sources():
        for lib in _all_imports(path) & set(ENGINE_LIB_USERS):
            users[lib].add(str(path.relative_to(ROOT)))
    assert {lib: files - ENGINE_LIB_USERS[lib] for lib, files in users.items()} == {lib: set() for lib in users}


def test_resolving_every_engine_adapter_imports_no_engine_library():
    """The registry imports adapter modules on first use; the adapters import
    their engine only inside the functions that run it (or check settings
    against it: `check_config`, not called here)."""
    probe = (
        "import sys\n"
        "from orchestrator.config import AppConfig\n"
        "from orchestrator.engines import ADAPTER_MODULES, EngineSpec, engine_adapter\n"
        "from orchestrator.engines.base import EngineRole\n"
        "for kind in ADAPTER_MODULES:\n"
        "    app = AppConfig.model_validate({'model': {'name': 'm', 'source': 'org/m', 'max_model_len': 4096},\n"
        "                                    'prefill_pool': {'engine': {'kind': kind}},\n"
        "                                    'decode_pool': {'engine': {'kind': kind}}})\n"
        "    adapter, engine = engine_adapter(kind), app.decode_pool.engine\n"
        "    adapter.create(EngineSpec.for_pool(app, app.decode_pool, EngineRole.DECODE, '127.0.0.1'))\n"
        "    adapter.process_env(engine, app.network), adapter.planner_inputs(engine), adapter.placement(1, 2, {})\n"
        "print(sorted({m.split('.')[0] for m in sys.modules} & {'vllm', 'sglang', 'torch', 'ray'}))\n"
    )
    out = subprocess.run([sys.executable, "-c", probe], cwd=ROOT, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def _engine_kind_literals(node: ast.AST) -> set[str]:
    """Engine kinds written as a string constant, or in a tuple/list/set of them."""
    if isinstance(node, ast.Constant) and node.value in ENGINE_KINDS:
        return {node.value}
    if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
        return set().union(*(_engine_kind_literals(e) for e in node.elts))
    return set()


def _kind_dispatch_lines(source: str) -> list[int]:
    """Lines of comparisons (`==`, `!=`, `in`, ...) and `match` cases against an engine kind literal."""
    lines = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Compare):
            operands = [node.left, *node.comparators]
        elif isinstance(node, ast.MatchValue):
            operands = [node.value]
        else:
            continue
        if any(_engine_kind_literals(o) for o in operands):
            lines.append(node.lineno)
    return sorted(lines)


def test_no_dispatch_on_engine_kind_outside_the_registry():
    """What differs between engine kinds is a field of their EngineAdapter
    (orchestrator/engines/adapter.py), found through the registry."""
    allowed = {REGISTRY, *KIND_COMPARISONS_ALLOWED}
    sites = [
        f"{name}:{line}"
        for path in _sources()
        if (name := str(path.relative_to(ROOT))) not in allowed
        for line in _kind_dispatch_lines(path.read_text())
    ]
    assert sites == []


def test_the_dispatch_scan_finds_comparisons_and_match_cases():
    source = (
        "if kind == 'vllm': pass\n"
        "if k in ('sim', 'x'): pass\n"
        "match k:\n"
        "    case 'sglang': pass\n"
        "if kind == 'other' or engine == {'kind': 'vllm'}['kind']: pass\n"
    )
    assert _kind_dispatch_lines(source) == [1, 2, 4]


def test_ray_is_imported_only_by_deployments():
    for package in ("orchestrator", "tools"):
        users = [str(p.relative_to(ROOT)) for p in (ROOT / package).rglob("*.py") if "ray" in _all_imports(p)]
        assert users == [], f"{package} imports ray: {users}"


def _imports_of(package: str) -> dict[str, set[str]]:
    return {str(p.relative_to(ROOT)): _all_imports(p) for p in sorted((ROOT / package).rglob("*.py"))}


def test_each_layer_imports_only_the_layers_below_it():
    """core (orchestrator) <- shell (deployments) and tools <- experiments (benchmarks)."""
    forbidden = {
        "orchestrator": {"deployments", "tools", "benchmarks"},
        "deployments": {"tools", "benchmarks"},
        "tools": {"deployments", "benchmarks"},
    }
    leaks = {
        f"{path}: {sorted(names & forbidden[package])}"
        for package in forbidden
        for path, names in _imports_of(package).items()
        if names & forbidden[package]
    }
    assert leaks == set()


# The frontend's parts and where they may be constructed: orchestrator/frontend.py and
# build_routing assemble them for the Serve deployment, the sim server and the simulator.
ASSEMBLED_PARTS = {
    "KVIndex",
    "KVEventIngest",
    "make_scheduler",
    "ShapeRouter",
    "RequestPath",
    "CompletionService",
    "KVEventSubscriber",
}
ASSEMBLERS = {
    "orchestrator/frontend.py",
    "orchestrator/routing/__init__.py",
    # a scheduler made without an index makes its own (unit tests of the scheduler alone)
    "orchestrator/routing/kv_scheduler.py",
    # times the index and its ingest in isolation
    "benchmarks/scheduler_cost.py",
}


def test_the_frontend_is_assembled_in_one_place():
    def constructed(path: Path) -> set[str]:
        return {
            node.func.id
            for node in ast.walk(ast.parse(path.read_text()))
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in ASSEMBLED_PARTS
        }

    sites = {
        name: sorted(parts)
        for path in _sources()
        if (name := str(path.relative_to(ROOT))) not in ASSEMBLERS and (parts := constructed(path))
    }
    assert sites == {}


def _defines_root(path: Path) -> bool:
    """Whether the file assigns a name ROOT anywhere."""
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Assign):
            targets = node.targets
        elif isinstance(node, ast.AnnAssign):
            targets = [node.target]
        else:
            continue
        if any(isinstance(t, ast.Name) and t.id == "ROOT" for t in targets):
            return True
    return False


def test_experiments_take_the_repository_paths_from_launch_alone():
    """benchmarks/launch.py is the one place for the repository's paths (ROOT, RESULTS, ...)."""
    owners = [str(p.relative_to(ROOT)) for p in sorted((ROOT / "benchmarks").rglob("*.py")) if _defines_root(p)]
    assert owners == ["benchmarks/launch.py"]


def test_the_config_tree_validates_without_the_engine_registry():
    """The registry and the adapters import orchestrator.config; config.py imports nothing of
    orchestrator.engines, not even lazily (no circle): what needs an adapter is checked by
    `orchestrator.engines.check_app` when the application is built."""
    tree = ast.parse((ROOT / "orchestrator" / "config.py").read_text())
    modules = {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module}
    modules |= {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    assert not {m for m in modules if m.startswith("orchestrator.engines")}
