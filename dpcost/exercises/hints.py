"""Hints for the exercises, revealed one at a time, each giving away a little more.

``hint(name, k)`` prints hint k (1-based) for exercise ``name`` (terminals, printed notes);
``hint_button(name)`` returns an ipywidgets button that reveals the next hint at each click.
The last hint of each exercise comes close to the answer but is never the code.
"""

from __future__ import annotations

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


def hint(name: str, k: int) -> None:
    """Print hint ``k`` of ``count`` for exercise ``name``."""
    print(f"Hint {k}/{len(HINTS.get(name, ()))} for {name}: {hint_text(name, k)}")


def hint_button(name: str):
    """An ipywidgets box: a button that reveals the next hint of ``name`` at each click."""
    import ipywidgets as widgets

    hint_text(name, 1)  # validates name
    count = len(HINTS[name])
    button = widgets.Button(description=f"Show hint 1 of {count}", icon="lightbulb-o")
    shown = widgets.HTML(value="")
    box = widgets.VBox([button, shown])
    box.revealed = 0  # how many hints are showing; tests and notebooks read it

    def reveal(_=None):
        if box.revealed >= count:
            return
        box.revealed += 1
        items = "".join(f"<li>{_html(text)}</li>" for text in HINTS[name][: box.revealed])
        shown.value = f"<ol>{items}</ol>"
        if box.revealed == count:
            button.description, button.disabled = "No more hints", True
        else:
            button.description = f"Show hint {box.revealed + 1} of {count}"

    button.on_click(reveal)
    box.reveal = reveal  # lets a test (or a notebook cell) click without a browser
    return box


def _html(text: str) -> str:
    import html
    import re

    # `code` spans in the hint text become <code> in the widget.
    return re.sub(r"`([^`]+)`", r"<code>\1</code>", html.escape(text))
