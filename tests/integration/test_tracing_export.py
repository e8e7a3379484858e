"""OpenTelemetry traces of real requests, exported by the CPU apps over OTLP/HTTP to a receiver in this
process (the apps' `tracing.otlp_endpoint`): on the disaggregated path (prefill on another replica, its
KV over NIXL) and on the aggregated one, each request's spans in the client's trace, parented as a
collector would show them, carrying the route, the replicas and the cached tokens."""

from __future__ import annotations

import secrets

import pytest

from tests.integration.test_disaggregated_serving import MODEL, routed, text_prompt

pytestmark = pytest.mark.integration


@pytest.mark.parametrize(
    "app, words, route",
    [("disagg", 700, "remote_prefill"), ("agg", 12, "aggregated")],
    ids=["disaggregated", "aggregated"],
)
def test_a_traced_request_reaches_the_collector_as_one_parented_trace(apps, otlp_receiver, app, words, route):
    trace_id, client_span = secrets.token_hex(16), secrets.token_hex(8)
    body = {"model": MODEL, "prompt": text_prompt(words, seed=4242), "max_tokens": 4, "temperature": 0}
    headers = {"traceparent": f"00-{trace_id}-{client_span}-01"}

    def send():
        r = apps.http.post(apps.url(app, "/v1/completions"), json=body, headers=headers)
        assert r.status_code == 200, r.text
        return r.json()

    answer, took = routed(apps, app, send)
    assert took == route
    expected = {"request", "prepare", "choice", "route"} | ({"remote_prefill"} if route == "remote_prefill" else set())

    def arrived():
        spans = {s.name: s for s in otlp_receiver.trace(trace_id)}
        return spans if expected <= spans.keys() else None

    spans = apps.wait_until(arrived, 30, f"the spans of trace {trace_id} at the receiver")
    assert spans.keys() == expected
    request, choice = spans["request"], spans["choice"]
    assert request.parent_span_id == client_span and request.service == "orchestrator"
    assert spans["prepare"].parent_span_id == request.span_id and choice.parent_span_id == request.span_id
    assert all(spans[name].parent_span_id == choice.span_id for name in expected - {"request", "prepare", "choice"})

    assert request.attributes["endpoint"] == "completions" and request.attributes["choices"] == 1
    assert request.attributes["output_tokens"] == answer["usage"]["completion_tokens"] == 4
    route_span = spans["route"].attributes
    assert route_span["route.kind"] == route and route_span["route.decode_replica"]
    assert choice.events == ("first_token", "stream_end") and choice.attributes["output_tokens"] == 4
    if route == "remote_prefill":
        prefill = spans["remote_prefill"].attributes
        assert prefill["prefill.replica"] == route_span["route.prefill_replica"]
        assert prefill["prefill.kv_blocks"] > 0 and "prefill.cached_tokens" in prefill
        assert choice.attributes["cached_prompt_tokens"] == prefill["prefill.cached_tokens"]
    else:
        assert "route.prefill_replica" not in route_span
