"""`orchestrator sim-server`: one simulated engine behind the project's OpenAI
API, without Ray — a stand-in for a vLLM server, so that any router (SGLang's,
Dynamo's frontend over HTTP workers, ours) can be put in front of N of them.

    orchestrator sim-server --port 18001 --gpu H100 --sim-model llama-3.1-8b \\
        --tokenizer ~/.cache/orchestrator/tiny-llama
"""

from __future__ import annotations

import argparse
import asyncio
import time
from pathlib import Path

from orchestrator.api.admission import AdmissionGate
from orchestrator.api.app import AppHooks, Health, build_openai_app
from orchestrator.api.service import CompletionService, ModelCard
from orchestrator.config import KVCacheConfig, LimitsConfig, ModelConfig, RoutingConfig, SimEngineConfig
from orchestrator.engines.adapter import EngineSpec
from orchestrator.engines.base import EngineRole
from orchestrator.engines.local_pool import LocalPool
from orchestrator.engines.sim_engine import SimEngine
from orchestrator.metrics import FrontendMetrics
from orchestrator.prompts import PromptRenderer, load_tokenizer
from orchestrator.request_path import RequestPath
from orchestrator.routing import make_scheduler
from orchestrator.kv.index import KVIndex


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--served-model-name", default="sim")
    p.add_argument("--tokenizer", default="~/.cache/orchestrator/tiny-llama",
                   help="tokenizer directory (prompts and output text; the simulated model is --sim-model)")
    p.add_argument("--gpu", choices=["H100", "H200", "A100"], default="H100")
    p.add_argument("--sim-model", choices=["llama-3.1-8b", "llama-3.1-70b", "qwen3-32b"], default="llama-3.1-8b")
    p.add_argument("--tp", type=int, default=1)
    p.add_argument("--profile", help="profile from `orchestrator profile` (replaces the roofline)")
    p.add_argument("--num-gpu-blocks", type=int)
    p.add_argument("--block-size", type=int, default=16)
    p.add_argument("--max-model-len", type=int, default=32768)
    p.add_argument("--kv-events", action="store_true", help="publish KV events (vLLM's ZMQ format) on --host")


async def build(args: argparse.Namespace):
    tokenizer_dir = str(Path(args.tokenizer).expanduser())
    model = ModelConfig(name=args.served_model_name, source=tokenizer_dir, max_model_len=args.max_model_len)
    engine_cfg = SimEngineConfig(kind="sim", gpu=args.gpu, model=args.sim_model, tensor_parallel_size=args.tp,
                                 profile=args.profile, num_gpu_blocks=args.num_gpu_blocks)
    engine = SimEngine(EngineSpec(model, KVCacheConfig(block_size=args.block_size), engine_cfg, EngineRole.AGGREGATED,
                                  args.host, publish_kv_events=args.kv_events))
    pool = LocalPool("decode_pool", engine)
    info = await pool.start()
    tokenizer = await asyncio.to_thread(load_tokenizer, tokenizer_dir)
    metrics = FrontendMetrics(pools=lambda: {"decode_pool": pool.replicas()})
    scheduler = make_scheduler(RoutingConfig(policy="round_robin"), args.block_size, KVIndex())
    path = RequestPath(pool, None, scheduler, metrics, prefill_timeout_s=30, max_migrations=0,
                       detokenize=lambda ids: tokenizer.decode(ids, skip_special_tokens=True))
    service = CompletionService(ModelCard(model.name, model.max_model_len, created=int(time.time())),
                                PromptRenderer(tokenizer), path, metrics, limits=LimitsConfig(),
                                gate=AdmissionGate(1024), retry_after_s=1)

    async def health() -> Health:
        return Health(ready=True, detail={"engine": info.to_dict()})

    return build_openai_app(service, AppHooks(health=health, pools=lambda: {"decode_pool": info.to_dict()}))


def run_sim_server(args: argparse.Namespace) -> int:
    import uvicorn

    async def serve() -> None:
        app = await build(args)
        server = uvicorn.Server(uvicorn.Config(app, host=args.host, port=args.port, log_level="warning"))
        await server.serve()

    asyncio.run(serve())
    return 0
