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
- :func:`check_scripts` (``python -m dpcost.migration check my_dp.py my_ddp.py``) checks a
  practitioner's OWN pair of scripts: each calls :data:`record` (``record.samples``,
  ``record.result``), which writes what it saw into a folder the check names in
  ``DPCOST_MIGRATION_RECORD`` and does nothing when that variable is unset.

Every script or torchrun runs under a keeper (:func:`dpcost.procs.keep`) in a session of its
own, with a time limit: the keeper adopts the orphans of its tree (a child subreaper) and ends
everything when the run exits, is stopped, or its caller dies (``PR_SET_PDEATHSIG``), so no
process outlives these functions, even when the caller is killed. Results are plain JSON.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import importlib.util
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

from dpcost.procs import KEEPER_GRACE_S, die_with_parent, kill_tree

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


def _spawn(command: list[str], timeout_s: float, cwd=ROOT, extra_env=None, merge=True,
           remove=()) -> tuple[int, str, str]:
    """Run ``command`` under a keeper (:func:`dpcost.procs.keep`) in a new session: (exit
    status, stdout, stderr), stderr in stdout when ``merge``. The keeper adopts every orphan of
    the command's tree and ends them all when the command exits, when it is stopped (a
    timeout, an error or a signal here: ``kill_tree`` sends it SIGTERM) and when this process
    dies, removing the folders in ``remove`` then. TMPDIR is a scratch folder removed
    afterwards: torchrun's torchelastic_* logs go with it."""
    from dpcost.procs import keeper_command, scratch_tmpdir

    with scratch_tmpdir("dpcost-migration-run-") as tmpdir:
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(
            filter(None, [str(ROOT), os.environ.get("PYTHONPATH", "")])),
            OMP_NUM_THREADS="1", TORCHELASTIC_ERROR_FILE="", TMPDIR=tmpdir, **(extra_env or {}))
        process = subprocess.Popen(keeper_command(command, [tmpdir, *map(str, remove)]),
                                   stdout=subprocess.PIPE,
                                   stderr=subprocess.STDOUT if merge else subprocess.PIPE,
                                   text=True, start_new_session=True, cwd=cwd, env=env)
        try:
            output, errors = process.communicate(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            kill_tree(process, grace_s=KEEPER_GRACE_S + 2)
            raise MigrationRunError(f"timed out after {timeout_s:g} s: {' '.join(command)}"
                                    ) from None
        finally:
            # SIGTERM first: the keeper passes it to torchrun, which passes it on to its ranks
            # (each in a session of its own: start_new_session in torch/distributed/elastic/
            # multiprocessing/subprocess_handler) and cleans up; then the keeper ends the rest
            kill_tree(process, grace_s=KEEPER_GRACE_S + 2)
    return process.returncode, output, errors or ""


@contextlib.contextmanager
def folder_guard(folder):
    """While inside: a keeper (:func:`dpcost.procs.keep`) over a process that only waits, so
    that ``folder`` is removed if this process is killed outright (SIGKILL leaves it no time),
    also between two runs, when no run's keeper is alive."""
    from dpcost.procs import keeper_command

    process = subprocess.Popen(
        keeper_command([sys.executable, "-c", "import time; time.sleep(86400)"], [folder]),
        start_new_session=True, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL)
    try:
        yield
    finally:
        kill_tree(process)


def _run(command: list[str], timeout_s: float, remove=()) -> str:
    """Run ``command`` with :func:`_spawn`; its output (stdout and stderr), or
    MigrationRunError with the output's tail when it exits non-zero."""
    returncode, output, _ = _spawn(command, timeout_s, remove=remove)
    if returncode != 0:
        raise MigrationRunError(f"exit status {returncode}: {' '.join(command)}\n"
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
                                      str(out_file)]), timeout_s, remove=[tmp])
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


def max_param_diff(a: dict, b: dict, leave_out=frozenset()) -> float:
    """Largest |difference| between two results' parameters (inf if the shapes differ),
    over the elements not in ``leave_out`` (their positions)."""
    pa, pb = a["params"], b["params"]
    if len(pa) != len(pb):
        return float("inf")
    return max((abs(x - y) for i, (x, y) in enumerate(zip(pa, pb, strict=True))
                if i not in leave_out), default=0.0)


# A gradient whose typical size (the optimizer's running root mean square) is below this
# fraction of the largest one in the model is zero up to float rounding: float32 rounds a sum
# to about 2**-24 ~ 6e-8 of its terms' size, times the number of terms. Attention's key bias is
# one: softmax ignores a shift shared by all keys, so its gradient is exactly zero in exact
# arithmetic (measured: 1e-11 against 4e-5 for the smallest other element, 2e-2 the largest,
# examples/own_migration/transformer_dp.py).
ROUNDING_LEVEL = 1e-5


