"""A prefill replica dies: the request is prefilled on the decode replica and
the client still gets the right answer, and the dead replica's engine
processes do not outlive it. Runs last: it kills a replica of the shared
application (Serve starts a new one)."""

from __future__ import annotations

import time

import psutil
import pytest
import ray

from tests.integration.test_disaggregated_serving import MODEL, completion_text, text_prompt

pytestmark = pytest.mark.integration


def _prefill_replica_actors() -> list[str]:
    return [a["name"] for a in ray.util.list_named_actors(all_namespaces=True)
            if a["name"].startswith("SERVE_REPLICA::disagg#prefill_pool#")]


def _replica_process(pool: str) -> list[psutil.Process]:
    return [p for p in psutil.process_iter(["cmdline"])
            if (p.info["cmdline"] or [""])[0].startswith(f"ray::ServeReplica:disagg:{pool}")]


def _wait_gone(processes: list[psutil.Process], timeout_s: float = 20) -> None:
    deadline = time.monotonic() + timeout_s
    while any(p.is_running() and p.status() != psutil.STATUS_ZOMBIE for p in processes):
        assert time.monotonic() < deadline, f"processes outlived their parent: {processes}"
        time.sleep(0.5)


def test_dead_prefill_replica_falls_back_to_local_prefill(apps):
    # Long enough that the scheduler sends it to the prefill pool.
    body = {"model": MODEL, "prompt": text_prompt(700, seed=77), "max_tokens": 16, "temperature": 0, "ignore_eos": True}
    expected = completion_text(apps, "agg", body)
    fallbacks_before = apps.metric("disagg", "orchestrator_prefill_fallbacks_total")

    (name,) = _prefill_replica_actors()
    (replica,) = _replica_process("prefill_pool")
    engine_processes = replica.children(recursive=True)
    assert engine_processes, "a vLLM replica runs its engine in child processes"
    ray.kill(ray.get_actor(name, namespace="serve"), no_restart=True)

    assert completion_text(apps, "disagg", body) == expected
    assert apps.metric("disagg", "orchestrator_prefill_fallbacks_total") == fallbacks_before + 1

    _wait_gone(engine_processes)


def test_a_crashed_engine_core_takes_its_workers_with_it(apps):
    """The engine core dies (OOM killer, segfault): its worker processes must not
    linger holding memory and a NIXL progress thread."""
    engine_core = [p for p in _replica_process("decode_pool")[0].children() if "EngineCore" in p.name()][0]
    workers = engine_core.children(recursive=True)
    assert workers
    engine_core.kill()
    _wait_gone(workers)
