"""The `orchestrator` command: the user-facing tools. Experiments (benchmarks/)
are scripts of their own, run as `python -m benchmarks.<name>`."""

from __future__ import annotations

import argparse
import importlib
import json
import sys

DEFAULT_TINY_MODEL_DIR = "~/.cache/orchestrator/tiny-llama"
DEFAULT_TINY_LORA_DIR = "~/.cache/orchestrator/tiny-lora"


def _make_tiny_model(args: argparse.Namespace) -> int:
    from orchestrator.tiny_model import make_tiny_model

    print(make_tiny_model(args.dir))
    return 0


def _make_tiny_lora(args: argparse.Namespace) -> int:
    from pathlib import Path

    from orchestrator.lora.tiny import make_tiny_lora

    for i in range(args.count):
        print(make_tiny_lora(args.model_dir, Path(args.dir).expanduser() / f"{args.prefix}{i}", seed=args.seed + i))
    return 0


def _check_config(args: argparse.Namespace) -> int:
    from orchestrator.api.exposure import SERVE_DEFAULT_HOST, exposure_problem
    from orchestrator.config import load_app_config, load_serve_config
    from orchestrator.engines import check_app

    config = load_app_config(args.config)
    check_app(config)
    doc = load_serve_config(args.config)
    if isinstance(doc, dict) and "applications" in doc:
        host = (doc.get("http_options") or {}).get("host", SERVE_DEFAULT_HOST)
        problem = exposure_problem(host, config.frontend.auth, bool(config.traffic.tenants))
        if problem is not None:
            print(f"refused: {problem}", file=sys.stderr)
            return 1
    print(json.dumps(config.model_dump(mode="json"), indent=2))
    return 0


def _sample_request(args: argparse.Namespace) -> int:
    from tools.sample_request import SAMPLE_PROMPT, run_sample_request

    return run_sample_request(args.url, args.wait_s, args.prompt or SAMPLE_PROMPT, args.max_tokens)


# Tools with their own module: (command, help, module with add_arguments(parser), its entry function).
TOOLS = [
    ("bench", "benchmark an OpenAI-compatible server (sweep, rate, trace replay)", "tools.bench_cli", "run_bench"),
    (
        "simulate",
        "the cluster simulator: real scheduler, simulated replicas, virtual time",
        "tools.simulate",
        "run_simulation",
    ),
    ("sim-server", "one simulated engine behind the OpenAI API, without Ray", "tools.sim_server", "run_sim_server"),
    (
        "profile",
        "measure one engine configuration: prefill TTFT by ISL, decode ITL by batch",
        "tools.profile",
        "run_profile",
    ),
]


def _add_tools(sub, tools) -> None:
    for name, help_text, module_name, entry in tools:
        module = importlib.import_module(module_name)
        p = sub.add_parser(name, help=help_text)
        module.add_arguments(p)
        p.set_defaults(func=getattr(module, entry))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="orchestrator", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("make-tiny-model", help="write a tiny random Llama + tokenizer (no download)")
    p.add_argument("dir", nargs="?", default=DEFAULT_TINY_MODEL_DIR)
    p.set_defaults(func=_make_tiny_model)

    p = sub.add_parser("make-tiny-lora", help="write PEFT LoRA adapters of the tiny model (no download)")
    p.add_argument("dir", nargs="?", default=DEFAULT_TINY_LORA_DIR, help="adapters go to DIR/<prefix><i>")
    p.add_argument("--model-dir", default=DEFAULT_TINY_MODEL_DIR)
    p.add_argument("--count", type=int, default=2)
    p.add_argument("--prefix", default="tiny-lora-")
    p.add_argument("--seed", type=int, default=1, help="adapter i is seeded with seed + i")
    p.set_defaults(func=_make_tiny_lora)

    p = sub.add_parser("check-config", help="validate a Serve config's application args and print them")
    p.add_argument("config")
    p.set_defaults(func=_check_config)

    _add_tools(sub, TOOLS)

    p = sub.add_parser("sample-request", help="wait for a server to be ready, send one chat request, print it")
    p.add_argument("--url", default="http://127.0.0.1:8000")
    p.add_argument("--wait-s", type=float, default=600.0)
    p.add_argument(
        "--prompt",
        default=None,
        help="default: a ~1,000-token prompt, long enough to be prefilled remotely under the CPU configs",
    )
    p.add_argument("--max-tokens", type=int, default=32)
    p.set_defaults(func=_sample_request)

    args = parser.parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