def rounding_driven(reference: dict, result: dict) -> tuple[set[int], list[str]]:
    """The parameter elements that an adaptive optimizer moved on rounding alone, by position,
    and the names of the tensors that hold them. Adam's step is about lr whatever the
    gradient's size (:func:`parameter_tolerance`), so an element whose gradient is zero up to
    rounding still moves by up to lr each step, in a direction the rounding picks: one process
    and n ranks round differently, and such an element can differ by lr x steps in a correct
    migration. It carries no trace of the migration (no sample moves it), so the comparison
    leaves it out and says so. Read from the gradient scale each run recorded (Adam's
    exp_avg_sq and its kin, :func:`_gradient_scale`); none without one."""
    found, names = set(), []
    for run in (reference, result):
        scale = run.get("gradient_scale")
        if not scale:
            continue
        level = ROUNDING_LEVEL * max(scale)
        found.update(i for i, value in enumerate(scale) if value <= level)
    start = 0
    for name, size in (reference.get("param_names") or result.get("param_names") or []):
        if any(start <= i < start + size for i in found):
            names.append(name)
        start += size
    return found, names


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


# Optimizers whose step divides each gradient element by a running measure of its own size, so
# that every parameter moves about lr per step whatever its gradient's scale (torch/optim/).
ADAPTIVE_OPTIMIZERS = frozenset({"Adam", "AdamW", "Adamax", "NAdam", "RAdam", "Adagrad",
                                 "RMSprop", "SparseAdam"})
ADAPTIVE_RTOL = 1e-2  # accepted difference, as a fraction of lr x steps (see parameter_tolerance)


def parameter_tolerance(reference: dict, atol: float = DEFAULT_ATOL,
                        adaptive_rtol: float = ADAPTIVE_RTOL) -> tuple[float, str]:
    """The largest |parameter difference| that float rounding explains, and why, in words.

    SGD moves a parameter by lr x its gradient, so a rounding error in a gradient (relative size
    u = 2**-24 in float32, times how much the per-sample terms cancel) moves it by lr x that
    small absolute error: ``atol`` (1e-5) covers it. An adaptive optimizer divides each element
    by a running measure of its own size: Adam's step is lr * m_hat / (sqrt(v_hat) + eps)
    (torch/optim/adam.py), about lr whatever the gradient's scale (Kingma & Ba 2015, section
    2.1: at most lr * (1 - beta1) / sqrt(1 - beta2)). Its sensitivity to an error dg in a
    gradient is lr / sqrt(v_hat) per unit dg, where SGD's is lr: the inverse of the gradient's
    own size. So the same relative rounding error becomes an error of lr x (relative error) per
    step, largest on the elements whose gradient nearly cancels; it adds up over the steps to a
    fraction of lr x steps, the farthest such an optimizer moves a parameter. The tolerance is
    ``adaptive_rtol`` (1 %) of that, when the reference recorded an adaptive optimizer (its
    ``optimizer``: name, lr, steps) and that exceeds ``atol``; else ``atol``.
    """
    optimizer = reference.get("optimizer") or {}
    name, lr, steps = optimizer.get("name"), optimizer.get("lr"), optimizer.get("steps")
    if name in ADAPTIVE_OPTIMIZERS and lr and steps:
        scaled = adaptive_rtol * lr * steps
        if scaled > atol:
            return scaled, f"{scaled:.2g} = {adaptive_rtol:g} x lr {lr:g} x {steps:g} steps, {name}"
    return atol, f"{atol:g}"


