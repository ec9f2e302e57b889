"""benchmarks/file_cpu.py: the machine's busy time grows with work; a bad path is refused."""

import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
spec = importlib.util.spec_from_file_location("file_cpu", ROOT / "benchmarks" / "file_cpu.py")
file_cpu = importlib.util.module_from_spec(spec)
spec.loader.exec_module(file_cpu)


def test_busy_time_counts_this_process_work():
    before = file_cpu.busy_seconds()
    total = sum(i * i % 7 for i in range(3_000_000))  # about 0.3 s of CPU
    assert total > 0 and file_cpu.busy_seconds() - before >= 0.1


def test_a_missing_file_is_refused_with_the_usage(capsys):
    assert file_cpu.main(["tests/no_such_test.py"]) == 2
    assert "usage: file_cpu.py" in capsys.readouterr().err
    assert file_cpu.main([]) == 2


def test_the_speed_loop_runs_on_globals_as_the_figures_in_the_docs_were_taken():
    """Inside a function the loop's names are fast locals and it takes about half as long: the
    host speeds quoted in docs/ci.md (3.3-4.8 s) would then read as 1.7-2.4 s."""
    assert {"i", "total"} <= set(file_cpu.SPEED_LOOP.co_names)
    assert file_cpu.SPEED_LOOP.co_varnames == ()
