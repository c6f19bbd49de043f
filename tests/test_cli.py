"""The ``mlxlab`` command line: every command and subcommand answers ``--help``, each runnable
command has a handler, an unknown command fails with a message, and ``python -m mlxlab.cli``
runs the same entry point."""

import argparse
import subprocess
import sys
from pathlib import Path

import pytest

from mlxlab.cli import build_parser, main

ROOT = Path(__file__).resolve().parent.parent
EXPECTED = {"bench", "bench engine", "bench contention", "bench disagg", "bench scheduling", "bench speculation", "bench serve", "reproduce",
            "rescore", "rescore-warmup", "export-model", "bench http", "bench soak",
            "campaign", "campaign plan", "campaign run", "campaign collect",
            "paper", "profile", "validate-sim", "seed-scale", "train-tiny", "serve", "tune"}


def _subcommands(parser: argparse.ArgumentParser, path=()):
    """(path, parser) of every command under ``parser``, parents before their children."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield path + (name,), sub
                yield from _subcommands(sub, path + (name,))


COMMANDS = list(_subcommands(build_parser()))


def _has_subcommands(parser: argparse.ArgumentParser) -> bool:
    return any(isinstance(a, argparse._SubParsersAction) for a in parser._actions)


def test_the_parser_has_every_command():
    assert {" ".join(path) for path, _ in COMMANDS} == EXPECTED


@pytest.mark.parametrize("path", [()] + [p for p, _ in COMMANDS], ids=lambda p: " ".join(p) or "mlxlab")
def test_help_exits_zero(path, capsys):
    with pytest.raises(SystemExit) as exc:
        build_parser().parse_args([*path, "--help"])
    assert exc.value.code == 0
    assert capsys.readouterr().out.startswith(f"usage: {' '.join(('mlxlab',) + path)}")


@pytest.mark.parametrize("path", [p for p, sub in COMMANDS if not _has_subcommands(sub)], ids=" ".join)
def test_every_runnable_command_has_a_handler(path):
    sub = dict(COMMANDS)[path]
    assert callable(sub.get_default("func")), f"mlxlab {' '.join(path)} sets no func"


def test_an_unknown_command_fails_with_a_message(capsys, monkeypatch):
    monkeypatch.setenv("MLXLAB_NO_REEXEC", "1")
    with pytest.raises(SystemExit) as exc:
        main(["no-such-command"])
    assert exc.value.code != 0
    err = capsys.readouterr().err
    assert "invalid choice" in err and "no-such-command" in err


def test_python_dash_m_runs_the_command():
    out = subprocess.run([sys.executable, "-m", "mlxlab.cli", "--help"], cwd=ROOT, capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("usage: mlxlab")
    for name in ("bench", "reproduce", "paper", "profile", "validate-sim", "seed-scale", "train-tiny"):
        assert name in out.stdout


def test_importing_the_cli_loads_no_mlx():
    """main() restarts the process with the fast BLAS before anything loads mlx, so importing the
    command's modules must not load it."""
    code = ("import sys, mlxlab.cli; "
            "print(sorted(m for m in sys.modules if m.split('.')[0] in ('mlx', 'mlx_lm')))")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"
