"""dpcost.measure.preflight: what a run needs, checked before any rank starts."""

import os
import stat
import threading

import psutil
import pytest

from dpcost.measure import measure_traffic, preflight
from dpcost.measure.launch import warm_context


def test_the_estimate_is_the_largest_scenario_in_bytes():
    p = 1_000_000
    assert preflight.estimated_memory_bytes(p, 4, ["ddp"]) == 12 * p  # 3 P on each of 4 ranks
    assert preflight.estimated_memory_bytes(p, 4, ["dp"]) == 11 * p  # (n + 1) P + 2 P (n - 1)
    assert preflight.estimated_memory_bytes(p, 3, ["dp", "ddp-counted", "ddp#2"]) == 9 * p


def _peak_memory(stop, peaks):
    """Sample every process under this one: {pid: (peak USS, peak RSS)}. USS is memory only
    that process holds; RSS also counts the pages it shares with its forked children."""
    while not stop.is_set():
        for child in psutil.Process().children(recursive=True):
            try:
                info = child.memory_full_info()
            except psutil.Error:
                continue
            uss, rss = peaks.get(child.pid, (0, 0))
            peaks[child.pid] = (max(uss, info.uss), max(rss, info.rss))
        stop.wait(0.1)


def test_the_estimate_is_a_lower_bound_of_what_a_real_run_holds():
    # Peak RSS growth per rank, measured, must be at least the tensors the estimate counts; the
    # ranks' own baseline and the warm process at least what RANK_BASELINE_BYTES and
    # LAUNCHER_BYTES say, sampled beside the run every 0.1 s. The warm process is read by its
    # RSS: while the helper and the ranks run, they share its pages, so its USS is small (28 MB
    # in one run); what it holds is what they share.
    from multiprocessing import forkserver

    warm = warm_context() and forkserver._forkserver._forkserver_pid  # CPython's own field
    stop, peaks = threading.Event(), {}
    sampler = threading.Thread(target=_peak_memory, args=(stop, peaks))
    sampler.start()
    try:
        report = measure_traffic(world_size=2, model_bytes=4e6, steps=2,
                                 scenarios=("ddp", "dp"))
    finally:
        stop.set()
        sampler.join()
    p = report["param_bytes"]
    for scenario in ("ddp", "dp"):
        measured = sum(row["peak_memory_bytes"] for row in report["scenarios"][scenario])
        assert measured >= preflight.estimated_memory_bytes(p, 2, [scenario]), scenario
    assert peaks[warm][1] >= preflight.LAUNCHER_BYTES["forked"], peaks[warm]
    private = sorted((uss for pid, (uss, _) in peaks.items() if pid != warm), reverse=True)
    assert private[1] >= preflight.RANK_BASELINE_BYTES["forked"], private[:3]  # both ranks


def test_memory_available_is_read_from_proc_meminfo(tmp_path):
    meminfo = tmp_path / "meminfo"
    meminfo.write_text("MemTotal:       100 kB\nMemAvailable:    2048 kB\n")
    assert preflight.memory_available_bytes(str(meminfo)) == 2048 * 1024
    assert preflight.memory_available_bytes(str(tmp_path / "missing")) is None
    if os.path.exists("/proc/meminfo"):
        assert preflight.memory_available_bytes() > 0


def test_a_run_that_cannot_fit_names_the_estimate_and_what_is_available():
    # 6 GB of tensors + the warm process (200 MB) + 2 ranks of 18 MB
    with pytest.raises(ValueError, match=r"^--model-mb: .* needs at least 6.236 GB of memory on "
                                         r"2 local ranks \(ddp\), but this machine has 1 GB "
                                         r"available"):
        preflight.check_memory(1e9, 2, ["ddp"], available=1e9)
    preflight.check_memory(1e6, 2, ["ddp"], available=1e9)  # fits: no error


def test_too_many_ranks_are_blamed_on_world_size_with_what_fits():
    # 1 GB: the warm process (200 MB) leaves room for 44 forked ranks of 18 MB, or 4 under
    # torchrun at 220 MB each (its agent runs already)
    with pytest.raises(ValueError, match=r"^--world-size: 45 local ranks .* at most 44 ranks"):
        preflight.check_memory(1e6, 45, ["ddp"], available=1e9)
    preflight.check_memory(250_000, 40, ["ddp"], available=1e9)
    with pytest.raises(ValueError, match=r"^--world-size: 5 local ranks .* at most 4 ranks"):
        preflight.check_memory(1e6, 5, ["ddp"], available=1e9, forked=False)


def test_an_estimate_beyond_a_float_is_refused_not_raised():
    with pytest.raises(ValueError, match=r"^--model-mb: .* needs more than 1.8e\+308 B"):
        preflight.check_memory(4 * 16 * (10**153) ** 2, 4, ["ddp"], available=1e9)


def test_nccl_needs_a_gpu_per_rank():
    with pytest.raises(ValueError, match=r"^--backend nccl needs CUDA GPUs; found 0$"):
        preflight.check_gpus(0, 2)
    with pytest.raises(ValueError, match=r"^--backend nccl needs one CUDA GPU per local rank"):
        preflight.check_gpus(2, 4)
    preflight.check_gpus(4, 4)


def test_an_empty_path_is_refused_by_name():
    with pytest.raises(ValueError, match=r"^--plot needs a file name"):
        preflight.check_plot_path("")
    with pytest.raises(ValueError, match=r"^--trace needs a file name"):
        preflight.check_writable("", "--trace")


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
