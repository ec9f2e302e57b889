"""Hints for the exercises, revealed one at a time, each giving away a little more.

``HINTS`` is the one source: ``hint(name, k)`` prints hint k (1-based) of exercise ``name``
(terminals, printed notes), ``hint(name)`` the next one; ``hint_button(name)`` is an ipywidgets
button that reveals the next hint at each click and, after the last, the worked solution
(:mod:`dpcost.exercises.solutions`); beside it, a static line tells a reader without a kernel
(the site, a notebook viewer, a printout) where the hints are. The exercise notebooks' markdown
carries them, between ``<!-- BEGIN HINTS name ... -->`` and
``<!-- END HINTS -->``, written from ``HINTS`` by ``python -m dpcost.exercises.hints`` (which
``python -m dpcost.grading.student`` runs first), so the copies cannot drift apart.
The last hint of each exercise comes close to the answer but is never the code.
"""

from __future__ import annotations

import argparse
import html
import re
import sys

from dpcost.exercises import MASTER_DIR, ROOT, STUDENT_DIR
from dpcost.exercises.solutions import solution  # noqa: F401 - the notebooks import it from here

HINTS: dict[str, list[str]] = {
    "dp_communication_volume": [
        "Count GPU0's traffic in one training step. In forward, `replicate` sends the P "
        "parameter bytes from GPU0 to every other GPU; in backward, the gradients (also P "
        "bytes) come back from every other GPU and are summed on GPU0.",
        "There are n - 1 other GPUs, and the model crosses GPU0's link once per other GPU in "
        "each direction: n - 1 copies out, n - 1 copies back.",
        "Before the formula: call `check_model_size_bytes` and `check_num_gpus` (in that order, "
        "so a bad size is reported even for one GPU), and return 0.0 when n <= 1 - one GPU "
        "sends nothing, and the formula would go negative for n < 1.",
        "The answer is 2 x (n - 1) x P, returned as a Python float: wrap the product in "
        "float(...) (the checked n is a Python int, so numpy integers cannot overflow).",
    ],
    "ddp_communication_volume": [
        "DDP all-reduces the P gradient bytes with a ring: a reduce-scatter, then an "
        "all-gather. Count what ONE rank sends.",
        "The ring cuts the gradients into n chunks of P / n bytes. Each phase has n - 1 steps, "
        "and in every step each rank sends exactly one chunk to its neighbour.",
        "So one rank sends (n - 1) chunks in each of the two phases. Check the inputs first and "
        "return 0.0 for n <= 1, as in dp_communication_volume.",
        "The answer is 2 x (n - 1) / n x P as a Python float - exactly "
        "dp_communication_volume divided by n. Divide by n before multiplying by P, so a huge "
        "P does not overflow to inf.",
    ],
    "dp_gpu0_memory_multiplier": [
        "Under DataParallel, GPU0 gathers the outputs of all n replicas and computes the loss "
        "over the whole batch.",
        "How many GPUs' worth of outputs does GPU0 hold, compared with what one GPU holds "
        "for its own share of the batch?",
        "The function depends on num_gpus only. Check it with `check_num_gpus` - there is no "
        "special case for n <= 1: the contract returns n as given.",
        "Return the checked num_gpus itself, converted to a Python float.",
    ],
    "ddp_gpu0_memory_multiplier": [
        "Under DDP, every rank runs the same model on its own 1/n of the batch and computes "
        "its own loss.",
        "Does rank 0 hold anything that the other ranks do not? Compare rank 0 with any "
        "other rank.",
        "The answer does not depend on n at all - but a bad num_gpus must still raise: call "
        "`check_num_gpus` first, even though you do not use its result.",
        "After checking the input, return the constant 1 as a Python float (1.0).",
    ],
    "communication_reduction_factor": [
        "This is the DP volume divided by the DDP volume. Write both formulas and divide them "
        "on paper before writing any code.",
        "P cancels: the factor does not depend on the model size. So do not compute it by "
        "dividing the two volumes - at P = 0 that is 0 / 0.",
        "Both volumes are 0 for n <= 1; the contract says the factor is then 1.0 (neither "
        "pattern is worse). Still check model_size_bytes, even though P cancels.",
        "Check both inputs, return 1.0 when n <= 1, otherwise return n as a Python float.",
    ],
    "reduce_scatter_sends": [
        "A step is a list of (src, dst, chunk) triples, all happening at once. In a ring every "
        "rank sends to its right neighbour: dst = (src + 1) % n.",
        "At step 0, each rank r starts with its own chunk: it sends chunk r. The receiver ADDS "
        "it to its copy, so that chunk now sums two ranks' data.",
        "At the next step, each rank passes on the chunk it just added to - the one its left "
        "neighbour sent it. So the chunk index moves one back per step.",
        "At step s, rank r sends chunk (r minus s), taken modulo n, to rank (r + 1) modulo n: "
        "one triple per rank, n triples per step.",
    ],
    "all_gather_sends": [
        "After reduce-scatter, each rank holds one chunk that is fully summed: rank r holds "
        "chunk (r + 1) % n. All-gather only has to copy these around the ring.",
        "The receiver OVERWRITES its copy with what it receives. Every rank still sends to "
        "its right neighbour, one chunk per step.",
        "At step 0 each rank sends the chunk it holds fully summed; at the next step it "
        "forwards the one it just received - the chunk index again moves one back per step.",
        "At step s, rank r sends chunk (r + 1 minus s), modulo n, to rank (r + 1) modulo n.",
    ],
    "train_ddp": [
        "torchrun has set RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT: start with "
        "`dist.init_process_group(\"gloo\")`, and put everything after it in a try whose finally "
        "calls `dist.destroy_process_group()`.",
        "Each rank must read different samples: replace ShuffleEachEpoch with a "
        "`DistributedSampler(dataset, seed=seed)`, keep calling `set_epoch(epoch)` every epoch, "
        "and give the DataLoader a batch of global_batch divided by `dist.get_world_size()`.",
        "Seed as before, build the model, then wrap it: `DistributedDataParallel(model)` (no "
        "device_ids on CPU). Train through the wrapper - its backward averages the gradients over "
        "the ranks - and keep the mean loss.",
        "Only rank 0 saves (`dist.get_rank() == 0`) the unwrapped model's state_dict - the module "
        "inside the wrapper - then every rank waits at `dist.barrier()`; return that unwrapped "
        "module.",
    ],
}


