"""OpenAI-style errors: `{"error": {"message", "type", "param", "code"}}`."""

from __future__ import annotations

from typing import Any

from pydantic import ValidationError


class APIError(Exception):
    def __init__(
        self,
        status: int,
        message: str,
        *,
        type: str = "invalid_request_error",
        param: str | None = None,
        code: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.type = type
        self.param = param
        self.code = code
        self.headers = headers or {}

    def body(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}


def bad_request(message: str, param: str | None = None, code: str | None = None) -> APIError:
    return APIError(400, message, param=param, code=code)


def model_not_found(model: str) -> APIError:
    return APIError(
        404, f"The model `{model}` does not exist.", type="invalid_request_error", param="model", code="model_not_found"
    )


def server_error(message: str) -> APIError:
    return APIError(500, message, type="server_error", code="internal_error")


def unavailable(message: str) -> APIError:
    return APIError(503, message, type="server_error", code="service_unavailable")


def from_validation_error(err: ValidationError, prefix: str = "") -> APIError:
    """The first problem pydantic found, with the field's dotted path (after `prefix`, where the validated value
    sits inside the request) as `param`."""
    first = err.errors()[0]
    loc = prefix + ".".join(str(p) for p in first["loc"])
    param = loc or None
    message = f"{param}: {first['msg']}" if param else first["msg"]
    if len(err.errors()) > 1:
        message += f" (and {len(err.errors()) - 1} more problem(s))"
    return APIError(400, message, param=param, code="invalid_value" if param else "invalid_request")
