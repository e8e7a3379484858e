"""OpenTelemetry spans of the frontend's requests, or nothing at all.

    tracer = tracer_from_config(config.tracing)    NOOP_TRACER when no endpoint is set
    span   = tracer.start("request", traceparent)  a child of the client's W3C trace context
    child  = span.child("route", {...})            NOOP_SPAN under NOOP_SPAN
    span.traceparent                               what the replicas get (EngineRequest.trace_context)

Off (the default), the tracer is `NOOP_TRACER`: its spans are the one `NOOP_SPAN`, whose
methods do nothing, no OpenTelemetry module is imported, and callers skip whatever work
only a recording span needs (`span.recording`). On, the SDK is imported here, lazily.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import Any

from orchestrator.config import TracingConfig

Attributes = Mapping[str, Any]


class Span:
    """A span that records nothing: the one every call gets while tracing is off."""

    recording = False
    traceparent: str | None = None

    def child(self, name: str, attributes: Attributes | None = None) -> Span:
        return self

    def set_attributes(self, attributes: Attributes) -> None:
        pass

    def add_event(self, name: str, attributes: Attributes | None = None) -> None:
        pass

    def record_error(self, error: BaseException) -> None:
        pass

    def end(self) -> None:
        pass


NOOP_SPAN = Span()


class Tracer:
    """Tracing off: every span is `NOOP_SPAN`."""

    enabled = False

    def start(self, name: str, traceparent: str | None = None, attributes: Attributes | None = None) -> Span:
        return NOOP_SPAN

    def shutdown(self) -> None:
        pass


NOOP_TRACER = Tracer()


def _clean(attributes: Attributes | None) -> dict[str, Any] | None:
    """OpenTelemetry's attribute values (None dropped, enums by value)."""
    if not attributes:
        return None
    return {k: getattr(v, "value", v) for k, v in attributes.items() if v is not None}


class _OtelSpan(Span):
    """An OpenTelemetry SDK span; `end` may be called again (a stream's finaliser after its own close)."""

    def __init__(self, tracer: Any, span: Any) -> None:
        self._tracer = tracer
        self._span = span
        self._ended = False
        self.recording = span.is_recording()
        ctx = span.get_span_context()
        self.traceparent = f"00-{ctx.trace_id:032x}-{ctx.span_id:016x}-{int(ctx.trace_flags):02x}"

    def child(self, name: str, attributes: Attributes | None = None) -> Span:
        from opentelemetry import trace

        context = trace.set_span_in_context(self._span)
        return _OtelSpan(self._tracer, self._tracer.start_span(name, context=context, attributes=_clean(attributes)))

    def set_attributes(self, attributes: Attributes) -> None:
        self._span.set_attributes(_clean(attributes) or {})

    def add_event(self, name: str, attributes: Attributes | None = None) -> None:
        self._span.add_event(name, _clean(attributes))

    def record_error(self, error: BaseException) -> None:
        """An error status with the exception; a cancellation (client gone) is `cancelled`, no error."""
        from opentelemetry.trace import Status, StatusCode

        if isinstance(error, (asyncio.CancelledError, GeneratorExit)):
            self._span.set_attribute("cancelled", True)
            return
        self._span.record_exception(error)
        self._span.set_status(Status(StatusCode.ERROR, f"{type(error).__name__}: {error}"))

    def end(self) -> None:
        if not self._ended:
            self._ended = True
            self._span.end()


class OtelTracer(Tracer):
    """Spans of an OpenTelemetry SDK `TracerProvider` (`sdk_tracer` builds one)."""

    enabled = True

    def __init__(self, provider: Any) -> None:
        from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

        self.provider = provider
        self._tracer = provider.get_tracer("orchestrator")
        self._propagator = TraceContextTextMapPropagator()

    def start(self, name: str, traceparent: str | None = None, attributes: Attributes | None = None) -> Span:
        # An absent or malformed header gives an empty context: the span starts a new trace.
        context = self._propagator.extract({"traceparent": traceparent}) if traceparent else None
        return _OtelSpan(self._tracer, self._tracer.start_span(name, context=context, attributes=_clean(attributes)))

    def shutdown(self) -> None:
        """Export the spans still queued, then stop."""
        self.provider.shutdown()


def sdk_tracer(exporter: Any, service_name: str = "orchestrator", sample_ratio: float = 1.0, batch: bool = True):
    """A tracer exporting to `exporter` (an SDK `SpanExporter`: OTLP, or the SDK's in-memory one in tests),
    through a `BatchSpanProcessor` (`batch`) or a synchronous one. A client's sampled flag is followed;
    a trace started here is sampled at `sample_ratio`."""
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor, SimpleSpanProcessor
    from opentelemetry.sdk.trace.sampling import ParentBased, TraceIdRatioBased

    provider = TracerProvider(
        resource=Resource.create({"service.name": service_name}),
        sampler=ParentBased(TraceIdRatioBased(sample_ratio)),
    )
    provider.add_span_processor(BatchSpanProcessor(exporter) if batch else SimpleSpanProcessor(exporter))
    return OtelTracer(provider)


def tracer_from_config(config: TracingConfig) -> Tracer:
    """`NOOP_TRACER` without an endpoint; else a tracer exporting over OTLP/HTTP in batches."""
    if config.otlp_endpoint is None:
        return NOOP_TRACER
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

    return sdk_tracer(OTLPSpanExporter(endpoint=config.otlp_endpoint), config.service_name, config.sample_ratio)
