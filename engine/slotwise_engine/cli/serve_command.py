"""``slotwise serve``: an OpenAI-compatible HTTP server for a Hugging Face checkpoint.

The model is loaded and its graphs captured before the port listens, so ``/health``
answers only once requests can run.  SIGTERM (or Ctrl-C) stops the listening socket,
lets running requests finish for ``--shutdown-grace`` seconds, aborts the rest (their
streams end with finish_reason "abort", the others get a 503), and exits 0 (130 after
Ctrl-C).  FastAPI and uvicorn come with ``pip install 'slotwise-engine[serve]'``.
"""

from __future__ import annotations

import argparse
import socket
from pathlib import Path
from typing import TYPE_CHECKING, Any

from slotwise.cli.arguments import MAX_TOKENS, float_in, int_in
from slotwise.errors import SlotwiseError

if TYPE_CHECKING:
    from fastapi import FastAPI

    from slotwise.compilation.config import CompilationConfig

DTYPES = ("float32", "bfloat16", "float16")
#: Seconds running requests get to finish once the server is told to stop.
DEFAULT_SHUTDOWN_GRACE_S = 30.0
#: A week: the longest grace that means anything.
MAX_SHUTDOWN_GRACE_S = 7 * 24 * 3600.0


class ServeError(SlotwiseError):
    """``slotwise serve`` cannot start; main() reports it in one line (exit 2)."""


def add_parser(commands: Any, name: str) -> None:
    from slotwise.compilation.config import CompilationConfig

    parser = commands.add_parser(
        name, help="serve a Hugging Face checkpoint over an OpenAI-compatible HTTP API"
    )
    parser.add_argument(
        "--model",
        required=True,
        metavar="DIR",
        help="checkpoint folder: config.json, *.safetensors, tokenizer.json",
    )
    parser.add_argument(
        "--served-model-name",
        metavar="NAME",
        default=None,
        help="the model's name in requests and /v1/models (default: the folder's name)",
    )
    parser.add_argument(
        "--host",
        default="127.0.0.1",
        help="address to listen on (default 127.0.0.1: this machine only; 0.0.0.0: all)",
    )
    parser.add_argument(
        "--port", type=int_in(0, 65535), default=8000, help="TCP port (default 8000; 0: any)"
    )
    parser.add_argument(
        "--max-num-seqs",
        type=int_in(1, 65536),
        default=64,
        help="requests in one step at most (default 64)",
    )
    parser.add_argument(
        "--max-num-batched-tokens",
        type=int_in(1, MAX_TOKENS),
        default=512,
        help="tokens in one step at most, decodes and prefill chunks together (default 512)",
    )
    parser.add_argument(
        "--num-kv-blocks",
        type=int_in(2, MAX_TOKENS),
        default=None,
        help="size of the KV cache, in blocks of the model's block size (default: the "
        "engine's); requests preempt each other when it runs out",
    )
    parser.add_argument(
        "--max-model-len",
        type=int_in(1, MAX_TOKENS),
        default=None,
        help="most tokens of one request, prompt and output (default: the model's context, "
        "or what the KV cache holds if less)",
    )
    parser.add_argument(
        "--max-waiting",
        type=int_in(1, MAX_TOKENS),
        default=None,
        help="requests that may wait for a place in a step; more are refused with 503 "
        "(default: the engine's limit)",
    )
    parser.add_argument(
        "--shutdown-grace",
        type=float_in(0, MAX_SHUTDOWN_GRACE_S),
        default=DEFAULT_SHUTDOWN_GRACE_S,
        metavar="SECONDS",
        help="on SIGTERM, how long running requests may take to finish before they are "
        f"aborted (default {DEFAULT_SHUTDOWN_GRACE_S:g})",
    )
    parser.add_argument(
        "--dtype", choices=DTYPES, default=None, help="weights' dtype (default: config.json's)"
    )
    CompilationConfig.add_cli_arguments(parser)


def run(args: argparse.Namespace) -> int:
    try:
        import fastapi  # noqa: F401
        import uvicorn  # noqa: F401
    except ImportError as exc:
        raise ServeError(
            f"slotwise serve needs FastAPI and uvicorn ({exc.name} is missing): "
            "pip install 'slotwise-engine[serve]'"
        ) from None
    from slotwise.compilation.config import CompilationConfig
    from slotwise_engine.server.http_server import serve

    folder = Path(args.model)
    if not folder.is_dir():
        raise ServeError(f"argument --model: {folder}: no such folder")
    config = CompilationConfig.from_cli_namespace(args)
    name = args.served_model_name or folder.resolve().name
    listener = _bind(args.host, args.port)  # before loading: a taken port fails at once
    with listener:
        app = _app(args, folder, name, config)
        code = serve(app, listener, model_name=name, grace_s=args.shutdown_grace)
    if code is None:
        raise ServeError("the server did not start; see the messages above")
    return code


def _bind(host: str, port: int) -> socket.socket:
    """A socket bound to ``host:port``, not yet listening (connections are refused until
    the model is ready)."""
    try:
        family = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0][0]
    except socket.gaierror as exc:
        raise ServeError(f"argument --host: {host!r} is not an address ({exc.strerror})") from None
    # IPPROTO_TCP named, not implied (0): asyncio turns Nagle's algorithm off only on
    # connections of sockets that say TCP, and with it on, a kept-alive connection's
    # small stream writes wait for the client's delayed ACK (40 ms) before going out.
    listener = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        listener.bind((host, port))
    except OSError as exc:
        listener.close()
        raise ServeError(
            f"cannot listen on {host}:{port} ({exc.strerror}); choose another --port or --host"
        ) from None
    return listener


def _app(args: argparse.Namespace, folder: Path, name: str, config: CompilationConfig) -> FastAPI:
    """The application over an engine for ``folder``, loaded and captured now."""
    from slotwise_engine.server.app import ServedModel, build_app
    from slotwise_engine.serving.async_engine import AsyncLLMEngine
    from slotwise_engine.serving.engine import LLMEngine

    engine = LLMEngine.from_checkpoint(
        folder,
        dtype=args.dtype,
        compilation=config,
        num_kv_blocks=args.num_kv_blocks,
        max_num_seqs=args.max_num_seqs,
        max_num_batched_tokens=args.max_num_batched_tokens,
        max_model_len=args.max_model_len,
        model_name=name,
    )
    model = ServedModel(name=name, tokenizer=engine.tokenizer, max_model_len=engine.max_model_len)
    limit = {} if args.max_waiting is None else {"max_waiting": args.max_waiting}
    return build_app(lambda: AsyncLLMEngine(engine, **limit), model)
