"""The ``slotwise`` commands send the core's and the engine's logging to stderr at
SLOTWISE_LOGGING_LEVEL: the engine is a package of its own, so its loggers
(``slotwise_engine.*``) are not children of ``slotwise`` and need the same setting."""

from __future__ import annotations

import importlib
import logging

import pytest

cli_main = importlib.import_module("slotwise.cli.main")  # the package exports main()

ROOTS = ("slotwise", "slotwise_engine")


@pytest.fixture
def restored_loggers():
    saved = {
        name: (logging.getLogger(name).level, logging.getLogger(name).propagate) for name in ROOTS
    }
    handlers = {name: list(logging.getLogger(name).handlers) for name in ROOTS}
    for name in ROOTS:
        logging.getLogger(name).handlers.clear()
    # Whatever ran before in this process (a library's logging.disable, say) is undone.
    disabled = logging.root.manager.disable
    logging.disable(logging.NOTSET)
    yield
    logging.disable(disabled)
    for name, (level, propagate) in saved.items():
        logger = logging.getLogger(name)
        logger.setLevel(level)
        logger.propagate = propagate
        logger.handlers[:] = handlers[name]


# Loggers of their own, which no other test has configured.
@pytest.mark.parametrize("module", ["slotwise.logging_probe", "slotwise_engine.logging_probe"])
def test_every_part_logs_at_the_level_the_variable_sets(
    monkeypatch, capsys, restored_loggers, module
):
    monkeypatch.setenv("SLOTWISE_LOGGING_LEVEL", "debug")
    cli_main.configure_logging()
    logging.getLogger(module).debug("a detail from %s", module)
    assert f"DEBUG slotwise: a detail from {module}" in capsys.readouterr().err

    monkeypatch.setenv("SLOTWISE_LOGGING_LEVEL", "warning")
    cli_main.configure_logging()
    logging.getLogger(module).info("progress")
    logging.getLogger(module).warning("a problem")
    err = capsys.readouterr().err
    assert "progress" not in err
    assert err.count("WARNING slotwise: a problem") == 1  # one handler, however often set up
