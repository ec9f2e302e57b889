"""dpcost.migration: the comparison in words, the runners' clean-up, and every course case run
for real under one torchrun of 2 gloo ranks (equivalent cases agree, each bug is named)."""

import os
import sys
import time

import psutil
import pytest

from dpcost import migration as m


def result(params, sample_ids, checksums=None, writes=0):
    checksums = checksums or [1.0] * len(sample_ids)
    return {"params": params, "sample_ids": sample_ids, "rank_checksums": checksums,
            "checkpoint_writes": writes, "samples_per_rank": [sum(map(len, r)) for r in sample_ids]}


REF = result([1.0, 2.0], [[[0, 1, 2, 3], [3, 2, 1, 0]]], writes=2)


def test_diagnose_equivalent_run_has_no_findings():
    ddp = result([1.0, 2.0 + 1e-7], [[[0, 2], [3, 1]], [[1, 3], [2, 0]]], writes=2)
    assert m.diagnose(REF, ddp) == []


def test_diagnose_names_each_mistake():
    same = result([1.0, 2.0], [[[0, 1, 2, 3], [3, 2, 1, 0]]] * 2)
    assert "did you use a DistributedSampler?" in m.diagnose(REF, same)[0]
    frozen = result([1.0, 2.0], [[[0, 2], [0, 2]], [[1, 3], [1, 3]]])
    assert any("set_epoch" in f for f in m.diagnose(REF, frozen))
    padded = result([1.0, 2.0], [[[0, 2, 1], [3, 1, 0]], [[3, 0], [2, 3]]])
    assert "1 seen twice" in m.diagnose(REF, padded)[0]
    apart = result([1.0, 2.0], [[[0, 2], [3, 1]], [[1, 3], [2, 0]]], checksums=[1.0, 1.5])
    assert "different parameters" in m.diagnose(REF, apart)[0]
    assert "forward run outside no_sync()" in m.diagnose(REF, apart)[0]  # the forward decides
    writes = result([1.0, 2.0], [[[0, 2], [3, 1]], [[1, 3], [2, 0]]], writes=4)
    assert "written 4 times, 2 in one process" in m.diagnose(REF, writes)[0]
    off = result([1.0, 2.1], [[[0, 2], [3, 1]], [[1, 3], [2, 0]]], writes=2)
    (finding,) = m.diagnose(REF, off)
    assert "up to 0.1" in finding and "mean, not sum" in finding


def test_max_param_diff_and_bad_inputs():
    assert m.max_param_diff(REF, result([1.0, 2.5], [[[0]]])) == 0.5
    assert m.max_param_diff(REF, result([1.0], [[[0]]])) == float("inf")
    with pytest.raises(ValueError, match="name must be an example script"):
        m.load_script("nope")
    with pytest.raises(TypeError, match="cases must be"):
        m.run_dp([])
    with pytest.raises(TypeError, match=r"cases\['a'\] must be a list of str"):
        m.run_ddp({"a": "--epochs 1"})
    with pytest.raises(ValueError, match="nproc must be an int"):
        m.torchrun_command(0, [])
    with pytest.raises(ValueError, match="names must be among"):
        m.compare_cases(names=["plain", "typo"])


def _descendants():
    # Compared before and after, not with []: earlier tests in the same session may have
    # started helpers that live for the session (multiprocessing's resource tracker).
    return {p.pid for p in psutil.Process().children(recursive=True)}


def test_a_hung_run_is_killed_with_its_children():
    code = ("import subprocess, time; subprocess.Popen(['sleep', '60']); time.sleep(60)")
    before = _descendants()
    started = time.monotonic()
    with pytest.raises(m.MigrationRunError, match="timed out after 1 s"):
        m._run([sys.executable, "-c", code], timeout_s=1)
    assert time.monotonic() - started < 10
    assert _descendants() - before == set()


def test_a_failing_run_reports_its_output():
    with pytest.raises(m.MigrationRunError, match="exit status 3(.|\n)*boom"):
        m._run([sys.executable, "-c", "import sys; print('boom'); sys.exit(3)"], timeout_s=30)


@pytest.fixture(scope="module")
def rows():
    """Every course case: one process, then DDP on 2 gloo ranks under ONE torchrun."""
    before = _descendants()
    rows = {row["case"]: row for row in m.compare_cases(nproc=2)}
    assert _descendants() - before == set()  # torchrun, its agent and the ranks are all gone
    # a rank in a session of its own may have lost its parent link: look for ours by command
    # line and folder (another checkout's run may be going on beside this one)
    assert not [p for p in psutil.process_iter(["cmdline", "cwd"])
                if "dpcost.migration" in " ".join(p.info["cmdline"] or [])
                and p.info["cwd"] == str(m.ROOT) and p.pid != os.getpid()]
    return rows


@pytest.mark.parametrize("case", ["plain", "accumulation", "uneven_drop_last"])
def test_ddp_equals_one_process(rows, case):
    row = rows[case]
    assert row["findings"] == [] and row["max_param_diff"] <= m.DEFAULT_ATOL
    assert row["result"]["rank_checksums"][0] == row["result"]["rank_checksums"][1]
    assert sum(row["samples_per_rank"]) == row["reference_samples"]
    assert abs(row["result"]["final_loss"] - row["reference_result"]["final_loss"]) < 1e-5