def hint_text(name: str, k: int) -> str:
    """Hint ``k`` (1-based) of exercise ``name``, as text."""
    if name not in HINTS:
        raise ValueError(f"name must be one of {', '.join(HINTS)}; got {name!r}")
    count = len(HINTS[name])
    if isinstance(k, bool) or not isinstance(k, int):
        raise TypeError(f"k must be an int hint number, got {type(k).__name__} {k!r}")
    if not 1 <= k <= count:
        raise ValueError(f"k must be a hint number from 1 to {count} for {name}, got {k}")
    return HINTS[name][k - 1]


_next_hint: dict[str, int] = {}  # hint(name) without k: the next hint number per exercise


def hint(name: str, k: int | None = None) -> None:
    """Print hint ``k`` of exercise ``name``; without ``k``, the next one (1, 2, ... per name).

    After the last hint, ``hint(name)`` says how to see the worked solution.
    """
    count = len(HINTS[name]) if name in HINTS else 0
    if k is None:
        hint_text(name, 1)  # validates name
        k = _next_hint.get(name, 1)
        if k > count:
            print(f"No more hints for {name} (all {count} shown). The worked solution: "
                  f"solution({name!r}).")
            return
    text = hint_text(name, k)
    _next_hint[name] = max(_next_hint.get(name, 1), k + 1)
    after = (f" (That was the last hint; the worked solution: solution({name!r}).)"
             if k == count else "")
    print(f"Hint {k}/{count} for {name}: {text}{after}")


def hint_button(name: str):
    """An ipywidgets box: each click reveals the next hint of ``name``, then the worked solution.

    Displayed in a notebook it leaves two outputs: the button (which needs a kernel; its text
    form is one short line) and a static line for readers without a kernel, see
    ``static_bundle``. The hints show once: in the box, as they are revealed.
    """
    import ipywidgets as widgets

    from dpcost.exercises.solutions import solution_text

    class HintButton(widgets.VBox):
        def __repr__(self):
            return f"Hint button: {count} hints for {name}, then its worked solution"

        def _ipython_display_(self):
            from IPython.display import display

            display(self._repr_mimebundle_(), raw=True)
            display(static_bundle(name), raw=True)

    hint_text(name, 1)  # validates name
    count = len(HINTS[name])
    button = widgets.Button(description=f"Show hint 1 of {count}", icon="lightbulb-o")
    shown = widgets.HTML(value="")
    box = HintButton([button, shown])
    box.revealed = 0  # how many hints are showing; tests and notebooks read it
    box.solution_shown = False

    def reveal(_=None):
        if box.revealed < count:
            box.revealed += 1
        elif not box.solution_shown:
            box.solution_shown = True
        else:
            return
        items = "".join(f"<li>{_html(text)}</li>" for text in HINTS[name][: box.revealed])
        worked = (f"<p><b>The worked solution</b> (compare it with yours):</p>"
                  f"<pre>{html.escape(solution_text(name))}</pre>" if box.solution_shown else "")
        shown.value = f"<ol>{items}</ol>{worked}"
        if box.solution_shown:
            button.description, button.disabled = "All hints and the solution shown", True
        elif box.revealed == count:
            button.description = "Show the worked solution"
        else:
            button.description = f"Show hint {box.revealed + 1} of {count}"

    button.on_click(reveal)
    box.reveal = reveal  # lets a test (or a notebook cell) click without a browser
    return box


