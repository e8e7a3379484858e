"""Ray Serve LLM's own OpenAI apps as the benchmarks run them, in Ray Serve LLM's environment (started by
benchmarks/peers.py): a Ray instance of their own with 8 logical CPUs (as our own runs use: engines are bounded
by their OpenMP threads), Serve's HTTP on 127.0.0.1:PORT, tokens streamed as they come (stream batching off,
as ours), the engines' settings those of our CPU pools.

    python ray_serve_llm_app.py openai MODEL_DIR NAME PORT REPLICAS BLOCK MAX_LEN KV_BYTES ROUTER
    python ray_serve_llm_app.py pd MODEL_DIR NAME PORT BLOCK MAX_LEN KV_BYTES
    python ray_serve_llm_app.py step MODEL_DIR NAME PORT REPLICAS

openai: `build_openai_app`, REPLICAS vLLM replicas, ROUTER its request router class (`default`: Serve's own);
pd: `build_pd_openai_app`, 1 prefill + 1 decode vLLM replica joined by NixlConnector (CPU buffers);
step: `build_openai_app` on the engine class RAYLLM_VLLM_ENGINE_CLS names (benchmarks/peer_step_engine.py).
"""

import sys
import time


def _config(model_dir: str, name: str, cpus: float, replicas: int, deployment: dict | None = None, **kwargs):
    from ray.serve.llm import LLMConfig

    return LLMConfig(
        model_loading_config=dict(model_id=name, model_source=model_dir),
        accelerator_config={"kind": "cpu"},
        placement_group_config={"bundles": [{"CPU": cpus}]},
        deployment_config=dict(
            autoscaling_config=dict(min_replicas=replicas, max_replicas=replicas), **(deployment or {})
        ),
        experimental_configs={"stream_batching_interval_ms": 0},  # tokens streamed as they come, as ours
        **kwargs,
    )


def _engine(block: str, max_len: str, kv_bytes: str, **extra) -> dict:
    return dict(
        dtype="float32",
        max_model_len=int(max_len),
        enforce_eager=True,
        block_size=int(block),
        enable_prefix_caching=True,
        kv_cache_memory_bytes=int(kv_bytes),
        **extra,
    )


def openai(model_dir, name, replicas, block, max_len, kv_bytes, router):
    from ray.serve.config import RequestRouterConfig
    from ray.serve.llm import build_openai_app

    routing = {} if router == "default" else {"request_router_config": RequestRouterConfig(request_router_class=router)}
    cfg = _config(model_dir, name, 0.5, int(replicas), routing, engine_kwargs=_engine(block, max_len, kv_bytes))
    return lambda: build_openai_app({"llm_configs": [cfg]})


def pd(model_dir, name, block, max_len, kv_bytes):
    from ray.serve.llm import build_pd_openai_app

    nixl = dict(kv_connector="NixlConnector", kv_role="kv_both", kv_buffer_device="cpu")

    def config():
        engine = _engine(block, max_len, kv_bytes, kv_transfer_config=nixl)
        return _config(model_dir, name, 0.5, 1, engine_kwargs=engine)

    return lambda: build_pd_openai_app(dict(prefill_config=config(), decode_config=config()))


def step(model_dir, name, replicas):
    from ray.serve.llm import build_openai_app

    cfg = _config(model_dir, name, 0.1, int(replicas), {"max_ongoing_requests": 2048})
    return lambda: build_openai_app({"llm_configs": [cfg]})


APPS = {"openai": openai, "pd": pd, "step": step}


def main(kind: str, model_dir: str, name: str, port: str, *args: str) -> None:
    import ray
    from ray import serve

    build = APPS[kind](model_dir, name, *args)
    ray.init(address="local", num_cpus=8)
    serve.start(http_options={"host": "127.0.0.1", "port": int(port)})
    serve.run(build(), blocking=False)
    while True:
        time.sleep(60)


if __name__ == "__main__":
    main(*sys.argv[1:])
