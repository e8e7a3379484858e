"""A prefill replica dies: the request is prefilled on the decode replica and
the client still gets the right answer. Runs last: it kills a replica of the
shared application (Serve starts a new one)."""

from __future__ import annotations

import pytest
import ray

from tests.integration.test_disaggregated_serving import MODEL, completion_text, text_prompt

pytestmark = pytest.mark.integration


def _prefill_replica_actors() -> list[str]:
    return [a["name"] for a in ray.util.list_named_actors(all_namespaces=True)
            if a["name"].startswith("SERVE_REPLICA::disagg#prefill_pool#")]


def test_dead_prefill_replica_falls_back_to_local_prefill(apps):
    body = {"model": MODEL, "prompt": text_prompt(200, seed=77), "max_tokens": 16, "temperature": 0, "ignore_eos": True}
    expected = completion_text(apps, "agg", body)
    fallbacks_before = apps.metric("disagg", "orchestrator_prefill_fallbacks_total")

    (name,) = _prefill_replica_actors()
    ray.kill(ray.get_actor(name, namespace="serve"), no_restart=True)

    assert completion_text(apps, "disagg", body) == expected
    assert apps.metric("disagg", "orchestrator_prefill_fallbacks_total") == fallbacks_before + 1
