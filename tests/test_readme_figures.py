"""Every figure that README.md quotes from a lesson agrees with what that lesson computes or
measured, so the two cannot drift apart again.

Each test finds the README's sentence (whitespace folded, so line wraps do not matter) and
compares its numbers with the lesson's committed output, which strict nbval checks against a
fresh run for every cell without ``# NBVAL_IGNORE_OUTPUT``, or recomputes them with the lesson's
own functions. A README edit that drops a sentence fails here: change the test with it.
"""

import json
import re
from pathlib import Path

import pytest

from dpcost.buckets import ddp_buckets_from_sizes
from dpcost.dataparallel_traffic import (
    busy_time_ratio,
    resnet50_parameter_bytes,
    resnet50_ready_order_bytes,
)
from dpcost.memory import model_state_bytes_per_parameter

ROOT = Path(__file__).resolve().parents[1]
README = " ".join((ROOT / "README.md").read_text().split())


def quoted(pattern: str) -> tuple[str, ...]:
    match = re.search(pattern, README)
    assert match, f"README.md no longer says /{pattern}/: update this test with the README"
    return match.groups()


def lesson_output(notebook: str, source_contains: str) -> str:
    """The printed text of the one code cell of ``notebook`` whose source holds the string."""
    cells = json.loads((ROOT / "notebooks" / notebook).read_text())["cells"]
    found = [cell for cell in cells if cell["cell_type"] == "code"
             and source_contains in "".join(cell["source"])]
    assert len(found) == 1, f"{notebook}: {len(found)} cells contain {source_contains!r}"
    return "".join("".join(out.get("text", "")) for out in found[0]["outputs"])


def test_the_nccl_path_ratio_at_n_8():
    (ratio,) = quoted(r"only \*\*n/\(n−1\)\*\* times a DDP rank's \(([\d.]+) at n = 8\)")
    assert ratio == f"{busy_time_ratio(8, 'nccl'):.2f}" == "1.14"


def test_the_measured_chain_ratios_are_lesson_06s():
    ratios = quoted(r"Measured over gloo with a chunked chain: ([\d.]+), ([\d.]+) and ([\d.]+) "
                    r"at n = 2, 3, 4 \(lesson 06\)")
    printed = lesson_output("06_measure_it.ipynb", "busiest_link_ratio_dp_nccl_over_ddp")
    measured = re.findall(r"n = (\d): on the NCCL path DP's busiest link is busy ([\d.]+)x",
                          printed)
    assert [n for n, _ in measured] == ["2", "3", "4"]
    assert list(ratios) == [ratio for _, ratio in measured]


def test_the_resnet50_step_times_are_lesson_02s():
    ddp, exposed, dp_nccl, dp_copy = quoted(
        r"DDP ([\d.]+) ms per step with ([\d.]+) ms of communication exposed, DP ([\d.]+) ms on "
        r"the NCCL path and ([\d.]+) ms on the copy path")
    printed = lesson_output("02_ring_allreduce.ipynb", "DDP (rebuilt buckets)")
    rows = {name.strip(): (float(total), float(hidden)) for name, total, hidden in re.findall(
        r"^(.+?)\s+([\d.]+) ms; communication\s+[\d.]+ ms, exposed\s+([\d.]+) ms", printed, re.M)}
    assert f"{rows['DDP (rebuilt buckets)'][0]:.1f}" == ddp
    assert f"{rows['DDP (rebuilt buckets)'][1]:.1f}" == exposed
    assert f"{rows['DP, NCCL path'][0]:.1f}" == dp_nccl
    assert f"{rows['DP, copy path'][0]:.1f}" == dp_copy


def test_resnet50s_buckets():
    first, rebuilt, fc = quoted(r"ResNet-50: one ([\d.]+) MB bucket in the first iteration, then "
                                r"(\w+) rebuilt ones, none of 1 MiB, since `fc.weight` alone is "
                                r"([\d.]+) MB")
    order = resnet50_ready_order_bytes()
    (everything,) = ddp_buckets_from_sizes(order, first_iteration=True)
    buckets = ddp_buckets_from_sizes(order)
    fc_bytes = resnet50_parameter_bytes()[-2][1]  # the classifier's weight (torch's fc.weight)
    assert fc_bytes == 2048 * 1000 * 4
    assert f"{everything / 1e6:.0f}" == first
    assert ["one", "two", "three", "four", "five", "six"][len(buckets) - 1] == rebuilt
    assert f"{fc_bytes / 1e6:.1f}" == fc and fc_bytes > 2**20
    assert min(buckets) > 2**20  # none of 1 MiB: the first one already holds fc.weight


def test_model_state_per_parameter():
    adam, bf16 = quoted(r"Model state is (\d+) B per parameter with Adam in fp32 and in mixed "
                        r"precision \(ZeRO paper §3.1\), (\d+) B in pure bf16")
    def per_parameter(precision):
        return sum(model_state_bytes_per_parameter(precision, "adam").values())

    assert per_parameter("fp32") == per_parameter("mixed") == int(adam)
    assert per_parameter("bf16") == int(bf16)


