"""SLO classes and tenants: what a request resolves to, the class gate's decisions as scripted lifecycles on
an explicit clock, and the whole path through the OpenAI app over fake pools (headers, keys, engine priority,
429s, the queue, metrics)."""

from __future__ import annotations

import asyncio
import json

import pytest
from pydantic import ValidationError

from orchestrator.api.responses import Endpoint
from orchestrator.api.traffic_admission import TrafficAdmission
from orchestrator.config import TrafficConfig
from orchestrator.metrics import FrontendMetrics
from orchestrator.traffic.gate import ClassGate, Outcome, Reason, Ticket
from orchestrator.traffic.policy import Resolved, TrafficPolicy, TrafficRefusal
from tests.factories import MODEL, FakePool, make_frontend, run
from tests.unit.test_api_limits import _post

CLASSES = {
    "classes": [
        {"name": "interactive", "priority": 0, "ttft_p99_ms": 500, "itl_p50_ms": 50},
        {
            "name": "batch",
            "priority": 10,
            "max_streams": 2,
            "queue_size": 2,
            "queue_wait_s": 5,
            "allow_request_priority": True,
        },
    ],
    "default_class": "interactive",
    "tenants": [
        {"name": "chat", "api_key_env": "CHAT_KEY", "classes": ["interactive"]},
        {"name": "jobs", "api_key_env": "JOBS_KEY", "classes": ["batch"], "default_class": "batch"},
    ],
}


def _policy(traffic=CLASSES, limit: int = 8) -> TrafficPolicy:
    return TrafficPolicy(TrafficConfig.model_validate(traffic), limit)


# -- what a request resolves to -------------------------------------------------------


def test_a_request_resolves_its_class_from_header_then_body_then_its_tenants_default():
    p = _policy()
    assert p.resolve("default", "batch", "interactive", 0).cls.name == "batch"  # the header wins
    assert p.resolve("default", None, "batch", 0).cls.name == "batch"
    assert p.resolve("default", None, None, 0).cls.name == "interactive"  # the app's default
    jobs = p.resolve("jobs", None, None, 0)
    assert (jobs.cls.name, jobs.engine_priority) == ("batch", 10)  # the tenant's default, at its priority


def test_a_tenant_may_not_claim_a_class_it_is_not_given_and_unknown_classes_are_400():
    p = _policy()
    with pytest.raises(TrafficRefusal) as e:
        p.resolve("jobs", "interactive", None, 0)
    assert (e.value.status, e.value.code, e.value.param) == (403, "slo_class_not_allowed", "x-slo-class")
    with pytest.raises(TrafficRefusal) as e:
        p.resolve("chat", None, "gold", 0)
    assert (e.value.status, e.value.param) == (400, "slo_class")


def test_request_priority_only_where_the_class_allows_and_never_above_it():
    p = _policy()
    assert p.resolve("jobs", None, None, 12).engine_priority == 12  # lower than batch's own: taken
    with pytest.raises(TrafficRefusal) as e:
        p.resolve("jobs", None, None, 5)  # above batch's 10
    assert e.value.status == 403
    with pytest.raises(TrafficRefusal) as e:
        p.resolve("chat", None, None, 3)  # interactive takes none
    assert (e.value.status, e.value.param) == (400, "priority")


def test_without_classes_priority_is_refused_as_vllms_server_refuses_it():
    p = _policy({})
    assert p.resolve("default", None, None, 0).engine_priority == 0
    with pytest.raises(TrafficRefusal, match="priority scheduling is not enabled"):
        p.resolve("default", None, None, 1)


