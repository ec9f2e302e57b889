"""Exercise 3's checker: a right migration passes, a stub and each mistake fail with the right
words, exceptions, hangs and dying ranks are reported, results are JSON, nothing is left."""

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil
import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader
from torch.utils.data.distributed import DistributedSampler

from dpcost.exercises import MASTER_DIR
from dpcost.exercises import migrate_check as mc
from dpcost.exercises.migrate_check import ShuffleEachEpoch, make_model

SETTING = mc.SETTINGS[mc.CHECK_SETTING]


def migration(bug=""):
    """A train_ddp with one mistake put in (none for bug="")."""

    def train_ddp(dataset, epochs=2, global_batch=8, seed=0, checkpoint="checkpoint.pt"):
        if bug == "stub":
            raise NotImplementedError("train_ddp is not written yet")
        dist.init_process_group("gloo")
        try:
            rank, world_size = dist.get_rank(), dist.get_world_size()
            torch.manual_seed(seed)
            model = make_model()
            ddp = DDP(model)
            optimizer = torch.optim.SGD(ddp.parameters(), lr=0.1)
            sampler = DistributedSampler(dataset, seed=seed)
            if bug == "no_sampler":
                sampler = ShuffleEachEpoch(dataset, seed)
            batch = global_batch if bug == "global_batch" else global_batch // world_size
            loader = DataLoader(dataset, batch_size=batch, sampler=sampler)
            for epoch in range(epochs):
                if bug != "no_set_epoch":
                    sampler.set_epoch(epoch)
                for x, y in loader:
                    output = model(x) if bug == "no_ddp_forward" else ddp(x)
                    reduction = "sum" if bug == "summed_loss" else "mean"
                    loss = F.cross_entropy(output, y, reduction=reduction)
                    optimizer.zero_grad()
                    loss.backward()
                    optimizer.step()
                    if bug == "dies" and rank == 1:
                        os._exit(3)
                    if bug == "killed" and rank == 1:
                        os.kill(os.getpid(), 9)
                    if bug == "hangs" and rank == 0:
                        while True:
                            time.sleep(0.1)
            if rank == 0 or bug == "save_every_rank":
                torch.save(model.state_dict(), checkpoint)
            dist.barrier()
            if bug == "raises" and rank == 1:
                raise KeyError("oops")
            return ddp if bug == "returns_ddp" else model
        finally:
            if bug != "no_destroy":
                dist.destroy_process_group()

    return train_ddp


def children():
    # Compared before and after: an earlier test may have left a session-long helper
    # (multiprocessing's resource tracker) that is not ours to judge here.
    return {c.pid for c in psutil.Process().children(recursive=True)}


def verdict(bug, timeout=mc.DEFAULT_TIMEOUT):
    before = children()
    data = mc.run(migration(bug), SETTING, timeout)
    json.dumps(data)  # plain data, all of it
    assert children() - before == set()  # child and ranks all gone
    return mc.judge(data, SETTING)


def failing(v):
    return {aspect: why for aspect, why in v.items() if why}


@pytest.mark.parametrize("bug", ["", "returns_ddp"])
def test_a_right_migration_passes_everything(bug):
    assert failing(verdict(bug)) == {}


@pytest.mark.parametrize("bug, aspect, words", [
    ("stub", "runs", "not written yet (it still raises NotImplementedError)"),
    ("no_sampler", "split", "rank 0 and rank 1 saw the same samples: did you use a "
                            "DistributedSampler?"),
    ("no_set_epoch", "reshuffle", "did you call sampler.set_epoch(epoch)"),
    ("global_batch", "batch", "each rank's batches held [8] samples; a global batch of 8 on 2 "
                              "ranks is 4 per rank"),
    ("no_ddp_forward", "sync", "rank 0 and rank 1 ended with different parameters"),
    ("summed_loss", "params", "look at the loss"),
    ("save_every_rank", "checkpoint", "written by ranks [0, 1]: save on rank 0 only"),
    ("no_destroy", "cleanup", "left the process group initialized"),
    ("raises", "runs", "rank 1 raised KeyError: 'oops' at line"),
    ("dies", "runs", "rank 1 exited with status 3 before returning"),
    ("killed", "runs", "rank 1 was killed by signal SIGKILL before returning"),
])
def test_each_mistake_fails_with_its_reason(bug, aspect, words):
    v = failing(verdict(bug))
    assert words in v.get(aspect, ""), v
    if aspect in ("split", "reshuffle", "batch", "sync", "checkpoint", "cleanup"):
        # named for what it is, nothing else (a checkpoint counts once the ranks agree)
        assert set(v) <= {aspect, "params"} | ({"checkpoint"} if aspect == "sync" else set()), v


