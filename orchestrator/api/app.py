"""The OpenAI-compatible ASGI app, with OpenAI's Responses API (`responses_service.py`) and Anthropic's
Messages API (`anthropic_messages.py`) on the same chat path. It holds no state of its own: a
`CompletionService` does the work, and the callables given here report health and pools. The same app runs
as the Ray Serve frontend and in unit tests."""

from __future__ import annotations

import hmac
import json
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from prometheus_client import CONTENT_TYPE_LATEST
from starlette.exceptions import HTTPException as StarletteHTTPException

from orchestrator.api import anthropic_messages
from orchestrator.api.errors import APIError
from orchestrator.api.response_store import BoundedResponseStore
from orchestrator.api.responses import Endpoint
from orchestrator.api.responses_service import ResponsesService
from orchestrator.api.service import CompletionService
from orchestrator.traffic.policy import DEFAULT_TENANT

SLO_CLASS_HEADER = "x-slo-class"  # the request's traffic class (else its body's `slo_class`, else a default)
MESSAGES_PATH = "/v1/messages"  # Anthropic's Messages API


@dataclass(frozen=True)
class Health:
    ready: bool
    detail: dict[str, Any]


@dataclass(frozen=True)
class AppHooks:
    health: Callable[[], Awaitable[Health]]
    pools: Callable[[], dict[str, Any]]
    max_request_bytes: int = 4 * 2**20
    # When set, /v1/* needs `Authorization: Bearer <api_key>`.
    api_key: str | None = None
    # When set, the admin surfaces (`ADMIN_PATHS`) need `Authorization: Bearer <admin_key>`; unset with an
    # api_key, they are refused to everyone; neither set (a loopback address), everything is open.
    admin_key: str | None = None
    # Tenants' API keys (traffic.tenants), tenant name -> key: each opens /v1/* as that tenant; `api_key` opens
    # it as tenant `default`.
    tenant_keys: Mapping[str, str] = field(default_factory=dict)

    @property
    def user_keys(self) -> bool:
        return bool(self.api_key or self.tenant_keys)


async def _read_body(request: Request, limit: int) -> bytes:
    """The body, refused with 413 once it passes `limit` bytes: never buffered beyond it."""
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise _too_large(limit)
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise _too_large(limit)
        chunks.append(chunk)
    return b"".join(chunks)


def _too_large(limit: int) -> APIError:
    return APIError(413, f"request body larger than {limit} bytes", code="request_too_large")


def _bearer(request: Request) -> bytes | None:
    """The key the request presents: `Authorization: Bearer`, else `x-api-key` (Anthropic's SDKs send it)."""
    scheme, _, token = request.headers.get("authorization", "").partition(" ")
    if scheme.lower() == "bearer":
        return token.strip().encode()
    key = request.headers.get("x-api-key")
    return key.strip().encode() if key else None


def _authorized(request: Request, api_key: str) -> bool:
    token = _bearer(request)
    return token is not None and hmac.compare_digest(token, api_key.encode())


def _tenant(request: Request, hooks: AppHooks) -> str | None:
    """The tenant whose key the request carries (`default` for `api_key`), or None. Every key is compared."""
    token = _bearer(request)
    if token is None:
        return None
    keys = ([(DEFAULT_TENANT, hooks.api_key)] if hooks.api_key else []) + list(hooks.tenant_keys.items())
    found = None
    for tenant, key in keys:
        if hmac.compare_digest(token, key.encode()) and found is None:
            found = tenant
    return found


# Admin surfaces: the admin key alone opens them (a user key does not).
ADMIN_PATHS = ("/pools", "/v1/load_lora_adapter", "/v1/unload_lora_adapter")


def _route_path(request: Request) -> str:
    """The path within the app: without the prefix it is served under (Serve's route_prefix, the ASGI
    `root_path`), which the ASGI `path` includes."""
    path, root = request.scope["path"], request.scope.get("root_path", "")
    return path[len(root) :] if root and path.startswith(root + "/") else path


def _refusal(request: Request, hooks: AppHooks) -> APIError | None:
    """Why `request` may not pass (user keys on /v1/*, the admin key on `ADMIN_PATHS`), or None."""
    path = _route_path(request)
    admin = path.startswith(ADMIN_PATHS)
    if path.startswith("/v1/") and not admin and hooks.user_keys:
        tenant = _tenant(request, hooks)
        if tenant is None:
            return APIError(
                401,
                "Incorrect or missing API key: send Authorization: Bearer <key> (or x-api-key).",
                code="invalid_api_key",
            )
        request.state.tenant = tenant
    if admin:
        if hooks.admin_key is None:
            return APIError(
                403,
                f"{path} is an admin surface: set frontend.auth.admin_key_env and send that key.",
                type="permission_error",
                code="admin_key_required",
            )
        if not _authorized(request, hooks.admin_key):
            return APIError(
                401, "Incorrect or missing admin key: send Authorization: Bearer <admin key>.", code="invalid_api_key"
            )
    return None