def test_the_config_refuses_what_cannot_work():
    for bad in (
        {"classes": [{"name": "a"}]},  # no default class
        {"classes": [{"name": "a", "ttft_p99_ms": 100}], "default_class": "a"},  # half an SLO
        {"classes": [{"name": "a", "ttft_p99_ms": 1, "itl_p50_ms": 1, "queue_size": 4}], "default_class": "a"},  # wait
        {**CLASSES, "tenants": [{"name": "t", "api_key_env": "K", "classes": ["batch"]}]},  # default not allowed
        {**CLASSES, "tenants": [{"name": "t", "api_key_env": "K", "classes": ["gold"]}]},
    ):
        with pytest.raises(ValidationError):
            TrafficConfig.model_validate(bad)


# -- the class gate ---------------------------------------------------------------------


def _ticket(p: TrafficPolicy, cls: str, tenant: str = "default", streams: int = 1, tokens: int = 10) -> Ticket:
    return Ticket(p.classes[cls], p.tenants[tenant], streams, tokens)


def test_a_class_at_its_streams_is_shed_first_while_the_higher_class_is_still_admitted():
    p = _policy({**CLASSES, "classes": [CLASSES["classes"][0], {**CLASSES["classes"][1], "queue_size": 0}]})
    gate = ClassGate(p)
    batch = [_ticket(p, "batch") for _ in range(3)]
    assert [gate.offer(t, 0).outcome for t in batch] == [Outcome.ADMITTED, Outcome.ADMITTED, Outcome.REJECTED]
    assert gate.offer(_ticket(p, "batch"), 0).reason is Reason.CLASS_FULL
    assert all(gate.offer(_ticket(p, "interactive"), 0).outcome is Outcome.ADMITTED for _ in range(8))
    gate.leave(batch[0], 1)
    assert gate.offer(_ticket(p, "batch"), 1).outcome is Outcome.ADMITTED


def test_best_effort_waits_in_a_bounded_queue_admitted_as_room_frees_or_refused_at_its_deadline():
    p = _policy()
    gate = ClassGate(p)
    held = [_ticket(p, "batch") for _ in range(2)]
    for t in held:
        assert gate.offer(t, 0).outcome is Outcome.ADMITTED
    queued = [_ticket(p, "batch") for _ in range(2)]
    assert [gate.offer(t, 0.1 * i).outcome for i, t in enumerate(queued)] == [Outcome.QUEUED] * 2
    full = gate.offer(_ticket(p, "batch"), 0.2)
    assert (full.outcome, full.reason) == (Outcome.REJECTED, Reason.CLASS_FULL)  # the queue's bound: at once
    assert gate.leave(held[0], 1.0) == [queued[0]]  # the earliest deadline first
    assert gate.next_event(1.0) == pytest.approx(5.1)
    assert gate.expire(5.0) == [] and gate.expire(5.1) == [queued[1]]
    assert gate.tenant_requests["default"] == 2 and gate.class_streams["batch"] == 2


def test_a_tenant_holds_at_most_its_in_flight_and_its_tokens_a_minute_with_the_refill_as_retry_after():
    traffic = {**CLASSES, "tenants": [{"name": "t", "api_key_env": "K", "max_in_flight": 2, "tokens_per_minute": 600}]}
    p = _policy(traffic)
    gate = ClassGate(p)
    a, b = _ticket(p, "interactive", "t", tokens=300), _ticket(p, "interactive", "t", tokens=200)
    assert gate.offer(a, 0).outcome is Outcome.ADMITTED and gate.offer(b, 0).outcome is Outcome.ADMITTED
    assert gate.offer(_ticket(p, "interactive", "t"), 0).reason is Reason.TENANT_IN_FLIGHT
    gate.leave(b, 0, unused_tokens=150)  # it used 50 of its 200: 150 back
    over = gate.offer(_ticket(p, "interactive", "t", tokens=300), 0)  # 250 left, 300 asked: 5 s of refill
    assert (over.reason, over.retry_after_s) == (Reason.TENANT_TOKENS, pytest.approx(5.0))
    assert gate.offer(_ticket(p, "interactive", "t", tokens=300), 5.0).outcome is Outcome.ADMITTED


