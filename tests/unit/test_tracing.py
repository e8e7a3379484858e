"""OpenTelemetry traces of the frontend's requests (orchestrator/tracing.py), exported to the SDK's
in-memory exporter: the spans, their parents and attributes, the trace context the replicas get,
spans ended on a client's disconnect, and nothing at all with tracing off."""

from __future__ import annotations

import json

import pytest
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from pydantic import ValidationError

from orchestrator.api.responses import Endpoint
from orchestrator.config import TracingConfig
from orchestrator.messages import EngineRequest, SamplingSpec
from orchestrator.tracing import NOOP_SPAN, NOOP_TRACER, sdk_tracer, tracer_from_config
from orchestrator.wire.frames import FrameReader, Op, encode
from tests.factories import MODEL, aggregated_config, make_frontend, run
from tests.otlp_receiver import OtlpReceiver

TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
CLIENT_SPAN = "00f067aa0ba902b7"
TRACEPARENT = f"00-{TRACE_ID}-{CLIENT_SPAN}-01"


def _traced_frontend(**kwargs):
    exporter = InMemorySpanExporter()
    return make_frontend(tracer=sdk_tracer(exporter, batch=False), **kwargs), exporter


def _post(fe, body, headers=None):
    async def go():
        async with fe.client() as c:
            return await c.post("/v1/completions", json=body, headers=headers or {})

    return run(go())


def _by_name(exporter):
    spans = {}
    for s in exporter.get_finished_spans():
        spans.setdefault(s.name, []).append(s)
    return spans


def _traceparent(span) -> str:
    ctx = span.get_span_context()
    return f"00-{ctx.trace_id:032x}-{ctx.span_id:016x}-{int(ctx.trace_flags):02x}"


def _assert_tree(spans):
    """request under the client's span; prepare and choice under request; route and remote_prefill under choice."""
    (request,) = spans["request"]
    assert f"{request.context.trace_id:032x}" == TRACE_ID
    assert f"{request.parent.span_id:016x}" == CLIENT_SPAN and request.parent.is_remote
    (choice,) = spans["choice"]
    assert spans["prepare"][0].parent.span_id == request.context.span_id
    assert choice.parent.span_id == request.context.span_id
    assert spans["route"][0].parent.span_id == choice.context.span_id
    for name in ("prepare", "choice", "route", *(["remote_prefill"] if "remote_prefill" in spans else [])):
        assert all(f"{s.context.trace_id:032x}" == TRACE_ID for s in spans[name])
    return request, choice


def test_a_disaggregated_request_is_traced_under_the_clients_traceparent():
    fe, exporter = _traced_frontend()
    r = _post(fe, {"model": MODEL, "prompt": "a b c", "max_tokens": 3}, {"traceparent": TRACEPARENT})
    assert r.status_code == 200
    spans = _by_name(exporter)
    assert sorted(spans) == ["choice", "prepare", "remote_prefill", "request", "route"]
    request, choice = _assert_tree(spans)
    (route,) = spans["route"]
    (prefill,) = spans["remote_prefill"]
    assert prefill.parent.span_id == choice.context.span_id
    decode_replica = fe.decode.generates[0].target_replica
    prefill_replica = fe.prefill.prefills[0].target_replica
    assert route.attributes["route.kind"] == "remote_prefill"
    assert route.attributes["route.decode_replica"] == decode_replica
    assert route.attributes["route.prefill_replica"] == prefill_replica
    assert "route.predicted_cached_tokens" in route.attributes
    assert prefill.attributes["prefill.replica"] == prefill_replica
    assert prefill.attributes["prefill.cached_tokens"] == 7  # FakePool's prefill result
    events = [e.name for e in choice.events]
    assert events == ["first_token", "stream_end"]
    assert choice.attributes["output_tokens"] == 3
    assert choice.attributes["finish_reason"] == "length"
    assert choice.attributes["cached_prompt_tokens"] == 7  # the prefilling replica's
    assert request.attributes["output_tokens"] == 3 and request.attributes["endpoint"] == "completions"
    assert request.status.is_ok
    # The replicas get the request span's context: the prefill and the decode call alike.
    assert fe.decode.generates[0].trace_context == _traceparent(request)
    assert fe.prefill.prefills[0].trace_context == _traceparent(request)


def test_a_locally_prefilled_request_has_no_remote_prefill_span():
    fe, exporter = _traced_frontend()
    body = {"model": MODEL, "prompt": "a b c", "max_tokens": 2, "prompt_logprobs": 0}
    assert _post(fe, body, {"traceparent": TRACEPARENT}).status_code == 200
    spans = _by_name(exporter)
    assert "remote_prefill" not in spans and not fe.prefill.prefills
    _assert_tree(spans)
    (route,) = spans["route"]
    assert route.attributes["route.kind"] == "local_prefill"
    assert route.attributes["route.reason"] == "prompt_logprobs"
    assert "route.prefill_replica" not in route.attributes


def test_an_aggregated_request_is_traced_with_its_route():
    fe, exporter = _traced_frontend(disaggregated=False)
    assert (
        _post(fe, {"model": MODEL, "prompt": "a b", "max_tokens": 2}, {"traceparent": TRACEPARENT}).status_code == 200
    )
    spans = _by_name(exporter)
    request, choice = _assert_tree(spans)
    (route,) = spans["route"]
    assert route.attributes["route.kind"] == "aggregated"
    assert route.attributes["route.decode_replica"] == fe.decode.generates[0].target_replica
    assert choice.attributes["output_tokens"] == 2 and choice.attributes["cached_prompt_tokens"] == 0
    assert fe.decode.generates[0].trace_context == _traceparent(request)


