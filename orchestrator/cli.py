"""`orchestrator` command line."""

from __future__ import annotations

import argparse
import json
import sys

DEFAULT_TINY_MODEL_DIR = "~/.cache/orchestrator/tiny-llama"


def _make_tiny_model(args: argparse.Namespace) -> int:
    from orchestrator.tiny_model import make_tiny_model

    print(make_tiny_model(args.dir))
    return 0


def _check_config(args: argparse.Namespace) -> int:
    from orchestrator.config import load_app_config

    config = load_app_config(args.config)
    print(json.dumps(config.model_dump(mode="json"), indent=2))
    return 0


def _sample_request(args: argparse.Namespace) -> int:
    from harness.sample_request import run_sample_request

    return run_sample_request(args.url, args.wait_s, args.prompt, args.max_tokens)


def _bench(args: argparse.Namespace) -> int:
    from harness.cli import run_bench

    return run_bench(args)


def _simulate(args: argparse.Namespace) -> int:
    from harness.simulate import run_simulation

    return run_simulation(args)


def _sim_server(args: argparse.Namespace) -> int:
    from harness.sim_server import run_sim_server

    return run_sim_server(args)


def _profile(args: argparse.Namespace) -> int:
    from harness.profile import run_profile

    return run_profile(args)


def _experiment_autoscale(args: argparse.Namespace) -> int:
    from harness.autoscale import run_experiment

    return run_experiment(args)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="orchestrator", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("make-tiny-model", help="write a tiny random Llama + tokenizer (no download)")
    p.add_argument("dir", nargs="?", default=DEFAULT_TINY_MODEL_DIR)
    p.set_defaults(func=_make_tiny_model)

    p = sub.add_parser("check-config", help="validate a Serve config's application args and print them")
    p.add_argument("config")
    p.set_defaults(func=_check_config)

    p = sub.add_parser("bench", help="benchmark an OpenAI-compatible server (sweep, rate, trace replay)")
    from harness.cli import add_arguments

    add_arguments(p)
    p.set_defaults(func=_bench)

    p = sub.add_parser("simulate", help="the cluster simulator: real scheduler, simulated replicas, virtual time")
    from harness.simulate import add_arguments as add_simulate_arguments

    add_simulate_arguments(p)
    p.set_defaults(func=_simulate)

    p = sub.add_parser("sim-server", help="one simulated engine behind the OpenAI API, without Ray")
    from harness.sim_server import add_arguments as add_sim_server_arguments

    add_sim_server_arguments(p)
    p.set_defaults(func=_sim_server)

    p = sub.add_parser("profile", help="measure one engine configuration: prefill TTFT by ISL, decode ITL by batch")
    from harness.profile import add_arguments as add_profile_arguments

    add_profile_arguments(p)
    p.set_defaults(func=_profile)

    p = sub.add_parser("experiment", help="experiments on the cluster simulator")
    experiments = p.add_subparsers(dest="experiment", required=True)
    p = experiments.add_parser("autoscale", help="autoscaling policies on time-varying load (virtual time)")
    from harness.autoscale import add_arguments as add_autoscale_arguments

    add_autoscale_arguments(p)
    p.set_defaults(func=_experiment_autoscale)

    p = sub.add_parser("sample-request", help="wait for a server to be ready, send one chat request, print it")
    p.add_argument("--url", default="http://127.0.0.1:8000")
    p.add_argument("--wait-s", type=float, default=600.0)
    p.add_argument("--prompt", default="Explain disaggregated prefill and decode in one sentence.")
    p.add_argument("--max-tokens", type=int, default=32)
    p.set_defaults(func=_sample_request)

    args = parser.parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
