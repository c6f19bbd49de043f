"""The busy-profile probe: bad load settings are refused before any load starts, and the command
line it stores in the profile reads back as the probe's own in the paper's provenance table."""

import pytest

from mlxlab.paper.provenance import _from_argv
from probes import busy_profile


@pytest.mark.parametrize("argv, word", [(["--on-s", "0"], "--on-s"), (["--off-s", "-1"], "--off-s"),
                                        (["--load-procs", "0"], "--load-procs"), (["--repeats", "0"], "--repeats")])
def test_bad_load_settings_are_refused_with_the_option_named(argv, word, capsys):
    with pytest.raises(SystemExit) as e:
        busy_profile.parse_args(argv)
    assert e.value.code == 2
    assert word in capsys.readouterr().err


def test_the_stored_command_line_reads_back_as_the_probe():
    argv = ["probes/busy_profile.py", "--load-procs", "1"]
    assert _from_argv(argv) == "python -m probes.busy_profile --load-procs 1"