def test_gpu0_memory_ratios_are_lesson_04s():
    resnet, low, high = quoted(r"ResNet-50's GPU0 holds about ([\d.]+)× a DDP rank's memory; "
                               r"GPT-2 small's, in mixed precision with SDPA, ([\d.]+)–([\d.]+)× "
                               r"at n = 2–8 with 4 sequences per GPU")
    presets = lesson_output("04_gpu0_memory.ipynb", "fits in 80 GB?")
    (resnet_row,) = re.findall(r"^ResNet-50\s+\d+\s+[\d.]+\s+[\d.]+\s+([\d.]+)", presets, re.M)
    assert resnet_row == resnet
    table = lesson_output("04_gpu0_memory.ipynb", "gpt2_configs = [")
    ratios = {(int(n), int(b)): float(r) for n, b, r in re.findall(
        r"^\s+(\d+)\s+(\d+)\s+DP GPU0 .* ([\d.]+)x$", table, re.M)}
    four_each = [ratios[(n, 4 * n)] for n in (2, 4, 8)]
    assert f"{min(four_each):.1f}" == low and f"{max(four_each):.1f}" == high


@pytest.mark.parametrize("sentence", [
    r"every rank's bytes match the model within ([\d.]+) %",
    r"measured/predicted within ([\d.]+) % for n = 2–4",
])
def test_measured_bytes_within_what_lesson_06_measured(sentence):
    """Lesson 06 prints measured/predicted per rank and direction (its run is recorded; the
    cell's assertion holds every fresh run to 0.5 %): the README's bound covers the record."""
    (percent,) = quoted(sentence)
    printed = lesson_output("06_measure_it.ipynb", "print(render_table(reports[4]))")
    # rank, sent MB, predicted, ratio, extra B, then the same for received: extra / predicted
    rows = re.findall(r"^\s+\d+\s+[\d.]+\s+([\d.]+)\s+[\d.]+\s+(\d+)\s+[\d.]+\s+([\d.]+)\s+"
                      r"[\d.]+\s+(\d+)", printed, re.M)
    excess = [int(extra) / (float(predicted) * 1e6) for row in rows
              for predicted, extra in (row[:2], row[2:])]
    assert len(excess) >= 8 and max(excess) * 100 <= float(percent)


def test_strategies_bytes_within_what_lesson_08_measured():
    fsdp, others, payload, framing = quoted(
        r"to within ([\d.]+) % for FSDP's two rungs and ([\d.]+) % for the others \(lesson 08: "
        r"the 1 MB model, n = 2; PowerSGD: its (\d+) KB of payload plus about (\d+) B of framing "
        r"per all-reduce\)")
    printed = lesson_output("08_beyond_ddp.ipynb", "ss.bytes_excess(report)")
    assert f"FSDP (both rungs): within {fsdp} %" in printed
    assert f"every other rung but PowerSGD: within {others} %" in printed
    assert f"PowerSGD: {payload} KB of payload + about {framing} B of framing" in printed


def test_fsdp_on_gloo_moves_an_all_reduce():
    gloo, nccl = quoted(r"FSDP full sharding moves (\d)\(n−1\)/n·P per rank on gloo against "
                        r"(\d)\(n−1\)/n·P on NCCL")
    printed = lesson_output("08_beyond_ddp.ipynb", "for reshard in (True, False):")
    n = 2
    line = re.search(r"reshard_after_forward=True : NCCL ([\d.]+) P, gloo ([\d.]+) P", printed)
    assert float(line[1]) == int(nccl) * (n - 1) / n and float(line[2]) == int(gloo) * (n - 1) / n


def test_which_strategies_fit_llama_2():
    quoted(r"Llama-2 7B on 8 GPUs fits an 80 GB GPU's model state with ZeRO-1 or FSDP; 70B on 64 "
           r"GPUs only with full sharding \(lesson 08\)")
    printed = lesson_output("08_beyond_ddp.ipynb", '"Llama-2 7B, n = 8"')
    fits = {"7B": [], "70B": []}
    for rung, seven, seventy in re.findall(r"^(.+?)\s+[\d.]+\s+(fits|no)\s+[\d.]+\s+(fits|no)$",
                                           printed, re.M):
        for model, verdict in (("7B", seven), ("70B", seventy)):
            if verdict == "fits":
                fits[model].append(rung.strip())
    assert fits == {"7B": ["ZeRO-1", "FSDP no reshard", "FSDP full sharding"],
                    "70B": ["FSDP full sharding"]}


def test_gloo_framing_predicted_within_what_lesson_06_measured():
    (percent,) = quoted(r"predicts it to within a few preambles per window \(at most ([\d.]+) % of "
                        r"DDP's framing at n = 4;")
    printed = lesson_output("06_measure_it.ipynb", "print(render_table(reports[4]))")
    ddp = printed[:printed.index("\ndp:")]  # the DDP block comes first
    predicted, difference = re.search(
        r"extra B predicted from the messages gloo sends \(48-byte preambles\): (\d+),.*"
        r"largest difference from the measured extra (\d+) B per iteration", ddp).groups()
    assert int(difference) / int(predicted) * 100 <= float(percent)
