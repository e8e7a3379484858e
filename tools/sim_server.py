"""`orchestrator sim-server`: one simulated engine behind the project's OpenAI
API, without Ray — a stand-in for a vLLM server, so that any router (SGLang's,
Dynamo's frontend over HTTP workers, ours) can be put in front of N of them.

    orchestrator sim-server --port 18001 --gpu H100 --sim-model llama-3.1-8b \\
        --tokenizer ~/.cache/orchestrator/tiny-llama
"""

from __future__ import annotations

import argparse
import asyncio
from pathlib import Path

from orchestrator.api.app import AppHooks, Health, build_openai_app
from orchestrator.config import (
    PRIMARY_GROUP,
    AppConfig,
    FrontendConfig,
    KVCacheConfig,
    ModelConfig,
    PoolConfig,
    RoutingConfig,
)
from orchestrator.engines.adapter import EngineSpec
from orchestrator.engines.base import EngineRole
from orchestrator.engines.local_pool import LocalPool
from orchestrator.engines.sim_engine import SimEngine
from orchestrator.frontend import PoolGroup, build_frontend
from orchestrator.prompts import load_tokenizer
from tools.simulate import sim_engine_config


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--served-model-name", default="sim")
    p.add_argument(
        "--tokenizer",
        default="~/.cache/orchestrator/tiny-llama",
        help="tokenizer directory (prompts and output text; the simulated model is --sim-model)",
    )
    p.add_argument("--gpu", choices=["H100", "H200", "A100"], default="H100")
    p.add_argument("--sim-model", choices=["llama-3.1-8b", "llama-3.1-70b", "qwen3-32b"], default="llama-3.1-8b")
    p.add_argument("--tp", type=int, default=1)
    p.add_argument("--profile", help="profile from `orchestrator profile` (replaces the roofline)")
    p.add_argument("--num-gpu-blocks", type=int)
    p.add_argument("--block-size", type=int, default=16)
    p.add_argument("--max-model-len", type=int, default=32768)
    p.add_argument("--kv-events", action="store_true", help="publish KV events (vLLM's ZMQ format) on --host")


def app_config(args: argparse.Namespace) -> AppConfig:
    """One aggregated pool of one simulated engine, round-robin (there is nothing to choose between)."""
    engine = sim_engine_config(args)
    return AppConfig(
        model=ModelConfig(
            name=args.served_model_name, source=str(Path(args.tokenizer).expanduser()), max_model_len=args.max_model_len
        ),
        kv_cache=KVCacheConfig(block_size=args.block_size),
        decode_pool=PoolConfig(engine=engine),
        routing=RoutingConfig(policy="round_robin"),
        frontend=FrontendConfig(max_in_flight=1024, max_migrations=0),
    )


async def build(args: argparse.Namespace):
    config = app_config(args)
    engine = SimEngine(
        EngineSpec(
            config.model,
            config.kv_cache,
            config.decode_pool.engine,
            EngineRole.AGGREGATED,
            args.host,
            publish_kv_events=args.kv_events,
        )
    )
    pool = LocalPool("decode_pool", engine)
    await pool.start()
    tokenizer = await asyncio.to_thread(load_tokenizer, config.model.tokenizer_source)
    parts = build_frontend(config, {PRIMARY_GROUP: PoolGroup(pool)}, tokenizer)

    async def health() -> Health:
        return parts.health()

    return build_openai_app(parts.service, AppHooks(health=health, pools=parts.pools_report))


def run_sim_server(args: argparse.Namespace) -> int:
    import uvicorn

    async def serve() -> None:
        app = await build(args)
        server = uvicorn.Server(uvicorn.Config(app, host=args.host, port=args.port, log_level="warning"))
        await server.serve()

    asyncio.run(serve())
    return 0
