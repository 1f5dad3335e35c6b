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


def _help(capsys, *argv: str) -> str:
    with pytest.raises(SystemExit) as info:
        main([*argv, "--help"])
    assert info.value.code == 0
    return " ".join(capsys.readouterr().out.split())


def test_graphs_help_says_what_dir_is_and_what_it_writes(capsys):
    text = _help(capsys, "graphs")
    assert "DIR is the folder a run wrote at shutdown with CELERITAS_PRINT_GRAPHS=DIR" in text
    for name in ("task_graph.dot", "command_graph.dot", "instruction_graph_rank{R}.dot", ".json"):
        assert name in text
    assert "rendered with Graphviz's `dot` to an .svg beside it" in text
    assert ("exit status: 0 all rendered; 1 no `dot`, no .dot file in DIR, or a render failed (an empty .dot "
            "file too); 2 DIR does not exist or is not a folder") in text


def test_graphs_exit_statuses_are_the_ones_its_help_gives(tmp_path, capsys):
    assert main(["graphs", str(tmp_path / "missing")]) == 2
    assert main(["graphs", str(tmp_path)]) == 1          # no .dot files
    assert "no .dot files" in capsys.readouterr().err


def test_trace_help_says_what_trace_is_and_what_it_draws(capsys):
    text = _help(capsys, "trace")
    assert "TRACE is the Chrome trace-event file a run wrote at shutdown with CELERITAS_TRACE=TRACE" in text
    for words in (".png (needs Pillow), .svg, or a self-contained .html", "one row per rank and executor lane",
                  "from every send to the receive"):
        assert words in text
    assert "trace" in _help(capsys) and "graphs" in _help(capsys)


def test_info_says_what_the_host_allocator_setting_does(monkeypatch, capsys):
    """``celeritas info`` names the C library and what CELERITAS_HOST_ALLOCATOR does with it."""
    import platform as pf

    from celeritas.runtime import host_allocator_status
    tuned, default = host_allocator_status("tuned"), host_allocator_status("default")
    if pf.libc_ver()[0] == "glibc":
        version = pf.libc_ver()[1]
        assert tuned.startswith(f"glibc {version}: tuned by the first runtime of a process")
        assert default == f"glibc {version}: malloc left alone (CELERITAS_HOST_ALLOCATOR=default)"
    else:
        assert tuned == default and tuned.startswith("not glibc")
    monkeypatch.setenv("COLUMNS", "300")
    monkeypatch.setenv("CELERITAS_HOST_ALLOCATOR", "default")
    main(["info"])
    out = capsys.readouterr().out
    assert "host allocator" in out and default in out


def test_info_says_what_the_huge_page_setting_does_under_the_kernel_mode():
    from celeritas.__main__ import huge_page_status
    two_mib = 2 << 20
    assert huge_page_status(None, "madvise") == "off (CELERITAS_HUGE_PAGES=off); kernel THP mode: madvise"
    assert huge_page_status(two_mib, "madvise") == ("host allocations from 2 MiB: 2 MiB-aligned, their whole "
                                                    "2 MiB pages huge (kernel THP mode: madvise)")
    assert huge_page_status(two_mib, "never").endswith("the kernel's THP mode is never: all on 4 KiB pages")
    assert huge_page_status(0, "always").startswith("every host allocation: ")
    assert huge_page_status(3_000_000, "always").startswith("host allocations from 3000000 bytes: ")
    assert huge_page_status(two_mib, None).endswith("no transparent huge pages on this system")
