"""The socket `slotwise serve` listens on: its connections send what is written at once."""

from __future__ import annotations

import asyncio
import socket

from slotwise_engine.cli.serve_command import _bind


async def nagle_off_on_accepted_connection(listener: socket.socket) -> bool:
    """Whether a connection accepted from ``listener`` as uvicorn accepts them (an asyncio
    server on the socket) has Nagle's algorithm turned off."""
    accepted: asyncio.Future[bool] = asyncio.get_running_loop().create_future()

    def on_connect(_: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        connection = writer.get_extra_info("socket")
        accepted.set_result(bool(connection.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY)))
        writer.close()

    server = await asyncio.start_server(on_connect, sock=listener)
    async with server:
        host, port = listener.getsockname()[:2]
        _, client = await asyncio.open_connection(host, port)
        try:
            return await asyncio.wait_for(accepted, timeout=10)
        finally:
            client.close()


def test_streamed_events_are_not_held_for_the_clients_ack():
    # With Nagle's algorithm on, each small write of a stream on a kept-alive connection
    # (a token's event) waits for the client's delayed ACK, up to 40 ms on Linux.
    listener = _bind("127.0.0.1", 0)
    with listener:
        assert asyncio.run(nagle_off_on_accepted_connection(listener))
