"""The ``slotwise`` commands send the core's and the engine's logging to stderr at
SLOTWISE_LOGGING_LEVEL: the engine is a package of its own, so its loggers
(``slotwise_engine.*``) are not children of ``slotwise`` and need the same setting; and
to the stderr of the moment, whatever stream was stderr when logging was set up."""

from __future__ import annotations

import io
import logging
import subprocess
import sys

import pytest
from support import clean_env

from slotwise.cli.main import configure_logging

#: What a command's process does: set up logging as ``slotwise`` does, then log.
LOG = """
import logging, sys
from slotwise.cli.main import configure_logging
configure_logging()
configure_logging()  # set up twice: still one handler
logger = logging.getLogger(sys.argv[1])
logger.debug("a detail")
logger.info("progress")
logger.warning("a problem")
"""


def logged(module: str, level: str) -> str:
    done = subprocess.run(
        [sys.executable, "-c", LOG, module],
        capture_output=True,
        text=True,
        timeout=120,
        env=clean_env(SLOTWISE_LOGGING_LEVEL=level),
    )
    assert done.returncode == 0, done.stderr
    return done.stderr


@pytest.mark.parametrize("module", ["slotwise.compilation.direct_entry", "slotwise_engine.runner"])
def test_every_part_logs_at_the_level_the_variable_sets(module):
    assert "DEBUG slotwise: a detail" in logged(module, "debug")
    quiet = logged(module, "warning")
    assert "progress" not in quiet
    assert quiet.count("WARNING slotwise: a problem") == 1


def test_logging_follows_stderr_after_main_ran_under_a_stream_closed_since(monkeypatch):
    """``main`` called from Python with stderr captured (a test, a notebook cell) must
    not leave the logging on that stream once it is closed."""
    captured, later = io.StringIO(), io.StringIO()
    monkeypatch.setattr(sys, "stderr", captured)
    monkeypatch.setenv("SLOTWISE_LOGGING_LEVEL", "INFO")
    configure_logging()
    logger = logging.getLogger("slotwise_engine.runner.model_runner")
    logger.warning("while the first stream is open")
    captured.close()
    monkeypatch.setattr(sys, "stderr", later)
    logger.warning("after it was closed")
    assert later.getvalue() == "WARNING slotwise: after it was closed\n"
