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
        self.code = code
        self.param = param
        self.type = type or _TYPES.get(status, "invalid_request_error")

    def body(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}


_TYPES = {401: "authentication_error", 404: "not_found_error", 405: "invalid_request_error",
          413: "invalid_request_error", 502: "engine_error", 503: "engine_error"}


def bad_request(message: str, *, param: str | None = None, code: str | None = None) -> GatewayError:
    return GatewayError(400, message, param=param, code=code)
