"""Commands of other distributions: the ``slotwise.cli_commands`` entry-point group.

Each test installs real distributions (``*.dist-info`` folders on sys.path) and runs the
``slotwise`` command line in a fresh interpreter, as a user's installation would.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import subprocess
import sys
from pathlib import Path

from support import Distributions, clean_env

from slotwise.cli.command_entry_points import COMMAND_GROUP

cli_main = importlib.import_module("slotwise.cli.main")

CORE = Path(__file__).resolve().parents[2] / "core"

HELLO = """
    def add_parser(commands, name):
        parser = commands.add_parser(name, help="say hello")
        parser.add_argument("--to", default="world")

    def run(args):
        print(f"hello {args.to} from {args.command}")
        return 0
"""


def add_command(dists: Distributions, dist_name: str, source: str, command: str) -> None:
    """A distribution declaring ``command`` in the CLI group, its module from ``source``."""
    module = dists.add(dist_name, source)
    info = next(dists.root.glob(f"{module}-*.dist-info"))
    (info / "entry_points.txt").write_text(f"[{COMMAND_GROUP}]\n{command} = {module}\n")


def slotwise(dists: Distributions, *args: str) -> subprocess.CompletedProcess[str]:
    return dists.run(f"from slotwise.cli.main import main\nraise SystemExit(main({list(args)!r}))")


def test_a_distribution_adds_a_command_through_its_entry_point(dists):
    add_command(dists, "slotwise-hello", HELLO, "hello")
    done = slotwise(dists, "hello", "--to", "you")
    assert done.returncode == 0, done.stderr
    assert done.stdout == "hello you from hello\n"
    listed = slotwise(dists, "--help")
    assert listed.returncode == 0 and "say hello" in listed.stdout


def test_a_broken_command_is_reported_and_the_others_still_work(dists):
    add_command(dists, "slotwise-broken", "import no_such_module_here\n", "broken")
    add_command(dists, "slotwise-hello", HELLO, "hello")
    done = slotwise(dists, "hello")
    assert done.returncode == 0, done.stderr
    assert done.stdout == "hello world from hello\n"
    (warning,) = [line for line in done.stderr.splitlines() if "broken" in line]
    assert "slotwise-broken 1.0" in warning and "No module named 'no_such_module_here'" in warning
    assert "pip install --force-reinstall slotwise-broken" in warning
    asked = slotwise(dists, "broken", "--flag")
    assert asked.returncode == 2
    assert asked.stderr.startswith("slotwise: error: command 'broken' of distribution ")
    assert len(asked.stderr.splitlines()) == 1, asked.stderr


def test_a_module_without_the_command_protocol_is_refused(dists):
    add_command(dists, "slotwise-half", "def add_parser(commands, name):\n    pass\n", "half")
    done = slotwise(dists, "half")
    assert done.returncode == 2
    assert "'slotwise_half' has no run" in done.stderr and "slotwise-half" in done.stderr


def test_a_malformed_entry_point_value_names_the_value_and_the_fix(dists):
    add_command(dists, "slotwise-garbled", HELLO, "garbled")
    info = next(dists.root.glob("slotwise_garbled-*.dist-info"))
    (info / "entry_points.txt").write_text(f"[{COMMAND_GROUP}]\ngarbled = not a module!\n")
    done = slotwise(dists, "garbled")
    assert done.returncode == 2
    assert done.stderr == (
        "slotwise: error: command 'garbled' of distribution slotwise-garbled 1.0 is unusable "
        "(failed to load: ValueError: entry point value 'not a module!' is not 'module' or "
        "'module:attribute'; fix the entry point in the distribution's pyproject.toml and "
        "reinstall it); reinstall slotwise-garbled (pip install --force-reinstall "
        "slotwise-garbled) or uninstall it\n"
    )


def test_a_command_cannot_replace_a_built_in_one(dists):
    add_command(dists, "slotwise-env-thief", HELLO, "env")
    done = slotwise(dists, "new-plugin", "--help")
    assert done.returncode == 0, done.stderr
    assert "slotwise-env-thief 1.0 declares the command 'env', which slotwise has built in" in (
        done.stderr
    )
    assert "say hello" not in slotwise(dists, "--help").stdout


def test_an_unknown_command_lists_the_installed_ones(dists):
    add_command(dists, "slotwise-hello", HELLO, "hello")
    done = slotwise(dists, "helo")
    assert done.returncode == 2
    assert "invalid choice: 'helo'" in done.stderr
    for name in ("env", "matrix", "conformance", "new-plugin", "hello"):
        assert f"'{name}'" in done.stderr


def test_generate_and_bench_come_from_the_engine_distribution():
    found = {ep.name: ep.dist.name for ep in importlib.metadata.entry_points(group=COMMAND_GROUP)}
    assert found["generate"] == found["bench"] == "slotwise-engine"
    assert not {"generate", "bench"} & set(cli_main.BUILT_IN_COMMANDS)


def test_without_the_engine_its_commands_say_what_to_install(capsys):
    # What `slotwise generate` answers where only the core is installed (the venv test in
    # tests/packaging runs the real command there): one line, the package to install.
    commands = dict(cli_main.BUILT_IN_COMMANDS)
    reason = cli_main._unavailable(["generate", "--model", "folder"], commands, [])
    assert reason == (
        "slotwise generate is part of the slotwise-engine distribution, which is not "
        "installed: pip install slotwise-engine (installed: conformance, env, matrix, "
        "new-plugin)"
    )
    assert cli_main._unavailable(["env"], commands, []) is None


def test_without_the_engine_its_modules_fail_with_the_package_to_install():
    # The core alone on sys.path (no site-packages, so no engine): its finder answers,
    # for a submodule too (its parent package is the first import to fail).
    code = (
        "import slotwise\n"
        "for name in ('slotwise.models', 'slotwise.runner.model_runner', "
        "'slotwise.decode_benchmark'):\n"
        "    try:\n"
        "        __import__(name)\n"
        "    except ModuleNotFoundError as exc:\n"
        "        print(exc.name, '|', exc)\n"
        "    else:\n"
        "        print(name, 'imported')\n"
    )
    done = subprocess.run(
        [sys.executable, "-S", "-c", code],
        env=clean_env(PYTHONPATH=str(CORE)),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    message = "is part of the slotwise-engine distribution, which is not installed: "
    assert done.stdout.splitlines() == [
        f"slotwise.models | slotwise.models {message}pip install slotwise-engine",
        f"slotwise.runner | slotwise.runner {message}pip install slotwise-engine",
        f"slotwise.decode_benchmark | slotwise.decode_benchmark {message}pip install "
        "slotwise-engine",
    ]


def test_with_the_engine_installed_its_modules_join_the_slotwise_package():
    import slotwise
    import slotwise.models
    import slotwise.runner.model_runner

    engine = Path(slotwise.models.__file__).resolve().parents[1]
    assert engine != Path(slotwise.__file__).resolve().parent
    assert not (engine / "__init__.py").exists()
    assert callable(slotwise.models.load_model)