def test_a_hanging_rank_is_stopped_and_named():
    started = time.monotonic()
    v = failing(verdict("hangs", timeout=4))
    assert time.monotonic() - started < 30
    assert "rank 0 did not finish within 4 s" in v["runs"], v
    # where, from the rank's stack dump: the loop's sleep (or its `while`, between two sleeps)
    sleep = next(n for n, line in enumerate(open(__file__), 1) if "time.sleep(0.1)" in line)
    assert any(f"(it was at line {n} of train_ddp)" in v["runs"] for n in (sleep, sleep - 1)), v
    assert v["split"] == "not checked: the run did not finish"


def test_check_and_submit_reports():
    before = children()
    report = mc.check(migration())
    assert report.all_passed and report.total == len(mc.ASPECTS)
    stub = mc.submit(migration("stub"))
    assert stub.total == 2 * len(mc.ASPECTS) and stub.passed == 0
    assert "not written yet" in str(stub)
    assert children() - before == set()


def test_bad_arguments_name_the_problem():
    with pytest.raises(TypeError, match="pass your function itself"):
        mc.check(42)
    with pytest.raises(ValueError, match="dpcost package's own"):
        mc.check(mc.train_dp)

    def train(dataset, **kwargs):
        return None

    for checker in (mc.check, mc.submit):  # neither takes name=, so neither offers it
        with pytest.raises(ValueError, match="must be named one of train_ddp") as refused:
            checker(train)
        assert "name=" not in str(refused.value)
    with pytest.raises(ValueError, match="timeout must be a number of seconds > 0"):
        mc.run(migration(), SETTING, timeout=0)


def test_hints_one_at_a_time(capsys):
    mc.hint(2)
    assert capsys.readouterr().out.startswith("Hint 2/4 for train_ddp: ")
    with pytest.raises(ValueError, match="k must be a hint number from 1 to 4"):
        mc.hint(5)
    box = mc.hint_button()
    box.reveal()
    assert box.revealed == 1 and "init_process_group" in box.children[1].value
    for _ in range(5):
        box.reveal()
    assert box.revealed == 4 and box.children[0].disabled
    for text in mc.HINTS:
        assert "def " not in text and "\n" not in text and "for x" not in text


# ---- Attacks and loaders (issue 23, section 1; issue 22, section 2) ---------------------------

def sandbox_processes(uid: int) -> list[int]:
    """Processes of the sandbox's ``uid`` still alive (only that sandbox's: other tests may
    run sandboxes meanwhile)."""
    return [p.pid for p in psutil.process_iter(["uids", "status"])
            if p.info["uids"] and p.info["uids"].real == uid
            and p.info["status"] != psutil.STATUS_ZOMBIE]


def forger(dataset, epochs=2, global_batch=8, seed=0, checkpoint="checkpoint.pt"):
    """Writes a made-up report to every pipe it can find, and kills its parent."""
    report = {"ok": True, "ranks": {str(r): {"rank": r, "status": "returned", "params": [0.0],
                                             "batches": [[0]], "saves": 1 - r,
                                             "left_initialized": False} for r in range(2)}}
    for fd in range(3, 64):
        try:
            os.write(fd, json.dumps(report).encode())
        except OSError:
            pass
    for target in (os.getppid(), 1):
        try:
            os.kill(target, 9)
        except OSError:
            pass
    return None


