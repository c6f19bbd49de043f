"""A user's mistakes get a one-line error that says what was wrong and what to do, and lose
nothing: the engine serves the next request, and the CLI prints no traceback."""

import subprocess
import sys
from pathlib import Path

import pytest

from mlxlab import Engine
from mlxlab.cli import build_parser, main
from mlxlab.engine.prefix_cache import PrefixCache

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("prompt, match", [([1, 2.5, 3], r"prompt_tokens\[1\] is 2.5"), ([1, True], "integers"),
                                           (["7"], "integers"), ([], "empty prompt"), ([1, 10**9], "outside")])
def test_bad_token_ids_are_refused_and_the_engine_still_serves(tiny, prompt, match):
    eng = Engine(tiny)
    with pytest.raises(ValueError, match=match):
        eng.submit(prompt, 4)
    assert eng.requests == [] and not eng.has_work
    r = eng.submit([1, 2, 3], 3)
    eng.run()
    assert r.done and len(r.output_tokens) == 3


def test_integer_token_ids_of_any_integer_type_are_accepted(tiny):
    import numpy as np
    eng = Engine(tiny)
    r = eng.submit(np.array([4, 5, 6], dtype=np.int64), 2)
    eng.run()
    assert r.prompt == [4, 5, 6] and r.done


@pytest.mark.parametrize("kw", [dict(max_tokens=-1), dict(max_bytes=-5), dict(disk_max_bytes=-1),
                                dict(max_tokens=2.5), dict(max_tokens=True)])
def test_prefix_cache_refuses_negative_or_fractional_sizes(kw):
    with pytest.raises(ValueError, match="non-negative whole number"):
        PrefixCache(**kw)


@pytest.mark.parametrize("argv", [["bench", "engine", "--repeats", "0"], ["bench", "engine", "--repeats", "x"],
                                  ["bench", "contention", "--doc-tokens", "-3"]])
def test_the_cli_refuses_sizes_below_one_in_one_line(argv, capsys, monkeypatch):
    monkeypatch.setenv("MLXLAB_NO_REEXEC", "1")
    with pytest.raises(SystemExit) as exc:
        build_parser().parse_args(argv)
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert "must be" in err and "Traceback" not in err


def test_an_unknown_model_is_one_line_at_the_cli(monkeypatch, capsys):
    monkeypatch.setenv("MLXLAB_NO_REEXEC", "1")
    code = main(["bench", "engine", "--models", "no-such-model", "--repeats", "2", "--platform", "scratch-test"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and "no-such-model" in err[0] and err[0].startswith("mlxlab bench: error:")


def test_every_option_of_every_command_shows_its_default():
    out = subprocess.run([sys.executable, "-m", "mlxlab.cli", "bench", "engine", "--help"], capture_output=True,
                         text=True, cwd=ROOT, env={"MLXLAB_NO_REEXEC": "1", "PATH": "/usr/bin:/bin", "COLUMNS": "250"})
    assert out.returncode == 0
    assert "(default: 5)" in out.stdout and "(default: ['small'])" in out.stdout


def test_a_loaded_model_prints_as_one_line(tiny):
    text = repr(tiny)
    assert "\n" not in text and text.startswith("LoadedModel('tiny'") and "params" in text and len(text) < 120


def test_importing_the_engine_without_openblas_warns_with_the_fix():
    """A plain `python script.py` on Linux does not preload OpenBLAS: the first import of the
    engine says so and names the command that fixes it (and says nothing once it is loaded)."""
    from mlxlab.core.environment import find_openblas
    if not sys.platform.startswith("linux") or find_openblas() is None:
        pytest.skip("needs Linux with a system OpenBLAS")
    env = {"PATH": "/usr/bin:/bin", "MLXLAB_NO_REEXEC": "1"}
    code = "import mlxlab.engine"
    slow = subprocess.run([sys.executable, "-W", "always", "-c", code], capture_output=True, text=True, cwd=ROOT, env=env)
    assert slow.returncode == 0 and "bundled reference BLAS" in slow.stderr and "LD_PRELOAD=" in slow.stderr
    fast = subprocess.run([sys.executable, "-W", "always", "-c", code], capture_output=True, text=True, cwd=ROOT,
                          env={**env, "LD_PRELOAD": find_openblas()})
    assert fast.returncode == 0 and "bundled reference BLAS" not in fast.stderr
