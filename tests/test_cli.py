"""The command lines as a set: ``python -m mlx_w8a8`` (version, the list of commands),
the installed scripts of ``pyproject.toml``, and help for every option of every command."""

import argparse
import importlib
import os
import subprocess
import sys
from pathlib import Path

import pytest

import mlx_w8a8
from mlx_w8a8 import __main__ as cli

ROOT = Path(__file__).resolve().parent.parent


class _Parsed(Exception):
    """Raised in place of parsing, carrying the parser a command built."""


def command_parser(name: str, monkeypatch) -> argparse.ArgumentParser:
    """The argparse parser ``mlx_w8a8.<name>.main`` builds, caught as it starts parsing
    (whether the module builds it in a function of its own or inside ``main``)."""
    def catch(self, args=None, namespace=None):
        raise _Parsed(self)

    module = importlib.import_module(f"mlx_w8a8.{name}")
    with monkeypatch.context() as m:
        m.setattr(argparse.ArgumentParser, "parse_args", catch)
        with pytest.raises(_Parsed) as parsed:
            module.main([])
    return parsed.value.args[0]


def options_without_help(parser: argparse.ArgumentParser) -> list[str]:
    return [", ".join(a.option_strings) or a.dest for a in parser._actions
            if not a.help or not a.help.strip()]


@pytest.mark.parametrize("name", sorted(cli.COMMANDS))
def test_every_option_of_every_command_has_help(name, monkeypatch):
    parser = command_parser(name, monkeypatch)
    assert parser.prog == f"python -m mlx_w8a8.{name}"
    assert len(parser._actions) > 1  # a parser with options, not an empty stand-in
    assert options_without_help(parser) == [], name


def test_the_walk_finds_an_option_without_help():
    # The check above can fail: a parser with an option lacking help is reported.
    p = argparse.ArgumentParser()
    p.add_argument("--seq-len", type=int, help="tokens")
    p.add_argument("--batch-size", type=int)
    assert options_without_help(p) == ["--batch-size"]


def test_every_command_module_is_listed():
    # A module with a command line (a main() that parses arguments) is in the list.
    mains = sorted(p.stem for p in (ROOT / "mlx_w8a8").glob("*.py")
                   if p.stem != "__main__" and "def main(" in p.read_text())
    assert mains == sorted(cli.COMMANDS)


def test_python_m_mlx_w8a8_prints_the_version_and_the_commands():
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    run = lambda *args: subprocess.run([sys.executable, "-m", "mlx_w8a8", *args], cwd=ROOT,  # noqa: E731
                                       env=env, capture_output=True, text=True, timeout=120)
    done = run("--version")
    assert done.returncode == 0 and done.stdout.strip() == f"mlx_w8a8 {mlx_w8a8.__version__}"
    done = run()
    assert done.returncode == 0
    for name, line in cli.COMMANDS.items():
        assert f"  {name:<9} {line}" in done.stdout
    done = run("bogus")
    assert done.returncode == 2 and "invalid choice: 'bogus'" in done.stderr


@pytest.mark.parametrize("name", ["convert", "eval"])
def test_python_m_a_command_prints_no_runpy_warning(name):
    # runpy warns (RuntimeWarning) when the module it runs is in sys.modules already,
    # i.e. when ``import mlx_w8a8`` imported the command line; -W default shows it
    # whatever PYTHONWARNINGS says.
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    done = subprocess.run([sys.executable, "-W", "default", "-m", f"mlx_w8a8.{name}", "--help"],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith(f"usage: python -m mlx_w8a8.{name}")
    assert "RuntimeWarning" not in done.stderr, done.stderr


def test_a_command_runs_through_python_m_mlx_w8a8(capsys):
    with pytest.raises(SystemExit) as exit_:
        cli.main(["check", "--help"])
    assert exit_.value.code == 0
    assert capsys.readouterr().out.startswith("usage: python -m mlx_w8a8.check")


def test_pyproject_installs_a_script_per_command():
    tomllib = pytest.importorskip("tomllib")
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    scripts = project["scripts"]
    want = {f"mlx-w8a8-{name}": f"mlx_w8a8.{name}:{cli.entry_point(name)}"
            for name in cli.COMMANDS}
    want["mlx-w8a8"] = "mlx_w8a8.__main__:main"
    assert scripts == want
    for target in scripts.values():  # each names a function that exists
        module, func = target.split(":")
        assert callable(getattr(importlib.import_module(module), func)), target