def test_accumulation_saves_once_per_epoch_and_reads_back(rows):
    result = rows["accumulation"]["result"]
    assert result["checkpoint_writes"] == 3 and result["checkpoint_ok"] is True


def test_uneven_dataset_is_padded_by_distributed_sampler(rows):
    row = rows["uneven"]  # 51 samples on 2 ranks: 26 each, one sample twice per epoch
    assert row["samples_per_rank"] == [3 * 26, 3 * 26] and row["reference_samples"] == 3 * 51
    assert "1 seen twice" in row["findings"][0]
    assert rows["uneven_drop_last"]["samples_per_rank"] == [3 * 24, 3 * 24]  # 48 of 51 kept


def test_batchnorm_on_cpu_differs_per_rank_statistics(rows):
    row = rows["batchnorm"]  # SyncBatchNorm raises on CPU: each rank normalises over its 8
    assert row["max_param_diff"] > 1e-3
    assert len(row["findings"]) == 1 and "BatchNorm" in row["findings"][0]


@pytest.mark.parametrize("case, words", [
    ("bug_no_sampler", "rank 0 and rank 1 saw the same samples"),
    ("bug_no_set_epoch", "same order in every epoch"),
    ("bug_summed_loss", "mean, not sum"),
    ("bug_save_every_rank", "written 6 times, 3 in one process"),
    ("bug_no_final_sync", "the ranks ended with different parameters"),
])
def test_each_bug_is_detected_by_the_same_comparison(rows, case, words):
    assert any(words in finding for finding in rows[case]["findings"]), rows[case]["findings"]


def test_render_rows(rows):
    text = m.render_rows(list(rows.values()))
    assert "plain" in text and "same as one process" in text and "DIFFERENT" in text


def test_script_diff_shows_the_migration_without_the_bug_flags():
    import ast

    diff = m.script_diff()
    assert diff[:2] == ["--- examples/train_dp.py", "+++ examples/train_ddp.py"]
    added = [line[1:] for line in diff if line.startswith("+") and not line.startswith("+++")]
    assert not [line for line in added if "bug" in line.lower()]
    for needed in ("dist.init_process_group(backend)", "torch.cuda.set_device(local_rank)",
                   "DistributedSampler(dataset", "sampler.set_epoch(epoch)", "ddp.no_sync()",
                   "dist.barrier()", "dist.destroy_process_group()",
                   "nn.SyncBatchNorm.convert_sync_batchnorm(model)", "map_location"):
        assert any(needed in line for line in added), needed
    # Without its bug lines the DDP script is still valid Python: the migration alone.
    source = (m.EXAMPLES / "train_ddp.py").read_text().splitlines()
    ast.parse("\n".join(line for line in source if "bug" not in line.lower()))
    assert len(m.script_diff(without_bugs=False)) > len(diff)


def test_killing_the_caller_takes_torchrun_and_its_ranks_along(tmp_path):
    """SIGKILL the process that called run_ddp: torchrun and both ranks must go too."""
    import signal
    import subprocess

    code = ("from dpcost import migration as m\n"
            "m.run_ddp({'slow': ['--no-batchnorm', '--epochs', '100000']}, nproc=2)\n")
    # A process killed by SIGKILL cannot remove its temporary folder: keep it in tmp_path.
    caller = subprocess.Popen([sys.executable, "-c", code], cwd=m.ROOT,
                              env={**os.environ, "TMPDIR": str(tmp_path)})
    deadline = time.monotonic() + 120
    ranks = []
    while time.monotonic() < deadline and len(ranks) < 2:
        time.sleep(0.5)
        ranks = [p for p in psutil.Process(caller.pid).children(recursive=True)
                 if "dpcost.migration" in " ".join(p.cmdline()) and "torchrun" not in
                 " ".join(p.cmdline())]
    assert len(ranks) == 2, "the ranks did not start"
    family = psutil.Process(caller.pid).children(recursive=True)
    caller.send_signal(signal.SIGKILL)
    caller.wait()
    gone, alive = psutil.wait_procs(family, timeout=20)
    assert alive == []
    assert not [p for p in psutil.process_iter(["cmdline"])  # nothing of ours, anywhere
                if "dpcost.migration" in " ".join(p.info["cmdline"] or [])]


def test_rounded_shows_floats_to_four_significant_digits_and_keeps_the_rest():
    line = {"final_loss": 0.3781767189502716, "param_checksum": 125.73381007976423,
            "samples_per_rank": [288], "steps": 18, "checkpoint_ok": None,
            "rank_checksums": [1.23456789, 2.0], "nested": {"x": 1.0e-7 + 1e-15}}
    shown = m.rounded(line)
    assert shown == {"final_loss": 0.3782, "param_checksum": 125.7, "samples_per_rank": [288],
                     "steps": 18, "checkpoint_ok": None, "rank_checksums": [1.235, 2.0],
                     "nested": {"x": 1e-07}}
    assert line["final_loss"] == 0.3781767189502716  # the line itself is left as it was
    assert m.rounded(line, digits=2)["param_checksum"] == 130.0