def _two_tenants(cls: dict) -> TrafficPolicy:
    """One class `cls` (named c) shared by tenants `flood` and `quiet` of equal weight."""
    tenants = [{"name": "flood", "api_key_env": "F"}, {"name": "quiet", "api_key_env": "Q"}]
    return _policy({"classes": [cls], "default_class": "c", "tenants": tenants})


def test_a_flooding_tenant_cannot_take_the_share_a_quieter_tenant_of_its_class_is_owed():
    """Class of 4 streams, two tenants of equal weight. The flood alone may take all 4; once the quiet tenant
    is active, the flood gets nothing past its share of 2 and each stream it gives back goes to the quiet one."""
    p = _two_tenants({"name": "c", "max_streams": 4})
    gate = ClassGate(p)
    flood = [_ticket(p, "c", "flood") for _ in range(4)]
    assert all(gate.offer(t, 0).outcome is Outcome.ADMITTED for t in flood)
    quiet = _ticket(p, "c", "quiet")
    assert gate.offer(quiet, 1).outcome is Outcome.REJECTED  # full: no one can be preempted
    gate.leave(flood[0], 1.1)
    assert gate.offer(_ticket(p, "c", "flood"), 1.2).outcome is Outcome.REJECTED  # the free stream is owed
    assert gate.offer(quiet, 1.3).outcome is Outcome.ADMITTED
    gate.leave(flood[1], 2)
    quiet2 = _ticket(p, "c", "quiet")
    assert gate.offer(quiet2, 2).outcome is Outcome.ADMITTED  # up to its share of 2
    gate.leave(flood[2], 3)
    assert gate.offer(_ticket(p, "c", "flood"), 3).outcome is Outcome.ADMITTED  # the flood's own share
    assert gate.offer(_ticket(p, "c", "flood"), 3).outcome is Outcome.REJECTED  # and no more
    # Gone quiet for the contention window (10 s): the flood may use the whole class again.
    gate.leave(quiet, 4)
    gate.leave(quiet2, 4)
    assert gate.offer(_ticket(p, "c", "flood"), 20).outcome is Outcome.ADMITTED
    assert gate.offer(_ticket(p, "c", "flood"), 20).outcome is Outcome.ADMITTED


def test_a_flood_cannot_fill_the_queue_a_quieter_tenant_of_its_class_needs():
    """Interactive class of 2 streams with a short queue of 4: the flood holds both streams and queues its share
    (2 of 4 places) once the quiet tenant is active; quiet's request queues and takes the next free stream."""
    p = _two_tenants(
        {"name": "c", "max_streams": 2, "queue_size": 4, "queue_wait_s": 0.5, "ttft_p99_ms": 1000, "itl_p50_ms": 50}
    )
    gate = ClassGate(p)
    held = [_ticket(p, "c", "flood") for _ in range(2)]
    assert all(gate.offer(t, 0).outcome is Outcome.ADMITTED for t in held)
    quiet = _ticket(p, "c", "quiet")
    assert gate.offer(quiet, 0.1).outcome is Outcome.QUEUED
    flood = [gate.offer(_ticket(p, "c", "flood"), 0.1).outcome for _ in range(4)]
    assert flood == [Outcome.QUEUED, Outcome.QUEUED, Outcome.REJECTED, Outcome.REJECTED]  # its 2 of 4 places
    assert gate.leave(held[0], 0.2) == [quiet]  # served fewest tokens: first out