def setsid_holder(dataset, epochs=2, global_batch=8, seed=0, checkpoint="checkpoint.pt"):
    """A right migration that leaves a grandchild in a session of its own, holding the pipes."""
    if os.fork() == 0:
        os.setsid()
        time.sleep(120)
        os._exit(0)
    return migration()(dataset, epochs, global_batch, seed, checkpoint)


def built_in_a_helper(dataset, epochs=2, global_batch=8, seed=0, checkpoint="checkpoint.pt"):
    """A right migration whose DDP, loader and process group live in a helper's frame: freed
    when the helper returns, DDP's reducer would join gloo's thread with the GIL held."""
    return migration()(dataset, epochs, global_batch, seed, checkpoint)


def with_workers(dataset, epochs=2, global_batch=8, seed=0, checkpoint="checkpoint.pt"):
    """A right migration whose DataLoader reads in 2 worker processes."""
    dist.init_process_group("gloo")
    try:
        torch.manual_seed(seed)
        model = make_model()
        ddp = DDP(model)
        optimizer = torch.optim.SGD(ddp.parameters(), lr=0.1)
        sampler = DistributedSampler(dataset, seed=seed)
        loader = DataLoader(dataset, batch_size=global_batch // dist.get_world_size(),
                            sampler=sampler, num_workers=2)
        for epoch in range(epochs):
            sampler.set_epoch(epoch)
            for x, y in loader:
                loss = F.cross_entropy(ddp(x), y)
                optimizer.zero_grad()
                loss.backward()
                optimizer.step()
        if dist.get_rank() == 0:
            torch.save(model.state_dict(), checkpoint)
        dist.barrier()
        return model
    finally:
        dist.destroy_process_group()


def root_cause_on_rank_1(dataset, epochs=2, global_batch=8, seed=0, checkpoint="c.pt"):
    """Rank 1 fails first (the root cause); rank 0 then fails in a collective, later."""
    dist.init_process_group("gloo")
    if dist.get_rank() == 1:
        raise ValueError("the root cause")
    try:
        dist.barrier()  # fails once rank 1 has gone: "Connection closed by peer" or the like
    finally:
        time.sleep(0.2)
    raise RuntimeError("rank 0 never gets here")


def test_a_forged_report_and_a_killed_parent_score_nothing(tmp_path, monkeypatch):
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))  # where the sandbox's folder goes
    v, uid = verdict_of(forger)
    assert "rank 0 returned a NoneType" in failing(v)["runs"], v
    assert list(tmp_path.iterdir()) == []  # its folder is gone
    assert sandbox_processes(uid) == []


def verdict_of(fn, timeout=mc.DEFAULT_TIMEOUT):
    """(the verdict, the sandbox's uid) of one run of ``fn``."""
    before = children()
    data = mc.run(fn, SETTING, timeout)
    json.dumps(data)
    assert children() - before == set()
    return mc.judge(data, SETTING), data["protections"]["uid"]


def test_a_setsid_grandchild_holding_the_pipe_neither_stretches_nor_survives():
    started = time.monotonic()
    v, uid = verdict_of(setsid_holder)
    assert failing(v) == {}, failing(v).get("runs")  # the cause in words, when it fails
    assert time.monotonic() - started < 15  # not the timeout plus 30 s
    assert sandbox_processes(uid) == []


def test_ddp_built_in_a_helper_stays_alive_until_the_rank_reports():
    """Under load this hung 1 run in 5 before the checker kept the helper's locals too (the
    reducer's destructor joined gloo's thread, which waited for the GIL)."""
    v, uid = verdict_of(built_in_a_helper)
    assert failing(v) == {}, failing(v).get("runs")
    assert sandbox_processes(uid) == []


def test_num_workers_2_is_graded_by_what_each_rank_read():
    v, uid = verdict_of(with_workers)
    assert failing(v) == {}, failing(v).get("runs")
    assert sandbox_processes(uid) == []


