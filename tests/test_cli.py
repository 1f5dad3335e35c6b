"""``python -m celeritas run``: which arguments belong to run and which to the program."""
from __future__ import annotations

import sys

import pytest

import celeritas as cl
from celeritas.__main__ import main, split_run_argv


@pytest.mark.parametrize("argv, expected", [
    (["-n", "4", "-m", "apps.wave_sim", "-N", "2048", "-T", "200"],
     (["-n", "4"], "apps.wave_sim", True, ["-N", "2048", "-T", "200"])),
    (["-n", "4", "--devices", "host:2", "--", "python", "-m", "apps.nbody", "-N", "64"],
     (["-n", "4", "--devices", "host:2"], "apps.nbody", True, ["-N", "64"])),
    (["-n2", "prog.py", "-n", "7"], (["-n2"], "prog.py", False, ["-n", "7"])),
    (["--ranks=3", "--print", "--", "python3.11", "prog.py", "-v"],
     (["--ranks=3", "--print"], "prog.py", False, ["-v"])),
    ([ "--module=apps.hello", "-x"], ([], "apps.hello", True, ["-x"])),
    (["-n", "2", "--", sys.executable, "prog.py"], (["-n", "2"], "prog.py", False, [])),
    (["-n", "2"], (["-n", "2"], None, False, [])),
])
def test_run_arguments_after_the_program_belong_to_the_program(argv, expected):
    assert split_run_argv(argv) == expected


@pytest.mark.parametrize("argv, words", [
    (["-n", "2", "--bogus", "x.py"], "--bogus"),
    (["-n"], "-n needs a value"),
    (["-m"], "-m needs a module"),
    (["--", "python", "-m"], "python -m needs a module"),
])
def test_bad_run_arguments_raise_config_error(argv, words):
    with pytest.raises(cl.ConfigError, match=words):
        split_run_argv(argv)


def test_run_prints_the_mpiexec_command_with_program_options(capsys):
    rc = main(["run", "-n", "2", "--print", "-m", "apps.wave_sim", "-N", "64", "-T", "3"])
    out = capsys.readouterr().out.split()
    assert rc == 0
    assert out[-6:] == ["-m", "apps.wave_sim", "-N", "64", "-T", "3"]
    assert "-n" in out and out[out.index("-n") + 1] == "2"


def test_run_without_a_program_is_an_error_not_a_traceback(capsys):
    assert main(["run", "-n", "2"]) == 2
    assert "name a script" in capsys.readouterr().err
