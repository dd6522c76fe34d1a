"""``PlatformSpec``: how a plugin announces a platform without importing it."""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass

from slotwise.import_path import check_import_path
from slotwise.platforms.api_range import ApiRange

#: What a platform name may be: it is also a module suffix and an environment-variable part.
#: Anchored with \A and \Z (``$`` also matches before a final newline: "cpu\n" would pass),
#: so ``match`` checks the whole name too.
PLATFORM_NAME_PATTERN = re.compile(r"\A[a-z][a-z0-9_]*\Z")

_API_EXAMPLE = "'>=1.0,<2'"


@dataclass(frozen=True)
class PlatformSpec:
    """One platform offered by a plugin.

    ``platform_cls`` is a ``"module:Class"`` string so that the platform's module
    (and whatever heavy library it imports) loads only if the platform is selected.
    ``probe()`` answers "can this platform run here?" cheaply: ``True``, or
    ``False`` / a reason string such as ``"no NVIDIA driver found"``.  It runs at
    most once per process and must not initialise a device.
    """

    name: str
    platform_cls: str
    probe: Callable[[], bool | str]
    priority: int = 0
    requires_api: str = ">=1.0,<2"

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not PLATFORM_NAME_PATTERN.fullmatch(self.name):
            raise ValueError(
                f"PlatformSpec.name {self.name!r} must be lower-case letters, digits and "
                "underscores, starting with a letter (e.g. 'myvendor')"
            )
        check_import_path(
            self.platform_cls,
            f"PlatformSpec.platform_cls for {self.name!r}",
            fix="give a 'module:Class' string such as 'slotwise_myvendor.platform:MyPlatform'",
        )
        if not callable(self.probe):
            raise TypeError(f"PlatformSpec.probe for {self.name!r} must be callable")
        if isinstance(self.priority, bool) or not isinstance(self.priority, int):
            raise TypeError(f"PlatformSpec.priority for {self.name!r} must be an int")
        if isinstance(self.requires_api, str) and not self.requires_api.strip():
            # An empty specifier admits every version, API 2, 3... included.
            raise ValueError(
                f"PlatformSpec.requires_api for {self.name!r} is empty, which would claim "
                f"every slotwise API version; give the range the plugin was written for, "
                f"such as {_API_EXAMPLE}"
            )
        try:
            ApiRange(self.requires_api)
        except (ValueError, TypeError) as exc:  # packaging's InvalidSpecifier is a ValueError
            raise ValueError(
                f"PlatformSpec.requires_api {self.requires_api!r} for {self.name!r} is not a "
                f"PEP 440 specifier such as {_API_EXAMPLE}"
            ) from exc

    def supports_api(self, api_version: str) -> bool:
        return ApiRange(self.requires_api).contains(api_version)


def api_range_warning(spec: PlatformSpec) -> str:
    """Why ``spec.requires_api`` is risky though valid (it has no upper bound), or ""."""
    if ApiRange(spec.requires_api).has_upper_bound:
        return ""
    return (
        f"requires_api {spec.requires_api!r} has no upper bound, so a new major slotwise "
        "API version may break the plugin while it is still selected; bound it, e.g. "
        f"add ',<2' ({_API_EXAMPLE})"
    )