def diagnose(reference: dict, result: dict, atol: float = DEFAULT_ATOL,
             adaptive_rtol: float = ADAPTIVE_RTOL) -> list[str]:
    """What differs between ``result`` (DDP) and ``reference`` (one process), in words.

    An empty list means: same final parameters to the tolerance of :func:`parameter_tolerance`
    (``atol``, scaled up for an adaptive optimizer that the reference recorded), every sample of
    each epoch seen once by exactly one rank, ranks in sync, no more checkpoint writes than the
    reference, and the same optimizer and learning rate where both recorded one.
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
    mine, theirs = reference.get("optimizer"), result.get("optimizer")
    if mine and theirs and (mine["name"], mine["lr"]) != (theirs["name"], theirs["lr"]):
        findings.append(f"the optimizer differs: {theirs['name']} with lr {theirs['lr']:g} "
                        f"under DDP, {mine['name']} with lr {mine['lr']:g} in one process (a "
                        "global batch split over the ranks keeps the one-process lr)")
    if mine and theirs and mine.get("steps") and theirs.get("steps") and \
            mine["steps"] != theirs["steps"]:
        findings.append(f"the DDP run took {theirs['steps']:g} optimizer steps, one process "
                        f"{mine['steps']:g}: each rank's batch must be the global batch / n "
                        f"({n} ranks)")
    limit, why = parameter_tolerance(reference, atol, adaptive_rtol)
    diff = max_param_diff(reference, result, rounding_driven(reference, result)[0])
    if not diff <= limit:
        drew = randomness(reference, result)
        if drew:  # the likeliest cause, whatever else was found
            findings.append(f"final parameters differ from the one-process run by up to "
                            f"{diff:.3g} (tolerance {why}): {drew}")
            return findings
        adaptive = (mine or {}).get("name") in ADAPTIVE_OPTIMIZERS
        batchnorm = reference.get("batchnorm_modules") or result.get("batchnorm_modules")
        bn = f"BatchNorm ({_some(batchnorm)})" if batchnorm else ""
        if adaptive:
            hint = (f"look at {bn + ' and at ' if bn else ''}the batch per rank (global / n); a "
                    "summed loss does not show here: an adaptive step divides the gradient's "
                    "scale out")
        else:
            hint = (f"look at the loss (mean, not sum){' and at ' + bn if bn else ''}; an "
                    "adaptive optimizer (Adam) also grows float rounding with lr x steps: give "
                    "it to record.result(optimizer=...) so that the tolerance scales with it")
        findings.append(f"final parameters differ from the one-process run by up to {diff:.3g} "
                        f"(tolerance {why})" + ("" if findings else ": same samples, same "
                                                f"order, ranks in sync - {hint}"))
    return findings


def _some(names: list[str], shown: int = 2) -> str:
    more = len(names) - shown
    return ", ".join(names[:shown]) + (f" and {more} more" if more > 0 else "")


def randomness(reference: dict, result: dict) -> str:
    """In words, the per-step randomness either run recorded (a global generator that moved
    between two batches of an epoch), and the dropout it comes from if the model has any;
    "" when neither drew."""
    draws = {}
    for run in (reference, result):
        for name, count in (run.get("random_draws") or {}).items():
            if name != "batches" and count:
                draws[name] = max(count, draws.get(name, 0))
    if not draws:
        return ""
    batches = max((run.get("random_draws") or {}).get("batches", 0) for run in (reference, result))
    drew = ", ".join(f"{GENERATOR_NAMES.get(name, name)} after {count} of {batches} batches"
                     for name, count in draws.items())
    dropout = reference.get("dropout_modules") or result.get("dropout_modules")
    turned_off = reference.get("dropout_off") or result.get("dropout_off")
    if dropout and not turned_off and draws.keys() & {"torch", "cuda"}:
        cause = (f"the model's dropout ({_some(dropout)}) draws other masks in one process "
                 "(for B samples) than on n ranks (B/n each, from the same seed), so a correct "
                 "migration differs too: check without --keep-dropout, which turns it off")
    else:
        off = (f"the check turned dropout off ({', '.join(turned_off)}), so something else "
               "draws: " if turned_off else "")
        cause = (f"{off}one process draws other numbers for its B samples than n ranks for "
                 "their B/n each (torch.rand in the forward, a random augmentation, dropout "
                 "not called as F.dropout); make the steps deterministic for the check, for "
                 "example with a generator seeded per sample")
    return f"the training steps drew random numbers ({drew}): {cause}"


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


# A practitioner's own pair of scripts: what they record, and the check that runs them.
RECORD_ENV = "DPCOST_MIGRATION_RECORD"  # the folder a checked script writes rank<RANK>.json into
RECORD_HOWTO = ("add `from dpcost.migration import record`, `record.samples(index, "
                "epoch=epoch)` per batch and `record.result(loss=loss, params=model, "
                "optimizer=optimizer)` at the end")


class Recorder:
    """What a training script tells ``python -m dpcost.migration check``; three lines in it:

        from dpcost.migration import record
        record.samples(index, epoch=epoch)      # per batch: the ids of the samples it holds
        record.result(loss=loss, params=model, optimizer=optimizer)   # once, at the end

    (``record.saved()`` after each checkpoint write counts the writes.) Every call returns at
    once when ``DPCOST_MIGRATION_RECORD`` is unset, so the lines can stay in a script that runs
    on its own. Under the check, ``result`` writes ``rank<RANK>.json`` into that folder (RANK
    from torchrun, 0 in one process): the sample ids per epoch, the parameters as float64, their
    checksum (sum of |p|), the checkpoint writes, the loss, and the optimizer's name, lr and
    steps (which scale the tolerance, :func:`parameter_tolerance`).
    """

    def __init__(self):
        self._epochs: dict[int, list[int]] = {}
        self._writes = 0
        self._last_states = None  # (epoch, the generators' states) at the previous batch
        self._draws: dict[str, int] = {}  # generator -> batches after which it had moved
        self._intervals = 0  # batch-to-batch intervals compared
        self._dropout_off: dict[str, float] = {}  # function -> largest p turned to 0

    @staticmethod
    def folder() -> str | None:
        return os.environ.get(RECORD_ENV) or None

    def samples(self, index, epoch: int) -> None:
        """Note the sample ids of one batch (a tensor, list or int), in order, for ``epoch``."""
        if self.folder() is None:
            return
        if isinstance(epoch, bool) or not isinstance(epoch, int) or epoch < 0:
            raise ValueError(f"epoch must be an int >= 0, got {epoch!r}")
        ids = index.tolist() if hasattr(index, "tolist") else index
        ids = [ids] if isinstance(ids, int) else list(ids)
        if not all(isinstance(i, int) and not isinstance(i, bool) for i in ids):
            raise ValueError(f"index must hold sample ids (ints), got {ids[:3]!r}...")
        self._epochs.setdefault(epoch, []).extend(ids)
        self._note_draws(epoch)

    def _note_draws(self, epoch: int) -> None:
        """Which global generators moved since the previous batch of the same epoch: a step
        (fetch, forward, backward, optimizer) that draws from one (dropout, a random
        augmentation, torch.rand in the forward) cannot give one process and n ranks the same
        numbers. Across an epoch's start the DataLoader draws a seed, so only within one."""
        states = _generator_states()
        if self._last_states is not None and self._last_states[0] == epoch:
            self._intervals += 1
            for name, state in states.items():
                before = self._last_states[1].get(name)
                if before is not None and not _same_state(before, state):
                    self._draws[name] = self._draws.get(name, 0) + 1
        self._last_states = (epoch, states)

    def _dropped(self, function: str, p: float) -> None:
        self._dropout_off[function] = max(float(p), self._dropout_off.get(function, 0.0))

    def saved(self) -> None:
        """Note one checkpoint write by this process."""
        if self.folder() is not None:
            self._writes += 1

    def result(self, loss, params, optimizer=None) -> None:
        """Write what this process saw: ``params`` an nn.Module (DataParallel and DDP give their
        module's), a tensor or an iterable of tensors; ``loss`` a number or 0-d tensor."""
        folder = self.folder()
        if folder is None:
            return
        import torch

        model = params if isinstance(params, torch.nn.Module) else None
        if isinstance(params, torch.nn.Module):
            params = list(params.parameters())
        elif isinstance(params, torch.Tensor):
            params = [params]
        else:
            params = list(params)
        if not params or not all(isinstance(p, torch.Tensor) for p in params):
            raise ValueError("params must be an nn.Module, a tensor or tensors, got "
                             f"{type(params).__name__} without tensors")
        flat = torch.cat([p.detach().reshape(-1).double().cpu() for p in params])
        line = {"rank": int(os.environ.get("RANK", 0)),
                "world_size": int(os.environ.get("WORLD_SIZE", 1)),
                "final_loss": float(loss), "params": flat.tolist(),
                "checksum": flat.abs().sum().item(), "checkpoint_writes": self._writes,
                "sample_ids": [self._epochs[e] for e in sorted(self._epochs)],
                "optimizer": None if optimizer is None else _optimizer_facts(optimizer),
                "gradient_scale": _gradient_scale(optimizer, params),
                "param_names": None if model is None else [
                    (name.removeprefix("module."), p.numel())
                    for name, p in model.named_parameters()],
                "random_draws": {"batches": self._intervals, **self._draws},
                "dropout_off": self._dropout_off, **_modules_of_note(model)}
        path = Path(folder, f"rank{line['rank']}.json")
        path.with_suffix(".part").write_text(json.dumps(line))
        path.with_suffix(".part").replace(path)  # whole, or not there