def test_a_queued_ticket_runs_when_the_share_it_waited_on_lapses_or_past_a_head_that_does_not_fit():
    """Class of 2 streams and a queue. The quiet tenant's last request keeps a stream owed to it for the
    contention window: the flood's second request queues. A quiet request arriving behind it fits, and runs
    at once past the flood's; the flood's runs when quiet's window lapses, with no request coming or going
    (the gate's next event, which the shell's timer waits for)."""
    p = _two_tenants({"name": "c", "max_streams": 2, "queue_size": 4, "queue_wait_s": 60})
    gate = ClassGate(p)
    earlier = _ticket(p, "c", "quiet")
    assert gate.offer(earlier, 0).outcome is Outcome.ADMITTED
    gate.leave(earlier, 0.5)
    first = _ticket(p, "c", "flood")
    assert gate.offer(first, 1).outcome is Outcome.ADMITTED  # its share of 2
    over = _ticket(p, "c", "flood")
    assert gate.offer(over, 1).outcome is Outcome.QUEUED and gate.drain(1) == []  # the free stream is quiet's
    quiet = _ticket(p, "c", "quiet")
    assert gate.offer(quiet, 2).outcome is Outcome.QUEUED  # behind the flood's, which does not fit
    assert gate.drain(2) == [quiet]
    gate.leave(quiet, 3)
    assert gate.next_event(3) == pytest.approx(11.0)  # the flood's own window (it still holds a stream)
    assert gate.drain(11.0) == []
    assert gate.next_event(11.0) == pytest.approx(12.0)  # quiet last seen at 2, a window of 10 s
    assert gate.drain(11.9) == [] and gate.drain(12.0) == [over]
    assert gate.next_event(12.0) is None


def test_in_the_event_loop_a_request_that_fits_past_the_queues_head_runs_at_once():
    p = _two_tenants({"name": "c", "max_streams": 2, "queue_size": 4, "queue_wait_s": 60})
    now = [0.0]
    admission = TrafficAdmission(p, FrontendMetrics(), clock=lambda: now[0])
    flood, quiet = (Resolved(p.classes["c"], p.tenants[t], 0) for t in ("flood", "quiet"))

    async def go():
        (await admission.enter(quiet, 1, 10)).release()  # quiet is active for its window: a stream owed
        now[0] = 1.0
        held = await admission.enter(flood, 1, 10)
        over = asyncio.create_task(admission.enter(flood, 1, 10))  # past its share: queued
        await asyncio.sleep(0)
        now[0] = 2.0
        slot = await asyncio.wait_for(admission.enter(quiet, 1, 10), 1.0)  # behind it in the queue, but fits
        queued = [t.tenant.name for t in admission.gate.queues["c"]]
        slot.release()
        held.release()  # room for the flood's queued request
        (await over).release()
        return queued

    assert run(go()) == ["flood"]
    assert admission.gate.class_streams["c"] == 0 and admission.gate.queues["c"] == []


def test_the_queue_serves_tenants_by_tokens_per_weight_not_by_requests():
    """Two tenants queue in one best-effort class of one stream; tenant a asks 10x the tokens a request. bb,
    idle while a was served, is lifted to a's count (no credit for idle time); then each freed stream goes to
    the tenant served fewest tokens: a's one big request, then three of bb's small ones, then a's."""
    traffic = {
        "classes": [{"name": "b", "max_streams": 1, "queue_size": 10}],
        "default_class": "b",
        "tenants": [{"name": "a", "api_key_env": "A"}, {"name": "bb", "api_key_env": "B"}],
    }
    p = _policy(traffic)
    gate = ClassGate(p)
    first = _ticket(p, "b", "a", tokens=100)
    assert gate.offer(first, 0).outcome is Outcome.ADMITTED
    big = [_ticket(p, "b", "a", tokens=100) for _ in range(2)]
    small = [_ticket(p, "b", "bb", tokens=10) for _ in range(3)]
    for t in [*big, *small]:
        assert gate.offer(t, 0).outcome is Outcome.QUEUED
    order, running = [], first
    for now in range(1, 6):
        (running,) = gate.leave(running, now)
        order.append(running.tenant.name)
    assert order == ["a", "bb", "bb", "bb", "a"]


# -- through the app ----------------------------------------------------------------------