def _tenant_of(request: Request) -> str:
    """The tenant whose key opened the request (`_refusal` sets it; with no keys configured, `default`)."""
    return getattr(request.state, "tenant", DEFAULT_TENANT)


def _carried(request: Request) -> dict[str, Any]:
    """What a generation request carries beside its body: its trace context, tenant and SLO class header."""
    return {
        "traceparent": request.headers.get("traceparent"),
        "tenant": _tenant_of(request),
        "slo_class": request.headers.get(SLO_CLASS_HEADER),
    }


def _answer(result: dict[str, Any] | AsyncIterator[Any]) -> Response:
    """A whole answer as JSON; a stream as server-sent events."""
    if isinstance(result, dict):
        return JSONResponse(result)
    return StreamingResponse(result, media_type="text/event-stream", headers={"Cache-Control": "no-cache"})


def _error_response(err: APIError, path: str = "") -> JSONResponse:
    """`err` in the shape of the API `path` belongs to: Anthropic's for /v1/messages, else OpenAI's."""
    body = anthropic_messages.error_body(err) if path == MESSAGES_PATH else err.body()
    return JSONResponse(body, status_code=err.status, headers=err.headers)


def build_openai_app(service: CompletionService, hooks: AppHooks, responses: ResponsesService | None = None) -> FastAPI:
    """`responses`: the Responses API's service; by default one over `service` with a store in this process."""
    responses = responses or ResponsesService(service, BoundedResponseStore())
    app = FastAPI(title="orchestrator", docs_url=None, redoc_url=None)

    @app.exception_handler(APIError)
    async def _api_error(request: Request, err: APIError) -> JSONResponse:
        return _error_response(err, _route_path(request))

    if hooks.user_keys or hooks.admin_key:

        @app.middleware("http")
        async def _auth(request: Request, call_next):
            refused = _refusal(request, hooks)
            if refused is not None:
                return _error_response(refused, _route_path(request))
            return await call_next(request)

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(request: Request, err: StarletteHTTPException) -> JSONResponse:
        kind = "not_found_error" if err.status_code == 404 else "invalid_request_error"
        return _error_response(APIError(err.status_code, str(err.detail), type=kind), _route_path(request))

    async def _generate(endpoint: Endpoint, request: Request) -> Response:
        body = await _read_body(request, hooks.max_request_bytes)
        return _answer(await service.handle(endpoint, body, **_carried(request)))

    @app.post("/v1/completions")
    async def completions(request: Request) -> Response:
        return await _generate(Endpoint.COMPLETIONS, request)

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request) -> Response:
        return await _generate(Endpoint.CHAT, request)

    @app.post(MESSAGES_PATH)
    async def messages(request: Request) -> Response:
        body = await _read_body(request, hooks.max_request_bytes)
        req, chat = anthropic_messages.chat_request(body)
        result = await service.handle(Endpoint.CHAT, json.dumps(chat).encode(), **_carried(request), framed=False)
        if isinstance(result, dict):
            return JSONResponse(anthropic_messages.message(result))
        return _answer(anthropic_messages.stream(result, req.model))

    @app.post("/v1/responses")
    async def create_response(request: Request) -> Response:
        body = await _read_body(request, hooks.max_request_bytes)
        return _answer(await responses.create(body, **_carried(request)))

    @app.get("/v1/responses/{response_id}")
    async def retrieve_response(request: Request, response_id: str, stream: bool = False) -> JSONResponse:
        return JSONResponse(await responses.retrieve(response_id, _tenant_of(request), stream))

    @app.post("/v1/responses/{response_id}/cancel")
    async def cancel_response(request: Request, response_id: str) -> JSONResponse:
        return JSONResponse(await responses.cancel(response_id, _tenant_of(request)))

    @app.get("/v1/models")
    async def models() -> JSONResponse:
        return JSONResponse({"object": "list", "data": service.model_cards()})

    @app.post("/v1/load_lora_adapter")
    async def load_lora_adapter(request: Request) -> Response:
        body = await _read_body(request, hooks.max_request_bytes)
        return Response(await service.lora_admin.load(body), media_type="text/plain")

    @app.post("/v1/unload_lora_adapter")
    async def unload_lora_adapter(request: Request) -> Response:
        body = await _read_body(request, hooks.max_request_bytes)
        return Response(await service.lora_admin.unload(body), media_type="text/plain")

    @app.get("/health")
    async def health() -> JSONResponse:
        report = await hooks.health()
        return JSONResponse(
            {"status": "ok" if report.ready else "unavailable", **report.detail},
            status_code=200 if report.ready else 503,
        )

    @app.get("/pools")
    async def pools() -> JSONResponse:
        return JSONResponse(hooks.pools())

    @app.get("/metrics")
    async def metrics() -> Response:
        return Response(service.metrics.exposition(), media_type=CONTENT_TYPE_LATEST)

    return app
