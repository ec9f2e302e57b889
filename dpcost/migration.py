"""Run the two example scripts (examples/train_dp.py, examples/train_ddp.py) and compare them.

A migration from DataParallel to DDP is right when the DDP run ends with the parameters of the
single-process run on the global batch, to float tolerance. Why they agree: DDP averages the
gradients of the per-rank mean losses (torch/csrc/distributed/c10d/reducer.cpp:
``Reducer::mark_variable_ready_dense`` copies each gradient into its bucket times
1/``div_factor_``, the world size, the bucket's all-reduce sums, and
``finalize_bucket_dense`` copies the result back into ``.grad``), and when every rank holds
b = B/n samples,

    (1/n) sum_r (1/b) sum_{i in rank r} grad l_i = (1/B) sum_{i in batch} grad l_i,

the gradient of the global mean loss. :func:`diagnose` compares two results and says in words
what differs: parameters, samples per rank, order per epoch, ranks out of sync, checkpoint
writes. The same comparison catches each migration bug the DDP script can inject.

- :func:`run_dp` trains with train_dp.py's ``train`` in this process, once per case.
- :func:`run_ddp` starts ``torchrun --standalone`` once for several cases: every rank imports
  train_ddp.py, joins the process group with its ``setup()``, runs its ``train`` per case and
  leaves with ``destroy_process_group`` (``python -m dpcost.migration`` is that entry point).
- :func:`run_script` runs a script file as a user would and parses its JSON line.

torchrun runs in its own session with a time limit and is killed as a group at the end; it and
the ranks of :func:`run_ddp` also get SIGKILL when their parent dies (``PR_SET_PDEATHSIG``), so
no process outlives these functions, even when the caller is killed. Results are plain JSON.
"""

from __future__ import annotations

import importlib.util
import json
import os
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

from dpcost.procs import die_with_parent

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "examples"
TORCHRUN = Path(sys.executable).with_name("torchrun")
DEFAULT_ATOL = 1e-5  # largest |parameter difference| accepted as "the same", float32


class MigrationRunError(RuntimeError):
    """A script run failed or timed out; the message holds the command and its output's tail."""


