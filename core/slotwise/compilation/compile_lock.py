"""One lock for every compile in the process.

Dynamo's tracing and Inductor's code generation keep process-wide state (and CPython's
``ast`` and ``compile`` are not safe to run from several threads at once), so models
built and first called from many threads compile one at a time. Running compiled code
takes no lock. Re-entrant: a compile can trigger another (a decorated submodule, a
piece compiled for a specific size).
"""

from __future__ import annotations

import threading

compile_lock = threading.RLock()
