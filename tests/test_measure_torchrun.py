"""dpcost.measure under torchrun: one node with two ranks, and two nodes with one rank each.

Both must pass every time: before the torch._dynamo import moved ahead of init_process_group,
a rank aborted at exit (SIGABRT) in about 1 run in 4 (see dpcost/measure/worker.py: run_rank).
benchmarks/repeat.py runs these K times and counts the failures.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

from dpcost.procs import free_port, scratch_tmpdir

ROOT = Path(__file__).resolve().parents[1]
TORCHRUN = Path(sys.executable).with_name("torchrun")
ARGS = ["--backend", "gloo", "--scenario", "ddp", "--model-mb", "1", "--steps", "5", "--json"]


def check_report(report):
    p = report["param_bytes"]
    assert report["world_size"] == 2 and p >= 1_000_000 and report["steps"] == 5
    for row in report["scenarios"]["ddp"]:
        assert row["counter"] == "tcp_info"
        assert row["hook_bytes"] == p
        for direction in ("sent", "received"):
            assert abs(row[f"{direction}_bytes"] / p - 1) < 0.005  # 2(n-1)/n P = P at n = 2
        assert row["peak_memory_bytes"] > 0


def json_lines(text):
    return [json.loads(line) for line in text.splitlines() if line.startswith("{")]


def test_one_node_two_ranks_report_and_every_gloo_thread_gone_after_destroy(tmp_path):
    with scratch_tmpdir() as scratch:  # torchrun's torchelastic_* log folder goes in here
        result = subprocess.run([str(TORCHRUN), "--standalone", "--nproc-per-node", "2",
                                 str(ROOT / "tests" / "torchrun_probe.py"), *ARGS],
                                capture_output=True, text=True, timeout=240, cwd=ROOT,
                                env={**os.environ, "DPCOST_PROBE_DIR": str(tmp_path),
                                     "TMPDIR": scratch})
        assert "torchelastic_" in [p.name[:13] for p in Path(scratch).iterdir()]
    assert not Path(scratch).exists()  # and went with it
    assert result.returncode == 0, result.stderr[-3000:]
    reports = json_lines(result.stdout)
    probes = [json.loads((tmp_path / f"rank{rank}.json").read_text()) for rank in (0, 1)]
    assert len(reports) == 1  # rank 0 prints the gathered report, rank 1 does not
    check_report(reports[0])
    assert [probe["probe_rank"] for probe in probes] == [0, 1]
    for probe in probes:
        assert probe["status"] == 0
        assert probe["gloo_threads_before_destroy"] > 0  # the count sees gloo's threads
        assert probe["gloo_threads_after_destroy"] == 0, probe


def test_two_nodes_one_rank_each_gather_one_report_and_both_agents_exit_0():
    with scratch_tmpdir() as scratch:  # the agents' torchelastic_* log folders go in here
        outputs, agents = _two_agents(scratch)
    for agent, (_, err) in zip(agents, outputs, strict=True):
        assert agent.returncode == 0, err[-3000:]
    reports = [line for out, _ in outputs for line in json_lines(out)]
    assert len(reports) == 1  # the rank that rendezvous made rank 0 prints, the other does not
    check_report(reports[0])


def _two_agents(scratch):
    port = free_port()
    agents = [subprocess.Popen(
        [str(TORCHRUN), "--nnodes", "2", "--node-rank", str(node), "--nproc-per-node", "1",
         "--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{port}",
         "--rdzv-id", f"dpcost-test-{port}", "-m", "dpcost.measure", *ARGS],
        cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1", "TMPDIR": scratch}) for node in (0, 1)]
    outputs = []
    try:
        for agent in agents:
            outputs.append(agent.communicate(timeout=240))
    finally:
        for agent in agents:
            if agent.poll() is None:
                agent.kill()
                agent.wait()
    return outputs, agents