def _optimizer_facts(optimizer) -> dict:
    """Name, largest lr over the param groups, and steps taken (``state[p]["step"]``, which
    every torch.optim adaptive optimizer keeps; None for SGD without momentum state)."""
    steps = [float(state["step"]) for state in optimizer.state.values() if "step" in state]
    return {"name": type(optimizer).__name__,
            "lr": max(float(group["lr"]) for group in optimizer.param_groups),
            "steps": max(steps) if steps else None}


# The optimizer state that holds each element's running gradient size: (key, its power).
GRADIENT_SIZE_STATE = (("exp_avg_sq", 2), ("square_avg", 2), ("sum", 2), ("exp_inf", 1))


def _gradient_scale(optimizer, params) -> list[float] | None:
    """Each parameter element's typical gradient size, from an adaptive optimizer's state
    (Adam's exp_avg_sq: a running mean of g squared; Adamax's exp_inf: of |g|), in the order
    of ``params``; None without such state for every parameter."""
    if optimizer is None:
        return None
    import torch

    sizes = []
    for param in params:
        state = optimizer.state.get(param, {})
        found = next(((state[key], power) for key, power in GRADIENT_SIZE_STATE
                      if isinstance(state.get(key), torch.Tensor)), None)
        if found is None or found[0].shape != param.shape:
            return None
        value, power = found
        sizes.append(value.detach().double().reshape(-1).cpu() ** (1 / power))
    return torch.cat(sizes).tolist() if sizes else None


