"""uvicorn running the application, with slotwise's shutdown.

On SIGTERM or Ctrl-C: the listening socket closes, new requests on open connections
get a 503, the engine gives running requests the grace period and aborts the rest (so
every stream still ends with a final chunk and ``[DONE]``), uvicorn closes the
connections, and the process exits 0 (130 after Ctrl-C) instead of uvicorn's raising
the signal again, which would end it by SIGTERM.
"""

from __future__ import annotations

import contextlib
import signal
import socket
import sys
from collections.abc import Iterator
from typing import Any

import uvicorn
from fastapi import FastAPI

#: Seconds uvicorn waits, after the engine's grace, for the last answers to go out.
FLUSH_S = 5.0
#: The exit status after Ctrl-C, as every slotwise command.
INTERRUPTED = 128 + signal.SIGINT


def serve(app: FastAPI, listener: socket.socket, *, model_name: str, grace_s: float) -> int | None:
    """Serve ``app`` on ``listener`` (bound, not listening) until a signal; the exit
    status, or None if the server did not start."""
    config = uvicorn.Config(
        app,
        log_level="warning",
        access_log=False,
        timeout_graceful_shutdown=FLUSH_S,
        lifespan="on",
    )
    server = _Server(config, app=app, grace_s=grace_s)
    host, port = listener.getsockname()[:2]
    server.banner = f"slotwise serve: {model_name} on http://{_url_host(host)}:{port}"
    server.run(sockets=[listener])
    if not server.started:
        return None
    return INTERRUPTED if signal.SIGINT in server.signals else 0


def _url_host(host: str) -> str:
    return f"[{host}]" if ":" in host else host


class _Server(uvicorn.Server):
    def __init__(self, config: uvicorn.Config, *, app: FastAPI, grace_s: float) -> None:
        super().__init__(config)
        self.app = app
        self.grace_s = grace_s
        self.signals: list[int] = []
        self.banner = ""

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        await super().startup(sockets)
        if self.started:
            print(self.banner, file=sys.stderr, flush=True)

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        print("slotwise serve: shutting down", file=sys.stderr, flush=True)
        for server in self.servers:
            server.close()
        self.app.state.draining = True
        await self.app.state.engine.shutdown(self.grace_s)
        await super().shutdown(sockets)

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        handled = (signal.SIGINT, signal.SIGTERM)
        previous = {sig: signal.signal(sig, self._on_signal) for sig in handled}
        try:
            yield
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)

    def _on_signal(self, sig: int, frame: Any) -> None:
        self.signals.append(sig)
        self.handle_exit(sig, frame)