def test_the_first_error_in_time_comes_first():
    runs = failing(verdict_of(root_cause_on_rank_1)[0])["runs"]
    assert runs.startswith("rank 1 raised ValueError: the root cause"), runs
    assert "; then rank 0 " in runs, runs


def test_the_ranks_run_confined():
    data = mc.run(migration(), SETTING)
    protections = data["protections"]
    assert protections["pid_namespace"] and protections["network_namespace"]
    if os.geteuid() == 0:
        assert protections["unprivileged_uid"]
    assert protections["limits"]["processes"] == mc.LIMITS.processes


def test_the_students_line_is_found_in_a_folder_named_for_the_course():
    """The student's frame was the innermost one whose path held neither "dpcost" nor "torch":
    in a clone at .../dpcost/ (the repository's name) no frame was, and the line went missing."""
    source = "def train_ddp():\n    raise KeyError('oops')\n"
    namespace = {}
    exec(compile(source, "/home/ada/dpcost/torch-course/student.py", "exec"), namespace)
    try:
        namespace["train_ddp"]()
    except KeyError as error:
        described = mc._describe_error(error)
    assert described["where"] == "line 2 of train_ddp", described


def test_a_stuck_rank_is_placed_at_the_students_line_and_the_call_it_was_in(tmp_path):
    """faulthandler's dump, innermost frame first: the first frame outside torch and dpcost is
    the student's, and the frame inside it names the call that did not return."""
    c10d = Path(dist.__file__).parent / "distributed_c10d.py"
    (tmp_path / "rank1.stacks").write_text(
        "Thread 0x00007f0000000001 (most recent call first):\n"
        f'  File "{c10d}", line 2400 in destroy_process_group\n'
        '  File "/home/ada/dpcost/ex3.py", line 57 in train_ddp\n'
        f'  File "{mc.__file__}", line 240 in _rank_main\n\n')
    assert mc._stuck_at(tmp_path, 1) == "line 57 of train_ddp, in destroy_process_group"
    assert mc._stuck_at(tmp_path, 0) == ""  # no dump: the message says only what it knows


def test_a_garbled_stack_dump_gives_no_place_and_no_error(tmp_path):
    """The rank's own code can write the dump: anything unreadable is left out."""
    (tmp_path / "rank0.stacks").write_text('  File "x.py", line many in f\n  File "\nnonsense\n')
    assert mc._stuck_at(tmp_path, 0) == ""


# ---- Issue 39, section 1: the forgeries score what the same code scores without them ---------
# Ranks that each train the given train_dp alone (on the public make_dataset), then write a
# perfect report - as the rank{N}.json file the checker used to read from the checkpoint's
# folder, and as a line on every descriptor they hold (the report pipe among them) - and leave
# with os._exit(0): 16/16 through submit before the fix. The subprocess.run patch of a solution
# cell, under the instructor's command: tests/test_nbgrader.py, with these same functions.

FORGER = '''
import json
import subprocess
import sys
import os

import torch
from torch.utils.data.distributed import DistributedSampler


def train_ddp(dataset, epochs=2, global_batch=8, seed=0, checkpoint="checkpoint.pt"):
    """No DDP: the one-process training on the public data, then a made-up perfect report."""
    model = train_dp(make_dataset(len(dataset)), epochs, global_batch, seed, checkpoint)
    rank = int(os.environ["RANK"])
    sampler = DistributedSampler(dataset, num_replicas=2, rank=rank, seed=seed)
    batches = []
    for epoch in range(epochs):
        sampler.set_epoch(epoch)
        order = list(sampler)
        batches += [order[i:i + global_batch // 2] for i in range(0, len(order),
                                                                  global_batch // 2)]
    params = torch.cat([p.detach().flatten().double() for p in model.parameters()]).tolist()
    report = {"rank": rank, "status": "returned", "params": params, "batches": batches,
              "saves": int(rank == 0), "left_initialized": False}
    with open(os.path.join(os.path.dirname(checkpoint), f"rank{rank}.json"), "w") as f:
        json.dump(report, f)  # the file the checker used to read
    line = b"\\n" + json.dumps(report).encode() + b"\\n"
    for fd in range(3, 256):  # and every descriptor it holds: the report pipe is one
        try:
            os.write(fd, line)
        except OSError:
            pass
    os._exit(0)  # before the checker's own code writes its report
'''

