"""Process-wide compilation counters, for tests and for `slotwise bench`.

Tests assert exact increments with ``counters.expect(...)``, so every compile,
capture and cache lookup is visible rather than inferred from timings.
"""

from __future__ import annotations

import contextlib
import dataclasses
import threading
from collections.abc import Iterator


@dataclasses.dataclass
class CompilationCounters:
    num_models_seen: int = 0
    num_graphs_seen: int = 0
    num_piecewise_graphs_seen: int = 0
    num_piecewise_capturable_graphs_seen: int = 0
    num_backend_compilations: int = 0
    num_inductor_compiles: int = 0
    num_eager_compiles: int = 0
    num_graphs_captured: int = 0
    num_cache_hits: int = 0
    num_cache_misses: int = 0

    def __post_init__(self) -> None:
        self._lock = threading.Lock()

    def bump(self, name: str, amount: int = 1) -> None:
        with self._lock:
            setattr(self, name, getattr(self, name) + amount)

    def snapshot(self) -> dict[str, int]:
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}

    @contextlib.contextmanager
    def expect(self, **deltas: int) -> Iterator[None]:
        """Assert that the block increments each named counter by exactly its delta
        (0 included); counters not named are not checked."""
        unknown = set(deltas) - set(self.snapshot())
        if unknown:
            raise TypeError(f"unknown counters {sorted(unknown)}; known: {sorted(self.snapshot())}")
        before = self.snapshot()
        yield
        after = self.snapshot()
        wrong = {
            name: (delta, after[name] - before[name])
            for name, delta in deltas.items()
            if after[name] - before[name] != delta
        }
        if wrong:
            details = ", ".join(f"{n}: expected +{e}, got +{g}" for n, (e, g) in wrong.items())
            raise AssertionError(f"compilation counters differ: {details}")


#: The counters of this process.
counters = CompilationCounters()