def _body(**kw) -> bytes:
    return json.dumps({"model": MODEL, "prompt": "a b", "max_tokens": 3, **kw}).encode()


KEYS = {"chat": "chat-key", "jobs": "jobs-key"}


def _frontend(**kw):
    return make_frontend(traffic=CLASSES, tenant_keys=KEYS, disaggregated=True, **kw)


def test_each_class_reaches_both_pools_at_its_priority_and_a_batch_key_cannot_claim_interactive():
    fe = _frontend()

    async def go():
        chat = await _post(fe, _body(), {"authorization": "Bearer chat-key"})
        jobs = await _post(fe, _body(priority=15), {"authorization": "Bearer jobs-key"})
        claim = await _post(fe, _body(), {"authorization": "Bearer jobs-key", "x-slo-class": "interactive"})
        nokey = await _post(fe, _body())
        return chat, jobs, claim, nokey

    chat, jobs, claim, nokey = run(go())
    assert chat.status_code == 200 and jobs.status_code == 200
    assert [r.priority for r in fe.decode.generates] == [0, 15]
    assert [r.priority for r in fe.prefill.prefills] == [0, 15]
    assert claim.status_code == 403 and claim.json()["error"]["code"] == "slo_class_not_allowed"
    assert nokey.status_code == 401
    assert (
        fe.metric(
            "orchestrator_class_admissions_total", {"slo_class": "batch", "tenant": "jobs", "decision": "admitted"}
        )
        == 1
    )
    assert (
        fe.metric(
            "orchestrator_class_slo_requests_total", {"slo_class": "interactive", "tenant": "chat", "attained": "yes"}
        )
        == 1
    )
    assert fe.metric("orchestrator_class_generation_tokens_total", {"slo_class": "batch", "tenant": "jobs"}) == 3


def test_batch_past_its_streams_queues_then_runs_and_past_its_queue_gets_429_while_interactive_runs():
    fe = _frontend(decode=FakePool("decode_pool", chunk_delay_s=0.02))
    jobs = {"authorization": "Bearer jobs-key"}

    async def go():
        running = [asyncio.create_task(_post(fe, _body(max_tokens=10), jobs)) for _ in range(2)]
        await asyncio.sleep(0.05)
        queued = [asyncio.create_task(_post(fe, _body(), jobs)) for _ in range(2)]
        await asyncio.sleep(0.01)
        refused = await _post(fe, _body(), jobs)
        chat = await _post(fe, _body(), {"authorization": "Bearer chat-key"})
        done = await asyncio.gather(*running, *queued)
        return refused, chat, done

    refused, chat, done = run(go())
    assert refused.status_code == 429 and refused.headers["retry-after"] == "2"
    assert chat.status_code == 200
    assert [r.status_code for r in done] == [200] * 4
    assert (
        fe.metric(
            "orchestrator_class_admissions_total", {"slo_class": "batch", "tenant": "jobs", "decision": "dequeued"}
        )
        == 2
    )
    assert fe.service.traffic.gate.class_streams["batch"] == 0 and fe.service.gate.in_flight == 0


def test_a_queued_request_whose_client_leaves_gives_its_place_back():
    fe = _frontend(decode=FakePool("decode_pool", chunk_delay_s=0.02))

    async def go():
        held = [
            await fe.service.handle(Endpoint.COMPLETIONS, _body(stream=True, max_tokens=20), tenant="jobs")
            for _ in range(2)
        ]
        waiting = asyncio.create_task(fe.service.handle(Endpoint.COMPLETIONS, _body(), tenant="jobs"))
        await asyncio.sleep(0.01)
        queued = len(fe.service.traffic.gate.queues["batch"])
        waiting.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiting
        for s in held:
            await s.aclose()
        return queued

    assert run(go()) == 1
    gate = fe.service.traffic.gate
    assert gate.queues["batch"] == [] and gate.tenant_requests["jobs"] == 0 and gate.class_streams["batch"] == 0
