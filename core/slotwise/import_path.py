"""``"module:attr"`` import paths: how plugins and configs name code that loads on first use.

Why one module: platform classes, attention backends, custom-op replacements and
compilers are all named this way, so one parser gives them one syntax and errors that
name the path, the part that failed and the fix.  It never imports torch.
"""

from __future__ import annotations

import importlib
from typing import Any


def check_import_path(
    text: object, what: str, *, fix: str, error: type[Exception] = ValueError
) -> str:
    """``text`` if it is ``"package.module:Name.attr"``, else ``error`` naming what is wrong."""
    if not isinstance(text, str):
        raise error(f"{what}: got {type(text).__name__}, not a 'module:attr' string; {fix}")
    module, colon, attr = text.partition(":")
    if not colon:
        problem = "no ':' between the module and the attribute"
    elif not _is_dotted_name(module):
        problem = "the module before ':' is not a dotted Python name"
    elif not _is_dotted_name(attr):
        problem = "the attribute after ':' is not a dotted Python name"
    else:
        return text
    raise error(f"{what}: got {_shown(text)}, not a 'module:attr' import path ({problem}); {fix}")


def resolve_import_path(
    text: object,
    *,
    what: str,
    fix: str,
    expected_type: type | None = None,
    error: type[Exception] = ValueError,
) -> Any:
    """The object ``text`` names, imported now; with ``expected_type``, a subclass of it.

    Any failure, whatever the imported module raises, is an ``error`` whose message says
    which part failed, so callers report one exception type.
    """
    path = check_import_path(text, what, fix=fix, error=error)
    module_name, _, qualname = path.partition(":")
    shown = _shown(path)
    try:
        found: Any = importlib.import_module(module_name)
    except Exception as exc:
        raise error(
            f"{what}: cannot import module {module_name!r} (from {shown}): "
            f"{type(exc).__name__}: {exc}; {fix}"
        ) from exc
    names = qualname.split(".")
    for depth, name in enumerate(names, start=1):
        try:
            found = getattr(found, name)
        except Exception as exc:
            raise error(
                f"{what}: cannot get {'.'.join(names[:depth])!r} from module {module_name!r} "
                f"(from {shown}): {type(exc).__name__}: {exc}; {fix}"
            ) from exc
    if expected_type is not None and not (
        isinstance(found, type) and issubclass(found, expected_type)
    ):
        raise error(
            f"{what}: {shown} is {found!r}, not a subclass of "
            f"{expected_type.__module__}.{expected_type.__qualname__}; {fix}"
        )
    return found


def _is_dotted_name(text: str) -> bool:
    return all(part.isidentifier() for part in text.split("."))


def _shown(text: str) -> str:
    """``repr(text)``, cut: a config value may be a megabyte long."""
    return repr(text) if len(text) <= 200 else f"{text[:200]!r}..."