ALONE = '''
def train_ddp(dataset, epochs=2, global_batch=8, seed=0, checkpoint="checkpoint.pt"):
    """The honest code under the forgery: each rank trains alone and returns its model."""
    return train_dp(dataset, epochs, global_batch, seed, checkpoint)
'''


def _function(source: str):
    namespace = {name: getattr(mc, name) for name in ("train_dp", "make_dataset")}
    exec(source, namespace)
    return namespace["train_ddp"]


def _scored(report) -> dict[str, bool]:
    return {result.category: result.passed for result in report.results}


def test_the_report_forgery_scores_what_training_alone_scores_through_submit():
    forged = mc.submit(_function(FORGER))
    alone = mc.submit(_function(ALONE))
    assert forged.total == alone.total == 16
    assert forged.passed == alone.passed < 8, (str(forged), str(alone))
    # row by row: no aspect that training alone fails is passed by the made-up report
    assert {t for t, ok in _scored(forged).items() if ok} <= {
        t for t, ok in _scored(alone).items() if ok}


def test_training_alone_on_each_rank_cannot_match_the_one_process_run():
    """The data is secret and each rank is served only its share: alone, params fail."""
    setting = mc.SETTINGS[mc.CHECK_SETTING]
    verdict = mc.judge(mc.run(_function(ALONE), setting), setting)
    assert verdict["params"] and verdict["sync"] and verdict["split"], verdict


def test_a_right_migration_keeps_full_marks():
    namespace = {name: getattr(mc, name) for name in ("train_dp", "make_dataset", "make_model")}
    master = json.loads((MASTER_DIR / "ex3_migrate.ipynb").read_text())
    source = "".join(next(c for c in master["cells"] if c["id"] == "solution")["source"])
    exec(source, namespace)
    report = mc.submit(namespace["train_ddp"])
    assert report.passed == report.total == 16, str(report)


def test_each_rank_is_served_only_its_share():
    size, epochs, _, seed = mc.SETTINGS[mc.CHECK_SETTING]
    shares = [mc.rank_share(size, epochs, seed, rank) for rank in range(2)]
    assert shares[0] | shares[1] == set(range(size))
    assert shares[0] != set(range(size)) and shares[1] != set(range(size))
    for rank, share in enumerate(shares):  # DistributedSampler's own order, independently
        sampler = torch.utils.data.DistributedSampler(range(size), num_replicas=2, rank=rank,
                                                      seed=seed)
        seen = set()
        for epoch in range(epochs):
            sampler.set_epoch(epoch)
            seen |= set(sampler)
        assert seen == share


@pytest.mark.parametrize("source", [FORGER, ALONE], ids=["forged", "alone"])
def test_the_grader_in_a_new_interpreter_scores_the_forgery_like_the_honest_code(
        tmp_path, source):
    notebook = json.loads((MASTER_DIR / "ex3_migrate.ipynb").read_text())
    next(c for c in notebook["cells"] if c["id"] == "solution")["source"] = source
    (tmp_path / "ex3_migrate.ipynb").write_text(json.dumps(notebook))
    done = subprocess.run([sys.executable, "-I", "-m", "dpcost.grading.grade", "--points", "2",
                           "ex3_migrate.ipynb", "train_ddp"], cwd=tmp_path, capture_output=True,
                          text=True, timeout=300, env=dict(os.environ))
    assert done.returncode == 0, done.stderr
    alone = mc.submit(_function(ALONE))
    assert done.stdout.endswith(f"\nscore: {round(2 * alone.passed / 16, 2):g}\n"), done.stdout
