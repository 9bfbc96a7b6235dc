"""Errors the gateway answers with, as OpenAI-style JSON bodies."""

from __future__ import annotations

from typing import Any


class GatewayError(Exception):
    """A request the gateway refuses: becomes `{"error": {message, type, param, code}}` with `status`."""

    def __init__(self, status: int, message: str, *, code: str | None = None, param: str | None = None,
                 type: str | None = None):
        super().__init__(message)
        self.status = status
        self.message = message
        self.code = code or _CODES.get(status)
        self.param = param
        self.type = type or _TYPES.get(status, "invalid_request_error")

    def body(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}


_TYPES = {401: "authentication_error", 404: "not_found_error", 405: "invalid_request_error",
          413: "invalid_request_error", 502: "engine_error", 503: "engine_error"}


# OpenAI's `code` for each kind of refusal, when the raise site names none (clients branch on it).
_CODES = {400: "invalid_value", 401: "invalid_api_key", 404: "unknown_url", 405: "method_not_allowed",
          413: "request_too_large", 500: "server_error", 502: "engine_error", 503: "engine_error"}


def bad_request(message: str, *, param: str | None = None, code: str | None = None) -> GatewayError:
    """A 400; `code` defaults to "invalid_value" (OpenAI's: "invalid_type", "unsupported_value", ...)."""
    return GatewayError(400, message, param=param, code=code)
