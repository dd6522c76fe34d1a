"""Commands of other distributions: the ``slotwise.cli_commands`` entry-point group.

Each test installs real distributions (``*.dist-info`` folders on sys.path) and runs the
``slotwise`` command line in a fresh interpreter, as a user's installation would.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import json
import subprocess
from pathlib import Path

import pytest
from support import Distributions

from slotwise.cli.command_entry_points import COMMAND_GROUP, find_commands

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


#: A command module that announces its import, so a test can tell whether it was imported.
NOISY = (
    """
    import sys
    print("noisy imported")
    print("noisy imported", file=sys.stderr)
"""
    + HELLO
)


def test_a_distribution_adds_a_command_through_its_entry_point(dists):
    add_command(dists, "slotwise-hello", HELLO, "hello")
    done = slotwise(dists, "hello", "--to", "you")
    assert done.returncode == 0, done.stderr
    assert done.stdout == "hello you from hello\n"
    assert "usage: slotwise hello [-h] [--to TO]" in slotwise(dists, "hello", "--help").stdout


def test_only_the_command_asked_for_is_imported_and_help_lists_all_from_metadata(dists):
    add_command(dists, "slotwise-noisy", NOISY, "noisy")
    listed = slotwise(dists, "--help")
    assert listed.returncode == 0, listed.stderr
    (line,) = [line for line in listed.stdout.splitlines() if line.strip().startswith("noisy")]
    assert "from slotwise-noisy; 'slotwise noisy --help' for its options" in line
    assert "noisy imported" not in listed.stdout + listed.stderr
    other = slotwise(dists, "new-plugin", "--help")
    assert other.returncode == 0 and "noisy imported" not in other.stdout + other.stderr
    asked = slotwise(dists, "noisy", "--to", "you")
    assert asked.returncode == 0, asked.stderr
    # What the module prints at import goes to stderr: stdout is the command's answer.
    assert asked.stdout == "hello you from noisy\n"
    assert asked.stderr.count("noisy imported") == 2


def test_a_broken_command_breaks_itself_alone(dists):
    add_command(dists, "slotwise-broken", "import no_such_module_here\n", "broken")
    add_command(dists, "slotwise-hello", HELLO, "hello")
    done = slotwise(dists, "hello")
    assert done.returncode == 0, done.stderr
    assert done.stdout == "hello world from hello\n"
    assert "broken" not in done.stderr  # never imported, so never met
    asked = slotwise(dists, "broken", "--flag")
    assert asked.returncode == 2
    assert asked.stderr == (
        "slotwise: error: command 'broken' of distribution slotwise-broken 1.0 is unusable "
        "(failed to load: ModuleNotFoundError: No module named 'no_such_module_here'); "
        "reinstall slotwise-broken (pip install --force-reinstall slotwise-broken) or "
        "uninstall it\n"
    )


#: Command modules that misbehave where no command module should: printing, exiting and
#: raising at import or in add_parser.
MISBEHAVING = {
    "exits-at-import": "import sys\nprint('exiting')\nsys.exit(4)\n",
    "raises-in-add-parser": (
        "def add_parser(commands, name):\n"
        "    print('adding')\n"
        "    raise RuntimeError('no parser today')\n"
        "def run(args):\n"
        "    return 0\n"
    ),
    "exits-in-add-parser": (
        "import sys\n"
        "def add_parser(commands, name):\n"
        "    sys.exit('bye')\n"
        "def run(args):\n"
        "    return 0\n"
    ),
}


def test_misbehaving_command_modules_leave_env_json_alone(dists):
    for name, source in MISBEHAVING.items():
        add_command(dists, f"slotwise-{name}", source, name)
    done = slotwise(dists, "env", "--json")
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["platform"] == "cpu"  # stdout is the JSON alone
    for name in MISBEHAVING:
        assert name not in done.stderr


@pytest.mark.parametrize(
    ("name", "why"),
    [
        ("exits-at-import", "failed to load: called sys.exit(4)"),
        ("raises-in-add-parser", "add_parser failed: RuntimeError: no parser today"),
        ("exits-in-add-parser", "add_parser failed: called sys.exit('bye')"),
    ],
)
def test_a_command_that_exits_or_raises_while_loading_is_one_error_naming_it(dists, name, why):
    add_command(dists, f"slotwise-{name}", MISBEHAVING[name], name)
    done = slotwise(dists, name)
    assert done.returncode == 2
    assert done.stdout == ""
    error = done.stderr.splitlines()[-1]
    assert error == (
        f"slotwise: error: command {name!r} of distribution slotwise-{name} 1.0 is unusable "
        f"({why}); reinstall slotwise-{name} (pip install --force-reinstall slotwise-{name}) "
        "or uninstall it"
    )


def test_a_command_declared_twice_is_warned_about_naming_both_distributions(dists, tmp_path):
    add_command(dists, "slotwise-hello", HELLO, "hello")
    later = Distributions(tmp_path / "later")
    later.root.mkdir()
    add_command(later, "slotwise-hello-too", "raise ImportError('must not be imported')", "hello")
    done = dists.run(
        "from slotwise.cli.main import main\nraise SystemExit(main(['hello']))",
        PYTHONPATH=str(later.root),
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout == "hello world from hello\n"
    assert done.stderr == (
        "WARNING slotwise: the command 'hello' is declared by distribution slotwise-hello 1.0 "
        "and distribution slotwise-hello-too 1.0; slotwise runs the one of distribution "
        "slotwise-hello 1.0. Uninstall slotwise-hello-too or rename its entry point\n"
    )


def test_the_engine_commands_win_over_look_alikes_found_first(dists):
    # dists comes first on sys.path, before the engine's installation.
    add_command(dists, "slotwise-evil", "raise ImportError('must not be imported')", "generate")
    done = slotwise(dists, "generate", "--help")
    assert done.returncode == 0, done.stderr
    assert "--model DIR" in done.stdout
    (warning,) = done.stderr.splitlines()
    engine = importlib.metadata.distribution("slotwise-engine")
    assert warning == (
        "WARNING slotwise: the command 'generate' is declared by distribution slotwise-evil "
        f"1.0 and distribution slotwise-engine {engine.version}; slotwise runs the one of "
        f"distribution slotwise-engine {engine.version}. Uninstall slotwise-evil or rename "
        "its entry point"
    )


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


def test_generate_bench_and_serve_come_from_the_engine_distribution():
    found = {ep.name: ep.dist.name for ep in importlib.metadata.entry_points(group=COMMAND_GROUP)}
    assert found["generate"] == found["bench"] == found["serve"] == "slotwise-engine"
    assert not {"generate", "bench", "serve"} & set(cli_main.BUILT_IN_COMMANDS)


def test_without_the_engine_its_commands_say_what_to_install():
    # What `slotwise generate` answers where only the core is installed (the venv test in
    # tests/packaging runs the real command there): one line, the package to install.
    commands, _ = find_commands(cli_main.BUILT_IN_COMMANDS)
    commands = {name: commands[name] for name in cli_main.BUILT_IN_COMMANDS}
    reason = cli_main._unavailable("generate", commands)
    assert reason == (
        "slotwise generate is part of the slotwise-engine distribution, which is not "
        "installed: pip install slotwise-engine (installed: conformance, env, matrix, "
        "new-plugin)"
    )
    assert cli_main._unavailable("serve", commands).startswith(
        "slotwise serve is part of the slotwise-engine distribution"
    )
    assert cli_main._unavailable("env", commands) is None


#: A command interrupted inside code run by exec() of a string, as Ctrl-C lands when
#: torch runs the code it generates.
INTERRUPTED_IN_EXEC = """
    def add_parser(commands, name):
        commands.add_parser(name, help="interrupted in generated code")

    def run(args):
        exec("raise KeyboardInterrupt", {})
"""


def test_ctrl_c_in_exec_run_code_ends_python_m_slotwise_with_130(dists):
    add_command(dists, "slotwise-stop", INTERRUPTED_IN_EXEC, "stop")
    done = dists.run_module("slotwise", "stop")
    assert (done.returncode, done.stderr) == (130, "slotwise stop: interrupted\n")