def _html(text: str) -> str:
    # `code` spans in the hint text become <code> in HTML.
    return re.sub(r"`([^`]+)`", r"<code>\1</code>", html.escape(text, quote=False))


HINTS_SECTION = "Hints without widgets"


def static_bundle(name: str) -> dict[str, str]:
    """The static output beside a hint button: one line for a reader without a kernel (the
    site, a notebook viewer, a printout), pointing to the hints in the notebook's markdown."""
    hint_text(name, 1)  # validates name
    count = len(HINTS[name])
    line = (f"{count} hints for {name}, then its worked solution: click the button above (it "
            f"needs a running kernel). Without one, the hints are folded under "
            f"\"{HINTS_SECTION}\" at the end of this notebook.")
    return {"text/html": f'<p class="dpcost-hints">{_html(line)}</p>', "text/plain": line}


# ----------------------------------------------------------------------------------------------
# The hints in the notebooks' markdown, generated from HINTS.

END_MARK = "<!-- END HINTS -->"
_REGION = re.compile(r"(<!-- BEGIN HINTS ([\w ]+?) \(generated[^>]*-->\n)(.*?)(<!-- END HINTS -->)",
                     re.S)


def hints_markdown(names: list[str]) -> str:
    """Markdown for every hint of ``names``: a line per exercise, then one ``<details>`` per hint.

    The blank lines inside ``<details>`` let Jupyter, the site and GitHub render the text as
    markdown (the `code` spans), as the lessons' folded answers do.
    """
    parts = []
    for name in names:
        hint_text(name, 1)  # an unknown name fails here, with the known ones listed
        count = len(HINTS[name])
        parts.append(f"**`{name}`**\n")
        for k, text in enumerate(HINTS[name], start=1):
            parts.append(f"<details><summary>Hint {k} of {count}</summary>\n\n{text}\n</details>\n")
        parts.append(f"After the last hint: the worked solution, `solution(\"{name}\")` in a code "
                     "cell (or the hint button's last click).\n")
    return "\n".join(parts)


def hint_region(names: list[str]) -> str:
    """A whole generated region, markers included, ready to put in a markdown cell."""
    return (f"<!-- BEGIN HINTS {' '.join(names)} (generated from dpcost/exercises/hints.py by "
            f"python -m dpcost.exercises.hints; do not edit) -->\n{hints_markdown(names)}"
            f"{END_MARK}")


def regions(markdown: str) -> list[tuple[list[str], str]]:
    """``[(names, text between the markers), ...]`` for every hint region in ``markdown``."""
    return [(m.group(2).split(), m.group(3)) for m in _REGION.finditer(markdown)]


def sync_markdown(markdown: str) -> str:
    """``markdown`` with every hint region rewritten from ``HINTS``."""
    if markdown.count("<!-- BEGIN HINTS") != len(regions(markdown)):
        raise ValueError("a <!-- BEGIN HINTS ... --> marker without its <!-- END HINTS -->")
    return _REGION.sub(lambda m: m.group(1) + hints_markdown(m.group(2).split()) + m.group(4),
                       markdown)


def sync_notebook(notebook) -> bool:
    """Rewrite the hint regions of ``notebook``'s markdown cells; True if anything changed."""
    changed = False
    for cell in notebook.cells:
        if cell.cell_type == "markdown" and "<!-- BEGIN HINTS" in cell.source:
            new = sync_markdown(cell.source)
            changed |= new != cell.source
            cell.source = new
    return changed


def main(argv: list[str] | None = None) -> int:
    """Rewrite the masters' hint regions (``--check``: exit 1 if one is stale, write nothing)."""
    import nbformat


    parser = argparse.ArgumentParser(prog="python -m dpcost.exercises.hints",
                                     description=main.__doc__)
    parser.add_argument("--check", action="store_true")
    args = parser.parse_args(argv)
    stale = []
    paths = sorted(MASTER_DIR.glob("ex*.ipynb"))
    if args.check:  # the student versions are written from the masters, check them too
        paths += sorted(STUDENT_DIR.glob("ex*.ipynb"))
    for path in paths:
        notebook = nbformat.read(path, as_version=4)
        if sync_notebook(notebook):
            stale.append(path)
            if not args.check:
                nbformat.write(notebook, path)
                print(f"rewrote the hints in {path.relative_to(ROOT)}")
    if args.check:
        for path in stale:
            print(f"hints out of date in {path.relative_to(ROOT)} "
                  f"(run: python -m dpcost.grading.student)")
        return 1 if stale else 0
    return 0


if __name__ == "__main__":
    sys.exit(main())