def _generator_states() -> dict:
    """The state of each global random generator this process has: torch's CPU generator,
    Python's ``random``, numpy's legacy one (if numpy is imported) and the current CUDA
    device's (if CUDA is initialised)."""
    import random

    import torch

    states = {"torch": torch.default_generator.get_state(), "random": random.getstate()}
    numpy = sys.modules.get("numpy")
    if numpy is not None:
        kind, keys, *rest = numpy.random.get_state()
        states["numpy"] = (kind, keys.tobytes(), *rest)
    if torch.cuda.is_initialized():
        states["cuda"] = torch.cuda.get_rng_state()
    return states


def _same_state(a, b) -> bool:
    import torch

    return torch.equal(a, b) if isinstance(a, torch.Tensor) else a == b


GENERATOR_NAMES = {"torch": "torch's default generator", "random": "Python's random",
                   "numpy": "numpy.random", "cuda": "the CUDA generator"}


def _modules_of_note(model) -> dict:
    """The model's dropout modules with p > 0 and its BatchNorm modules, by name (None each
    when ``record.result`` got tensors, not a module): they explain parameters that differ."""
    if model is None:
        return {"dropout_modules": None, "batchnorm_modules": None}
    import torch.nn as nn
    from torch.nn.modules.batchnorm import _BatchNorm
    from torch.nn.modules.dropout import _DropoutNd

    dropout, batchnorm = [], []
    for name, module in model.named_modules():
        name = name.removeprefix("module.") or type(module).__name__  # DataParallel, DDP
        if isinstance(module, _DropoutNd) and module.p > 0:
            dropout.append(f"{name} (p={module.p:g})")
        elif isinstance(module, nn.MultiheadAttention) and module.dropout > 0:
            dropout.append(f"{name} (attention dropout {module.dropout:g})")
        elif isinstance(module, _BatchNorm):
            batchnorm.append(name)
    return {"dropout_modules": dropout, "batchnorm_modules": batchnorm}


# torch.nn.functional's dropouts. nn.Dropout and its kin call them, and so do
# MultiheadAttention (through F.multi_head_attention_forward, which also calls
# F.scaled_dot_product_attention with dropout_p) and the Transformer layers built on both.
DROPOUT_FUNCTIONS = ("dropout", "dropout1d", "dropout2d", "dropout3d", "alpha_dropout",
                     "feature_alpha_dropout")
KEEP_DROPOUT_ENV = "DPCOST_MIGRATION_KEEP_DROPOUT"  # set by check --keep-dropout


def _without_dropout(recorder: Recorder, name: str, original):
    import inspect

    signature = inspect.signature(original)

    @functools.wraps(original)
    def dropout_off(*args, **kwargs):
        bound = signature.bind(*args, **kwargs)
        bound.apply_defaults()
        if bound.arguments["training"] and bound.arguments["p"] > 0:
            recorder._dropped(f"F.{name}", bound.arguments["p"])
            bound.arguments["p"] = 0.0
        return original(*bound.args, **bound.kwargs)
    return dropout_off


def _attention_without_dropout(recorder: Recorder, original):
    @functools.wraps(original)
    def attention(query, key, value, attn_mask=None, dropout_p=0.0, *args, **kwargs):
        if dropout_p > 0:
            recorder._dropped("F.scaled_dot_product_attention", dropout_p)
            dropout_p = 0.0
        return original(query, key, value, attn_mask, dropout_p, *args, **kwargs)
    return attention


def turn_dropout_off(recorder: Recorder) -> None:
    """Make every dropout of torch.nn.functional draw nothing (p = 0), noting in ``recorder``
    which were asked for p > 0. The check does this in both scripts (when the recorder module
    is imported under it): one process draws masks for its B samples, each of n ranks for its
    B/n from the same seed, so the masks differ and so would the parameters, in a correct
    migration too. Called by name (``F.dropout``, as torch's own modules call it): a function
    imported on its own before this still draws, and the check names what drew."""
    import torch.nn.functional as F

    for name in DROPOUT_FUNCTIONS:
        setattr(F, name, _without_dropout(recorder, name, getattr(F, name)))
    F.scaled_dot_product_attention = _attention_without_dropout(
        recorder, F.scaled_dot_product_attention)


record = Recorder()
if Recorder.folder() is not None and not os.environ.get(KEEP_DROPOUT_ENV):
    turn_dropout_off(record)  # a script under the check: see turn_dropout_off