def load_script(name: str):
    """Import examples/<name>.py as a module (it is a script, not part of the package)."""
    path = EXAMPLES / f"{name}.py"
    if not path.is_file():
        raise ValueError(f"name must be an example script in {EXAMPLES}; got {name!r}")
    spec = importlib.util.spec_from_file_location(f"dpcost_example_{name}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _check_cases(cases) -> dict[str, list[str]]:
    if not isinstance(cases, dict) or not cases:
        raise TypeError("cases must be a non-empty dict {name: list of command-line flags}")
    for name, argv in cases.items():
        if not isinstance(argv, (list, tuple)) or not all(isinstance(a, str) for a in argv):
            raise TypeError(f"cases[{name!r}] must be a list of str flags, got {argv!r}")
    return {name: list(argv) for name, argv in cases.items()}


def run_dp(cases: dict[str, list[str]]) -> dict[str, dict]:
    """Train train_dp.py once per case ({name: flags}) in this process; {name: result}."""
    cases = _check_cases(cases)
    script = load_script("train_dp")
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny model: threads only cost time (the ranks use one each)
    try:
        return _train_each(script, cases)
    finally:
        torch.set_num_threads(threads)


def _train_each(script, cases):
    with tempfile.TemporaryDirectory(prefix="dpcost-migration-") as tmp:
        return {name: script.train(script.parse_args([a.replace("{tmp}", tmp) for a in argv]))
                for name, argv in cases.items()}



def _descendants(pid: int) -> list[int]:
    """Every live descendant of ``pid`` (children of children too), read from /proc (Linux)."""
    parents = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue  # gone meanwhile
            parents[int(entry.name)] = int(stat.rsplit(")", 1)[1].split()[1])
    found, frontier = [], [pid]
    while frontier:
        children = [c for c, parent in parents.items() if parent in frontier]
        found += children
        frontier = children
    return found


def _kill_group(process: subprocess.Popen) -> None:
    """Stop ``process`` and everything under it: torchrun starts each rank in a session of its
    own (``start_new_session`` in torch/distributed/elastic/multiprocessing/
    subprocess_handler), so its process group alone does not reach them."""
    family = _descendants(process.pid)
    if process.poll() is None:
        process.terminate()  # torchrun passes SIGTERM on to its ranks and cleans up
        try:
            process.wait(timeout=5)
        except subprocess.TimeoutExpired:
            pass
    for pid in [process.pid, *family]:
        try:
            os.killpg(pid, signal.SIGKILL) if pid == process.pid else os.kill(pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
    process.wait()


def _run(command: list[str], timeout_s: float) -> str:
    """Run ``command`` in a new session; its stdout. Kill the whole group whatever happens.
    TMPDIR is a scratch folder removed afterwards: torchrun's torchelastic_* logs go with it."""
    from dpcost.procs import scratch_tmpdir

    with scratch_tmpdir("dpcost-migration-run-") as tmpdir:
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(
            filter(None, [str(ROOT), os.environ.get("PYTHONPATH", "")])),
            OMP_NUM_THREADS="1", TORCHELASTIC_ERROR_FILE="", TMPDIR=tmpdir)
        process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                   text=True, start_new_session=True, cwd=ROOT, env=env,
                                   preexec_fn=die_with_parent)
        try:
            output, _ = process.communicate(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            _kill_group(process)
            raise MigrationRunError(f"timed out after {timeout_s:g} s: {' '.join(command)}"
                                    ) from None
        finally:
            _kill_group(process)  # children of children too (same session and group)
    if process.returncode != 0:
        raise MigrationRunError(f"exit status {process.returncode}: {' '.join(command)}\n"
                                + output[-3000:])
    return output


def torchrun_command(nproc: int, target: list[str]) -> list[str]:
    """``torchrun --standalone --nproc-per-node nproc <target...>`` (a free port, one node)."""
    if isinstance(nproc, bool) or not isinstance(nproc, int) or nproc < 1:
        raise ValueError(f"nproc must be an int >= 1, got {nproc!r}")
    return [str(TORCHRUN), "--standalone", f"--nproc-per-node={nproc}", *target]


def run_ddp(cases: dict[str, list[str]], nproc: int = 2, timeout_s: float = 120.0
            ) -> dict[str, dict]:
    """Train train_ddp.py once per case under one torchrun of ``nproc`` ranks; {name: result}."""
    cases = _check_cases(cases)
    with tempfile.TemporaryDirectory(prefix="dpcost-migration-") as tmp:
        cases_file, out_file = Path(tmp, "cases.json"), Path(tmp, "results.json")
        # Each case's checkpoint lives in the temporary folder, whatever the caller passed.
        cases = {name: [a.replace("{tmp}", tmp) for a in argv] for name, argv in cases.items()}
        cases_file.write_text(json.dumps(cases))
        _run(torchrun_command(nproc, ["-m", "dpcost.migration", str(cases_file),
                                      str(out_file)]), timeout_s)
        return json.loads(out_file.read_text())


def run_script(name: str, argv: list[str], nproc: int | None = None, timeout_s: float = 120.0
               ) -> dict:
    """Run examples/<name>.py as a user would (under torchrun when ``nproc``); its JSON line."""
    path = EXAMPLES / f"{name}.py"
    if not path.is_file():
        raise ValueError(f"name must be an example script in {EXAMPLES}; got {name!r}")
    command = [sys.executable, str(path), *argv] if nproc is None else torchrun_command(
        nproc, [str(path), *argv])
    output = _run(command, timeout_s)
    lines = [line for line in output.splitlines() if line.startswith("{")]
    if len(lines) != 1:
        raise MigrationRunError(f"expected one JSON line from {name}, got {len(lines)}:\n"
                                + output[-3000:])
    return json.loads(lines[0])


def script_diff(without_bugs: bool = True, context: int = 0) -> list[str]:
    """The unified diff from train_dp.py to train_ddp.py, as lines.

    ``without_bugs`` leaves out the DDP script's lines that mention "bug" (the --bug-* flags
    and the lines marked BUG that inject them): what remains is the migration itself.
    """
    import difflib

    dp = (EXAMPLES / "train_dp.py").read_text().splitlines()
    ddp = (EXAMPLES / "train_ddp.py").read_text().splitlines()
    if without_bugs:
        ddp = [line for line in ddp if "bug" not in line.lower()]
    return list(difflib.unified_diff(dp, ddp, "examples/train_dp.py", "examples/train_ddp.py",
                                     lineterm="", n=context))


def rounded(line: dict, digits: int = 4) -> dict:
    """A copy of a script's JSON line with every float to ``digits`` significant digits.

    For display: float32 training gives other last digits on other CPUs, kernel sets
    (``ATEN_CPU_CAPABILITY``) and thread counts, so a lesson shows 0.3782, not 0.3781767189502716.
    The line itself keeps full precision for programs.
    """
    def show(value):
        if isinstance(value, float):
            return float(f"{value:.{digits}g}")
        if isinstance(value, list):
            return [show(v) for v in value]
        if isinstance(value, dict):
            return {k: show(v) for k, v in value.items()}
        return value
    return show(line)


def max_param_diff(a: dict, b: dict) -> float:
    """Largest |difference| between two results' parameters (inf if the shapes differ)."""
    pa, pb = a["params"], b["params"]
    if len(pa) != len(pb):
        return float("inf")
    return max((abs(x - y) for x, y in zip(pa, pb, strict=True)), default=0.0)


# Findings that every check of a migration words the same way: diagnose() here, and the
# exercise's checker (dpcost/exercises/migrate_check.py: judge).
SAME_SAMPLES = "rank 0 and rank 1 saw the same samples: did you use a DistributedSampler?"
SAME_ORDER = ("rank 0 saw its samples in the same order in every epoch: did you call "
              "sampler.set_epoch(epoch) at the start of each epoch?")


def same_samples(first_epoch_per_rank) -> bool:
    """Whether every rank saw the same set of samples in its first epoch (no sampler)."""
    ranks = [sorted(samples) for samples in first_epoch_per_rank]
    return len(ranks) > 1 and bool(ranks[0]) and all(r == ranks[0] for r in ranks[1:])


def same_order_every_epoch(epochs) -> bool:
    """Whether one rank's epochs (each a list of sample ids in order) are all the same
    (``DistributedSampler`` without ``set_epoch`` shuffles once)."""
    return len(epochs) > 1 and all(e == epochs[0] for e in epochs[1:])


def diagnose(reference: dict, result: dict, atol: float = DEFAULT_ATOL) -> list[str]:
    """What differs between ``result`` (DDP) and ``reference`` (one process), in words.

    An empty list means: same final parameters to ``atol``, every sample of each epoch seen
    once by exactly one rank, ranks in sync, and no more checkpoint writes than the reference.
    """
    findings = []
    ranks = result["sample_ids"]  # [rank][epoch] -> sample ids in the order seen
    n = len(ranks)
    if ranks[0] and same_samples([rank[0] for rank in ranks]):
        findings.append(SAME_SAMPLES)
    else:
        for epoch, wanted in enumerate(reference["sample_ids"][0]):
            if epoch >= len(ranks[0]):
                break
            got = [i for rank in ranks for i in rank[epoch]]
            twice = len(got) - len(set(got))
            missing = len(set(wanted) - set(got))
            extra = len(set(got) - set(wanted))
            if twice or missing or extra:
                findings.append(
                    f"epoch {epoch}: {len(got)} samples over {n} ranks against "
                    f"{len(wanted)} in one process ({twice} seen twice, {missing} not seen, "
                    f"{extra} not in the reference): DistributedSampler pads a dataset that "
                    "does not divide by the world size (drop_last=True cuts it instead)")
                break
    epochs = ranks[0]
    ref_epochs = reference["sample_ids"][0]
    if same_order_every_epoch(epochs) and not same_order_every_epoch(ref_epochs):
        findings.append(SAME_ORDER)
    if len(set(result["rank_checksums"])) > 1:
        findings.append("the ranks ended with different parameters: their gradients were not "
                        "all-reduced at every optimizer step (was the last micro-batch's "
                        "forward run outside no_sync()? The forward decides whether its "
                        "backward all-reduces)")
    if result["checkpoint_writes"] > reference["checkpoint_writes"]:
        findings.append(f"the checkpoint was written {result['checkpoint_writes']} times, "
                        f"{reference['checkpoint_writes']} in one process: save on rank 0 only "
                        "(then a barrier)")
    diff = max_param_diff(reference, result)
    if not diff <= atol:
        findings.append(f"final parameters differ from the one-process run by up to {diff:.3g} "
                        f"(tolerance {atol:g})" + ("" if findings else ": same samples, same "
                                                   "order, ranks in sync - look at the loss "
                                                   "(mean, not sum) and at BatchNorm"))
    return findings


# The cases of the course: {name: (train_ddp.py flags, the train_dp.py case to compare with)}.
# BatchNorm is off where the comparison must be exact: on CPU the DDP ranks normalise over
# their own b = B/n samples (SyncBatchNorm raises on CPU tensors), one process over all B.
PLAIN = ["--no-batchnorm", "--epochs", "3", "--dataset-size", "96", "--global-batch", "16"]
CHECKPOINT = ["--checkpoint", "{tmp}/checkpoint.pt"]  # {tmp}: a temporary folder per run
ACCUM = PLAIN + ["--accum", "2"] + CHECKPOINT
REFERENCE_CASES = {
    "plain": PLAIN,
    "accumulation": ACCUM,
    "batchnorm": PLAIN[1:],
    "uneven": PLAIN[:-4] + ["--dataset-size", "51", "--global-batch", "16"],
    "uneven_drop_last": PLAIN[:-4] + ["--dataset-size", "51", "--global-batch", "16",
                                      "--drop-last"],
}
DDP_CASES = {
    "plain": (PLAIN, "plain"),
    "accumulation": (ACCUM, "accumulation"),
    "batchnorm": (REFERENCE_CASES["batchnorm"], "batchnorm"),
    "uneven": (REFERENCE_CASES["uneven"], "uneven"),
    "uneven_drop_last": (REFERENCE_CASES["uneven_drop_last"], "uneven_drop_last"),
    "bug_no_sampler": (PLAIN + ["--bug-no-sampler"], "plain"),
    "bug_no_set_epoch": (PLAIN + ["--bug-no-set-epoch"], "plain"),
    "bug_summed_loss": (PLAIN + ["--bug-summed-loss"], "plain"),
    "bug_save_every_rank": (ACCUM + ["--bug-save-every-rank"], "accumulation"),
    "bug_no_final_sync": (ACCUM + ["--bug-no-final-sync"], "accumulation"),
}


def compare_cases(nproc: int = 2, names=None, atol: float = DEFAULT_ATOL,
                  timeout_s: float = 120.0) -> list[dict]:
    """Run the course's cases (all, or ``names``): one process, then DDP on ``nproc`` ranks.

    One row per case: name, flags, reference case, max |parameter difference|, DDP's samples
    per rank, checkpoint writes, the diagnosis (list of findings; empty = equivalent), and the
    two results.
    """
    names = list(DDP_CASES) if names is None else list(names)
    unknown = [name for name in names if name not in DDP_CASES]
    if unknown:
        raise ValueError(f"names must be among {', '.join(DDP_CASES)}; got {unknown}")
    references = run_dp({ref: REFERENCE_CASES[ref] for ref in {DDP_CASES[n][1] for n in names}})
    results = run_ddp({name: DDP_CASES[name][0] for name in names}, nproc, timeout_s)
    rows = []
    for name in names:
        flags, ref = DDP_CASES[name]
        reference, result = references[ref], results[name]
        rows.append({"case": name, "flags": " ".join(flags), "reference": ref,
                     "max_param_diff": max_param_diff(reference, result),
                     "samples_per_rank": result["samples_per_rank"],
                     "reference_samples": reference["samples_per_rank"][0],
                     "checkpoint_writes": result["checkpoint_writes"],
                     "findings": diagnose(reference, result, atol),
                     "reference_result": reference, "result": result})
    return rows


def render_rows(rows: list[dict]) -> str:
    """The rows of :func:`compare_cases` as a plain-text table, findings underneath."""
    lines = [f"{'case':<20} {'max |dparam|':>12}  {'samples per rank':<18} {'writes':>6}  verdict",
             "-" * 78]
    for row in rows:
        verdict = "same as one process" if not row["findings"] else "DIFFERENT"
        lines.append(f"{row['case']:<20} {row['max_param_diff']:>12.2e}  "
                     f"{str(row['samples_per_rank']):<18} {row['checkpoint_writes']:>6}  "
                     f"{verdict}")
    for row in rows:
        for finding in row["findings"]:
            lines.append(f"  {row['case']}: {finding}")
    return "\n".join(lines)


def _torchrun_main(cases_file: str, out_file: str) -> None:
    """The torchrun entry: every rank runs train_ddp.py's train() once per case."""
    die_with_parent()  # torchrun's agent killed -> this rank goes too
    if "torchrun" not in Path(f"/proc/{os.getppid()}/cmdline").read_text(errors="replace"):
        sys.exit("dpcost.migration: started outside torchrun, or torchrun is already gone")
    import dpcost.measure.warm  # noqa: F401 - torch imported and frozen: the rank exits sooner
    script = load_script("train_ddp")  # imports torch._dynamo before setup() inits the group
    import torch.distributed as dist

    device = script.setup()
    try:
        results = {}
        for name, argv in json.loads(Path(cases_file).read_text()).items():
            results[name] = script.train(script.parse_args(argv), device)
            dist.barrier()  # one case's checkpoint is read back before the next starts
        if dist.get_rank() == 0:
            Path(out_file).write_text(json.dumps(results))
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit("usage: torchrun ... -m dpcost.migration CASES.json OUT.json")
    _torchrun_main(sys.argv[1], sys.argv[2])
