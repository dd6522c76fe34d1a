"""Errors as OpenAI's API reports them: a status code and
``{"error": {"message", "type", "param", "code"}}``, so OpenAI's clients raise their
usual exceptions (BadRequestError, NotFoundError, ...)."""

from __future__ import annotations

from typing import Any


class APIError(Exception):
    """A request the server answers with an error status; raised anywhere in a route,
    turned into OpenAI's error body by the application's handler."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        type: str = "invalid_request_error",
        param: str | None = None,
        code: str | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.type = type
        self.param = param
        self.code = code

    def body(self) -> dict[str, Any]:
        """The JSON body OpenAI's API sends with an error."""
        return {
            "error": {
                "message": self.message,
                "type": self.type,
                "param": self.param,
                "code": self.code,
            }
        }


def bad_request(message: str, *, param: str | None = None) -> APIError:
    """400: the request itself is wrong (a parameter, the prompt, the JSON)."""
    return APIError(400, message, param=param)


def model_not_found(model: str, served: str) -> APIError:
    """404: the request names a model this server does not serve."""
    return APIError(
        404,
        f"The model {model!r} does not exist; this server serves {served!r}",
        param="model",
        code="model_not_found",
    )


def queue_full(message: str) -> APIError:
    """503: too many requests wait already; the client should retry later."""
    return APIError(503, message, type="server_error", code="queue_full")


def shutting_down() -> APIError:
    """503: the server stopped taking requests (SIGTERM) or aborted this one on shutdown."""
    return APIError(
        503, "The server is shutting down; retry on another", type="server_error", code="shutdown"
    )


def engine_failed(exc: Exception) -> APIError:
    """500: an engine step failed (the engine ended every running request with it)."""
    return APIError(500, f"the engine failed: {exc}", type="server_error", code="engine_error")


def not_found(path: str) -> APIError:
    """404: no route at ``path``."""
    return APIError(404, f"No route {path}; see /v1/models, /v1/completions, ...", code="not_found")