class CheckInputError(ValueError):
    """The check could not compare: a missing script, one that failed, one that recorded
    nothing. The message is one line that names the parameter (exit status 2)."""


def _last_line(text: str) -> str:
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return lines[-1] if lines else "(no output on stderr)"


_EXCEPTION_LINE = re.compile(r"^[A-Za-z_][\w.]*(Error|Exception|Interrupt|Exit)\b")


def _rank_stderr(log_dir: Path) -> str:
    """The rank's stderr that names the failure, from torchrun's ``--redirects`` files
    (``<log_dir>/<run>/attempt_0/<local rank>/stderr.log``): the first whose last line is an
    exception's (a peer that torchrun stopped mid-traceback ends on a source line instead),
    else the first that says anything."""
    texts = [path.read_text(errors="replace") for path in sorted(
        log_dir.glob("*/attempt_*/*/stderr.log"),
        key=lambda p: (p.parent.parent.name, int(p.parent.name)))]
    said = [text for text in texts if text.strip()]
    named = [text for text in said if _EXCEPTION_LINE.match(_last_line(text))]
    return (named or said or [""])[0]


def _read_records(folder: Path, name: str, script: Path, world_size: int) -> list[dict]:
    ranks = []
    for rank in range(world_size):
        path = folder / f"rank{rank}.json"
        if not path.is_file():
            who = "it" if world_size == 1 else f"rank {rank}"
            raise CheckInputError(f"{name}: {script.name} ran, but {who} never called "
                                  f"record.result(): {RECORD_HOWTO}")
        line = json.loads(path.read_text())
        if not line["sample_ids"]:
            raise CheckInputError(f"{name}: {script.name} never called record.samples(): "
                                  f"{RECORD_HOWTO}")
        ranks.append(line)
    return ranks


def _as_result(ranks: list[dict]) -> dict:
    """The rank files of one run as one result, in the shape :func:`diagnose` reads."""
    first = ranks[0]
    return {"params": first["params"], "final_loss": first["final_loss"],
            "optimizer": first["optimizer"], "world_size": len(ranks),
            "sample_ids": [r["sample_ids"] for r in ranks],
            "rank_checksums": [r["checksum"] for r in ranks],
            "checkpoint_writes": sum(r["checkpoint_writes"] for r in ranks),
            "samples_per_rank": [sum(map(len, r["sample_ids"])) for r in ranks],
            "random_draws": _merged([r.get("random_draws") or {} for r in ranks]),
            "dropout_off": _merged([r.get("dropout_off") or {} for r in ranks]),
            **{key: first.get(key) for key in ("gradient_scale", "param_names",
                                               "dropout_modules", "batchnorm_modules")}}


def _merged(dicts: list[dict]) -> dict:
    """One dict of numbers from the ranks' dicts: the largest value of each key."""
    merged = {}
    for one in dicts:
        for key, value in one.items():
            merged[key] = max(value, merged.get(key, value))
    return merged


def _run_recorded(name: str, script: Path, args: list[str], nproc: int | None, folder: Path,
                  timeout_s: float, keep_dropout: bool = False) -> dict:
    """Run one script (under torchrun when ``nproc``) with the recorder on; its result."""
    folder.mkdir()
    logs = folder / "logs"
    command = ([sys.executable, str(script), *args] if nproc is None else torchrun_command(
        nproc, ["--redirects", "2", "--log-dir", str(logs), str(script), *args]))
    try:
        returncode, _, errors = _spawn(command, timeout_s, cwd=Path.cwd(), merge=False,
                                       remove=[folder.parent],  # the check's own folder
                                       extra_env={RECORD_ENV: str(folder), **(
                                           {KEEP_DROPOUT_ENV: "1"} if keep_dropout else {})})
    except MigrationRunError:
        raise CheckInputError(f"--timeout-s: {script.name} ran past {timeout_s:g} s") from None
    if returncode != 0:
        where = "" if nproc is None else " under torchrun"
        said = (_rank_stderr(logs) if nproc is not None else "") or errors
        raise CheckInputError(f"{name}: {script.name} exited with status {returncode}{where}: "
                              f"{_last_line(said)}")
    return _as_result(_read_records(folder, name, script, nproc or 1))


RANKS_PER_CPU = 4  # more ranks than that per core and gloo's timeouts come into reach
RANK_MB = 220  # a rank under torchrun that imported torch (dpcost/measure/preflight.py)


def _cpus() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()