def test_without_a_traceparent_the_request_starts_a_trace_and_n_choices_have_a_span_each():
    fe, exporter = _traced_frontend()
    assert _post(fe, {"model": MODEL, "prompt": "a b", "max_tokens": 2, "n": 3}).status_code == 200
    spans = _by_name(exporter)
    (request,) = spans["request"]
    assert request.parent is None
    assert sorted(s.attributes["choice.index"] for s in spans["choice"]) == [0, 1, 2]
    assert all(s.parent.span_id == request.context.span_id for s in spans["choice"])
    assert {r.trace_context for r in fe.decode.generates} == {_traceparent(request)}


def test_a_stream_cut_by_the_client_ends_its_spans():
    fe, exporter = _traced_frontend(max_model_len=4096)

    async def go():
        body = json.dumps({"model": MODEL, "prompt": "a", "max_tokens": 1000, "stream": True}).encode()
        stream = await fe.service.handle(Endpoint.COMPLETIONS, body, traceparent=TRACEPARENT)
        for _ in range(3):
            await anext(stream)
        await stream.aclose()

    run(go())
    spans = _by_name(exporter)
    assert sorted(spans) == ["choice", "prepare", "remote_prefill", "request", "route"]  # all ended, so exported
    (request,) = spans["request"]
    (choice,) = spans["choice"]
    assert request.attributes["cancelled"] is True and choice.attributes["cancelled"] is True
    assert 0 < choice.attributes["output_tokens"] < 1000
    assert [e.name for e in choice.events] == ["first_token", "stream_end"]
    assert fe.decode.closed == [fe.decode.generates[0].request_id]


def test_a_failed_request_ends_its_spans_with_an_error():
    fe, exporter = _traced_frontend()
    r = _post(fe, {"model": MODEL, "prompt": "a", "max_tokens": 2, "temperature": -1}, {"traceparent": TRACEPARENT})
    assert r.status_code == 400
    spans = _by_name(exporter)
    assert sorted(spans) == ["prepare", "request"]
    assert not spans["request"][0].status.is_ok and not spans["prepare"][0].status.is_ok


def test_tracing_off_creates_no_span_and_sends_no_trace_context():
    fe = make_frontend()
    assert fe.service.tracer is NOOP_TRACER
    assert NOOP_TRACER.start("request", TRACEPARENT) is NOOP_SPAN
    assert NOOP_SPAN.child("route") is NOOP_SPAN
    r = _post(fe, {"model": MODEL, "prompt": "a b", "max_tokens": 2}, {"traceparent": TRACEPARENT})
    assert r.status_code == 200
    assert [g.trace_context for g in fe.decode.generates] == [None]
    assert [p.trace_context for p in fe.prefill.prefills] == [None]


def test_tracing_is_off_by_default_and_sample_ratio_is_a_share():
    config = aggregated_config("sim")
    assert config.tracing.otlp_endpoint is None
    assert tracer_from_config(config.tracing) is NOOP_TRACER
    for bad in (-0.1, 1.5):
        with pytest.raises(ValidationError, match="sample_ratio"):
            TracingConfig(otlp_endpoint="http://collector:4318/v1/traces", sample_ratio=bad)


def test_an_endpoint_turns_tracing_on_with_an_otlp_exporter():
    tracer = tracer_from_config(TracingConfig(otlp_endpoint="http://127.0.0.1:9/v1/traces", sample_ratio=0.0))
    try:
        assert tracer.enabled
        # Ratio 0: a trace started here is not recorded, yet its context still travels (unsampled).
        span = tracer.start("request")
        assert not span.recording and int(span.traceparent[-2:], 16) & 1 == 0  # the sampled flag unset
        # A client's sampled flag is followed.
        assert tracer.start("request", TRACEPARENT).recording
    finally:
        tracer.shutdown()


def test_spans_reach_an_otlp_endpoint_over_http_with_their_parents():
    """The configured exporter (OTLP/HTTP, protobuf, batched) against a receiver decoding what a collector
    would; shutdown exports what is still queued."""
    receiver = OtlpReceiver()
    tracer = tracer_from_config(TracingConfig(otlp_endpoint=receiver.url, service_name="frontend-a"))
    try:
        span = tracer.start("request", TRACEPARENT, {"endpoint": Endpoint.CHAT})
        child = span.child("route", {"route.kind": "remote_prefill", "route.prefill_replica": None})
        child.add_event("first_token")
        child.end()
        span.end()
    finally:
        tracer.shutdown()
        receiver.close()
    trace_id, client_span = TRACEPARENT.split("-")[1:3]
    spans = {s.name: s for s in receiver.trace(trace_id)}
    assert spans.keys() == {"request", "route"}
    assert spans["request"].parent_span_id == client_span and spans["request"].service == "frontend-a"
    assert spans["request"].attributes == {"endpoint": "chat"}
    route = spans["route"]
    assert route.parent_span_id == spans["request"].span_id
    assert route.attributes == {"route.kind": "remote_prefill"} and route.events == ("first_token",)


def test_the_trace_context_crosses_the_data_plane_and_every_transformation():
    """The direct data plane carries EngineRequest as is: the context arrives with the request, and the
    prefill, decode and migrated forms of a request keep it."""
    request = EngineRequest("r", (1, 2), SamplingSpec(max_tokens=4), trace_context=TRACEPARENT)
    got = []
    FrameReader(lambda op, stream_id, payload: got.append(payload)).feed(encode(Op.GENERATE, 1, request))
    assert got == [request]
    for derived in (request.for_prefill("p0"), request.for_decode("d0", None), request.continued([7], 1)):
        assert derived.trace_context == TRACEPARENT
