"""Choosing the attention backend of a platform for a layer's requirements.

Rules, in order:
0. A platform that makes the choice itself (``Platform.get_attention_backend_cls``
   returns a class) is followed.
1. A backend named by the caller or by ``SLOTWISE_ATTENTION_BACKEND`` is used, or an
   error says why not (unknown name: an UnknownAttentionBackendError listing the known
   names; does not fit: its reasons).
2. Otherwise the platform's backends in priority order; the first whose
   ``validate`` finds no problem wins.
3. None fits: an error listing every backend considered and why it was rejected.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from slotwise import envs
from slotwise.attention.backend import AttentionBackend
from slotwise.attention.registry import (
    AttentionBackendError,
    AttentionBackendRegistry,
    BackendEntry,
    UnknownAttentionBackendError,
    get_attention_backend_registry,
)

if TYPE_CHECKING:
    from slotwise.platforms import Platform

logger = logging.getLogger(__name__)

_announced: set[tuple[str, str]] = set()


def select_attention_backend(
    platform: Platform | str,
    selected: str | None = None,
    *,
    registry: AttentionBackendRegistry | None = None,
    **requirements: Any,
) -> type[AttentionBackend]:
    """The backend class for ``requirements`` (head_size, dtype, block_size) on a platform:
    the platform's own choice if it makes one (``Platform.get_attention_backend_cls``),
    else the registered backends' by the rules in docs/attention.md."""
    if not isinstance(platform, str):
        chosen = platform.get_attention_backend_cls(selected, **requirements)
        if chosen is not None:
            return chosen
        platform = platform.name
    platform_name = platform
    if registry is None:
        registry = get_attention_backend_registry()
    source, undo = "selected", "pass selected=None"
    if selected is None:
        selected = envs.get("SLOTWISE_ATTENTION_BACKEND")
        source, undo = "SLOTWISE_ATTENTION_BACKEND", "unset SLOTWISE_ATTENTION_BACKEND"
    wanted = _describe(requirements)
    entries = registry.entries(platform_name)
    if selected is not None:
        backend = _named(platform_name, selected, source, undo, entries, registry)
        reasons = backend.validate(**requirements)
        if reasons:
            raise AttentionBackendError(
                f"attention backend {backend.get_name()} ({source}={selected}) cannot serve "
                f"{wanted}: {'; '.join(reasons)}; {undo} to let platform "
                f"{platform_name!r} choose"
            )
        _announce(platform_name, backend, f"{source}={selected}")
        return backend
    rejected, broken = [], []
    for entry in entries:
        try:
            backend = entry.load()
        except AttentionBackendError as exc:  # a broken backend must not hide the others
            rejected.append(f"{entry.label}: {exc}")
            broken.append(rejected[-1])
            continue
        reasons = backend.validate(**requirements)
        if not reasons:
            _warn_passed_over(platform_name, backend, broken)
            _announce(platform_name, backend, f"priority {entry.priority}")
            return backend
        rejected.append(f"{backend.get_name()} ({entry.label}): {'; '.join(reasons)}")
    if not rejected:
        raise AttentionBackendError(
            f"no attention backend is registered for platform {platform_name!r}; install a "
            "plugin that implements slotwise_register_attention_backends for it"
        )
    raise AttentionBackendError(
        f"no attention backend of platform {platform_name!r} can serve {wanted}:\n  "
        + "\n  ".join(rejected)
    )


def _named(
    platform_name: str,
    name: str,
    source: str,
    undo: str,
    entries: list[BackendEntry],
    registry: AttentionBackendRegistry,
) -> type[AttentionBackend]:
    known = []
    for entry in entries:
        try:
            backend = entry.load()
        except AttentionBackendError as exc:
            known.append(f"{entry.label} ({exc})")
            continue
        if backend.get_name().upper() == name.strip().upper():
            return backend
        known.append(backend.get_name())
    elsewhere = []
    for entry in registry.entries():
        if entry.platform != platform_name:
            try:
                elsewhere.append(f"{entry.load().get_name()} ({entry.platform})")
            except Exception:  # noqa: BLE001 - only a hint in an error message
                continue
    others = f"; registered for other platforms: {', '.join(elsewhere)}" if elsewhere else ""
    fix = (
        "set SLOTWISE_ATTENTION_BACKEND to a known name"
        if source == "SLOTWISE_ATTENTION_BACKEND"
        else "pass a known name"
    )
    raise UnknownAttentionBackendError(
        f"{source}={name}: unknown attention backend name {name.strip()!r} for platform "
        f"{platform_name!r}; known: {', '.join(known) or 'none'}{others}; {fix}, or {undo} "
        f"to let platform {platform_name!r} choose"
    )


def _describe(requirements: dict[str, Any]) -> str:
    given = ", ".join(f"{k}={v}" for k, v in requirements.items() if v is not None)
    return given or "any requirements"


def _warn_passed_over(
    platform_name: str, backend: type[AttentionBackend], broken: list[str]
) -> None:
    """One warning per broken backend that a lower-priority one replaced: falling back
    is never silent."""
    for problem in broken:
        key = (platform_name, problem)
        if key not in _announced:
            _announced.add(key)
            logger.warning(
                "attention backend %s on platform %s serves in place of a higher-priority "
                "backend that cannot be loaded (%s); fix or uninstall the plugin that "
                "registers it",
                backend.get_name(),
                platform_name,
                problem,
            )


def _announce(platform_name: str, backend: type[AttentionBackend], why: str) -> None:
    # Every layer selects; say it once per process and choice.
    key = (platform_name, backend.get_name())
    if key not in _announced:
        _announced.add(key)
        logger.info(
            "attention backend %s on platform %s (%s)", backend.get_name(), platform_name, why
        )