def most_ranks() -> int:
    """The most DDP ranks the check starts here: :data:`RANKS_PER_CPU` per usable CPU, and no
    more than MemAvailable holds at :data:`RANK_MB` each (at least 2, the smallest check)."""
    from dpcost.measure.preflight import memory_available_bytes

    most = RANKS_PER_CPU * (_cpus() or 1)
    available = memory_available_bytes()
    if available is not None:
        most = min(most, int(available // (RANK_MB * 1e6)))
    return max(2, most)


def check_scripts(dp_script, ddp_script, nproc: int = 2, args=(), atol: float = DEFAULT_ATOL,
                  adaptive_rtol: float = ADAPTIVE_RTOL, timeout_s: float = 300.0,
                  keep_dropout: bool = False) -> dict:
    """Run ``dp_script`` in one process and ``ddp_script`` under torchrun on ``nproc`` ranks,
    both with ``args`` and the recorder on, and compare them with :func:`diagnose`. Dropout is
    off in both (:func:`turn_dropout_off`) unless ``keep_dropout``.

    Returns {"findings": [...] (empty: the migration is right), "max_param_diff",
    "tolerance", "why", "reference", "result"}; raises CheckInputError (one line) when the
    scripts cannot be compared.
    """
    paths = {}
    for name, script in (("dp_script", dp_script), ("ddp_script", ddp_script)):
        path = Path(script)
        if not path.is_file():
            raise CheckInputError(f"{name}: no such file: {script}")
        paths[name] = path.resolve()
    if isinstance(nproc, bool) or not isinstance(nproc, int) or nproc < 2:
        raise CheckInputError(f"--nproc must be an int >= 2 (a DDP run to compare), got {nproc!r}")
    most = most_ranks()
    if nproc > most:
        raise CheckInputError(f"--nproc: at most {most} ranks fit this machine ({RANKS_PER_CPU} "
                              f"per CPU on its {_cpus()} CPUs, {RANK_MB:g} MB each within its "
                              f"available memory), got {nproc}")
    for flag, value in (("--atol", atol), ("--optimizer-tolerance", adaptive_rtol),
                        ("--timeout-s", timeout_s)):
        if not (isinstance(value, (int, float)) and 0 < value < float("inf")):
            raise CheckInputError(f"{flag} must be a finite number > 0, got {value!r}")
    args = [str(a) for a in args]
    with tempfile.TemporaryDirectory(prefix="dpcost-migration-check-") as tmp, \
            folder_guard(tmp):
        reference = _run_recorded("dp_script", paths["dp_script"], args, None,
                                  Path(tmp, "dp"), timeout_s, keep_dropout)
        result = _run_recorded("ddp_script", paths["ddp_script"], args, nproc,
                               Path(tmp, "ddp"), timeout_s, keep_dropout)
    limit, why = parameter_tolerance(reference, atol, adaptive_rtol)
    left_out, names = rounding_driven(reference, result)
    return {"findings": diagnose(reference, result, atol, adaptive_rtol),
            "max_param_diff": max_param_diff(reference, result, left_out), "tolerance": limit,
            "why": why, "left_out": len(left_out), "left_out_in": names,
            "reference": reference, "result": result}


def render_check(dp_script, ddp_script, report: dict) -> list[str]:
    """The check's report as lines: what ran, the verdict, then one line per finding."""
    reference, result = report["reference"], report["result"]
    lines = [f"{Path(dp_script).name} (1 process, {reference['samples_per_rank'][0]} samples) "
             f"against {Path(ddp_script).name} ({result['world_size']} ranks, "
             f"{result['samples_per_rank']} samples): largest parameter difference "
             f"{report['max_param_diff']:.2g} (tolerance {report['why']})"]
    if report.get("left_out"):
        where = f" (in {_some(report['left_out_in'])})" if report["left_out_in"] else ""
        lines.append(f"{report['left_out']} parameter elements left out of the comparison"
                     f"{where}: their gradient is zero up to float rounding, and "
                     f"{reference['optimizer']['name']} moves them by about lr per step in a "
                     "direction the rounding picks (for example attention's key bias: softmax "
                     "ignores a shift shared by all keys)")
    turned_off = reference.get("dropout_off") or result.get("dropout_off")
    if turned_off:
        lines.append(f"dropout was off in both runs ({', '.join(turned_off)} with p > 0 ran "
                     "with p = 0): one process and n ranks draw different masks, so a correct "
                     "migration would differ too; --keep-dropout leaves it on")
    if not report["findings"]:
        lines.append("the migration is right: same samples, each once per epoch, a new order "
                     "each epoch, ranks in sync, same parameters")
    return lines + report["findings"]


CHECK_HELP = """\
Check your own migration from DataParallel to DDP by running both scripts.

  python -m dpcost.migration check my_dp.py my_ddp.py [--nproc 2] [-- SCRIPT ARGS]

runs my_dp.py in one process and my_ddp.py under torchrun on --nproc ranks (gloo on
CPUs, NCCL on GPUs), both with the same SCRIPT ARGS, then compares them: the samples
each rank saw per epoch, the order across epochs, the ranks' final parameters, the
checkpoint writes, the optimizer and lr, and the final parameters against one process.
One line per finding; exit status 0 when the migration is right, 1 when not, 2 when
the scripts could not be compared (one line naming what).

Each script records what it does with three lines (they do nothing outside the check):

  from dpcost.migration import record
  record.samples(index, epoch=epoch)       # per batch: the ids of its samples
  record.result(loss=loss, params=model, optimizer=optimizer)   # at the end

and record.saved() after each checkpoint write. For a number-for-number comparison
the one-process script must draw the order DistributedSampler draws: use
DistributedSampler(dataset, num_replicas=1, rank=0) with set_epoch(epoch) there, and
give the DDP ranks global batch / n each. Tolerance: --atol (float32 rounding with
SGD), scaled to --optimizer-tolerance x lr x steps for an adaptive optimizer (Adam,
...) that record.result was given; elements whose gradient is zero up to rounding are
left out and named. Dropout is off in both runs (one process and n ranks would draw
different masks); --keep-dropout leaves it on. Other randomness in a step (torch.rand
in the forward, a random augmentation) is named. Example pairs: examples/own_migration/.
"""


def _number(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a number, got {text!r}") from None
    return value


class Stopped(Exception):
    """SIGINT, SIGTERM or SIGHUP arrived during the check (raised in the main thread, so that
    every ``finally`` on the way out ends its processes and removes its folders)."""

    def __init__(self, signum: int):
        super().__init__(signum)
        self.signum, self.name = signum, signal.Signals(signum).name


@contextlib.contextmanager
def _stopped_by_signals():
    """SIGINT, SIGTERM and SIGHUP raise :class:`Stopped`; a second one while the way out
    cleans up is ignored, so the clean-up finishes."""
    signals = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)

    def stop(signum, _frame):
        for other in signals:
            signal.signal(other, signal.SIG_IGN)
        raise Stopped(signum)

    before = {signum: signal.signal(signum, stop) for signum in signals}
    try:
        yield
    finally:
        for signum, handler in before.items():
            signal.signal(signum, handler)


def _check_main(argv: list[str]) -> int:
    from dpcost.procs import OneLineErrorParser, print_out

    script_args = []
    if "--" in argv:
        argv, script_args = argv[:argv.index("--")], argv[argv.index("--") + 1:]
    parser = OneLineErrorParser(prog="python -m dpcost.migration check",
                                description=CHECK_HELP,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("dp_script", help="the one-process (DataParallel) script")
    parser.add_argument("ddp_script", help="the DDP script, run under torchrun")
    parser.add_argument("--nproc", type=int, default=2, help="DDP ranks (default 2)")
    parser.add_argument("--atol", type=_number, default=DEFAULT_ATOL,
                        help=f"largest parameter difference accepted (default {DEFAULT_ATOL:g})")
    parser.add_argument("--optimizer-tolerance", type=_number, default=ADAPTIVE_RTOL,
                        help="for an adaptive optimizer: the fraction of lr x steps accepted "
                             f"(default {ADAPTIVE_RTOL:g})")
    parser.add_argument("--timeout-s", type=_number, default=300.0,
                        help="time limit per script run (default 300)")
    parser.add_argument("--keep-dropout", action="store_true",
                        help="leave dropout on (the check turns it off in both runs: one "
                             "process and n ranks draw different masks)")
    args = parser.parse_args(argv)
    try:
        with _stopped_by_signals():
            report = check_scripts(args.dp_script, args.ddp_script, args.nproc, script_args,
                                   args.atol, args.optimizer_tolerance, args.timeout_s,
                                   args.keep_dropout)
    except CheckInputError as error:
        print(f"{parser.prog}: error: {error}", file=sys.stderr)
        return 2
    except Stopped as stopped:
        print(f"{parser.prog}: stopped by {stopped.name}: every process it started is ended "
              "and its folders are removed", file=sys.stderr)
        return 128 + stopped.signum
    for line in render_check(args.dp_script, args.ddp_script, report):
        print_out(line)
    return 1 if report["findings"] else 0


def main(argv=None) -> int:
    """``check ...`` (the practitioner's check), or ``--help``; ``CASES.json OUT.json`` is the
    course's own torchrun entry (:func:`run_ddp`)."""
    from dpcost.procs import OneLineErrorParser, run_cli

    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] == ["check"]:
        return run_cli("python -m dpcost.migration check", _check_main, argv[1:])
    if len(argv) == 2 and not argv[0].startswith("-"):
        _torchrun_main(argv[0], argv[1])
        return 0
    parser = OneLineErrorParser(prog="python -m dpcost.migration", description=CHECK_HELP,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("command", choices=["check"], help="check DP_SCRIPT DDP_SCRIPT ...")
    return run_cli("python -m dpcost.migration", lambda: parser.parse_args(argv) and 2)


if __name__ == "__main__":
    sys.exit(main())
