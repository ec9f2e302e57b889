"""dpcost.measure.preflight: what a run needs, checked before any rank starts."""

import os
import stat

import pytest

from dpcost.measure import measure_traffic, preflight


def test_the_estimate_is_the_largest_scenario_in_bytes():
    p = 1_000_000
    assert preflight.estimated_memory_bytes(p, 4, ["ddp"]) == 12 * p  # 3 P on each of 4 ranks
    assert preflight.estimated_memory_bytes(p, 4, ["dp"]) == 11 * p  # (n + 1) P + 2 P (n - 1)
    assert preflight.estimated_memory_bytes(p, 3, ["dp", "ddp-counted", "ddp#2"]) == 9 * p


def test_the_estimate_is_a_lower_bound_of_what_a_real_run_holds():
    # Peak RSS growth per rank, measured, must be at least the tensors the estimate counts.
    report = measure_traffic(world_size=2, model_bytes=4e6, steps=2, scenarios=("ddp", "dp"))
    p = report["param_bytes"]
    for scenario in ("ddp", "dp"):
        measured = sum(row["peak_memory_bytes"] for row in report["scenarios"][scenario])
        assert measured >= preflight.estimated_memory_bytes(p, 2, [scenario]), scenario


def test_memory_available_is_read_from_proc_meminfo(tmp_path):
    meminfo = tmp_path / "meminfo"
    meminfo.write_text("MemTotal:       100 kB\nMemAvailable:    2048 kB\n")
    assert preflight.memory_available_bytes(str(meminfo)) == 2048 * 1024
    assert preflight.memory_available_bytes(str(tmp_path / "missing")) is None
    if os.path.exists("/proc/meminfo"):
        assert preflight.memory_available_bytes() > 0


def test_a_run_that_cannot_fit_names_the_estimate_and_what_is_available():
    with pytest.raises(ValueError, match=r"needs at least 6 GB of memory on 2 local ranks "
                                         r"\(ddp\), but this machine has 1 GB available"):
        preflight.check_memory(1e9, 2, ["ddp"], available=1e9)
    preflight.check_memory(1e6, 2, ["ddp"], available=1e9)  # fits: no error


@pytest.mark.parametrize("value", [float("inf"), float("-inf"), float("nan")])
def test_model_mb_must_be_finite(value):
    with pytest.raises(ValueError, match="--model-mb must be a finite number"):
        preflight.check_model_mb(value)


def test_plot_paths_that_cannot_be_written_are_refused(tmp_path):
    preflight.check_plot_path(str(tmp_path / "fine.png"))
    assert not (tmp_path / "fine.png").exists()  # the check creates nothing
    with pytest.raises(ValueError, match="does not exist"):
        preflight.check_plot_path(str(tmp_path / "missing" / "x.png"))
    with pytest.raises(ValueError, match="is a folder"):
        preflight.check_plot_path(str(tmp_path))
    with pytest.raises(ValueError, match=r"cannot write \.foo files"):
        preflight.check_plot_path(str(tmp_path / "x.foo"))
    locked = tmp_path / "locked"
    locked.mkdir()
    locked.chmod(stat.S_IRUSR | stat.S_IXUSR)
    try:
        if os.geteuid() != 0:  # root may write anywhere
            with pytest.raises(ValueError, match="not writable"):
                preflight.check_plot_path(str(locked / "x.png"))
    finally:
        locked.chmod(stat.S_IRWXU)
