"""The explorer's pure model as the page sees it: explore(settings) -> plain data.

The readout's numbers are recomputed here from ``scenario`` and the memory model; the widget's
readout is checked in tests/test_explorer.py, the page's in tests/test_site_explorer_browser.py.
"""

from __future__ import annotations

import json
import math

import pytest

from dpcost import explorer_model as X
from dpcost.memory import COMPONENTS, total_bytes
from dpcost.presets import GPUS, INTERCONNECTS, MODELS
from dpcost.units import format_bytes, format_seconds


def _scenario(model="GPT-2 XL", gpus=8, batch=None, **kw):
    preset = MODELS[model]
    return X.scenario(preset, kw.get("precision", "mixed"), gpus, kw.get("gpus_per_node", 8),
                      INTERCONNECTS["NVLink 4 (H100)"], INTERCONNECTS["InfiniBand NDR"],
                      GPUS["H100 SXM 80GB"], kw.get("bucket_cap_mb"), "adam",
                      batch or preset.default_batch_size, "sdpa")


def test_explore_is_json_and_its_readout_holds_the_scenarios_numbers():
    result = X.explore({})
    assert json.loads(json.dumps(result, allow_nan=False)) == result
    assert result["ok"] and result["errors"] == {} and result["hash"] == ""
    s = _scenario()
    rows = {row["name"]: row for row in result["readout"]["rows"]}
    assert list(rows) == [X.DP_COPY, X.DP_NCCL, X.DDP_RING, X.HSDP]
    for name, path in ((X.DP_COPY, "copy"), (X.DP_NCCL, "nccl")):
        st, values = s["steps"][name], rows[name]["values"]
        assert values["busiest_bytes"] == s["dp_bytes"][path]
        assert (values["total_s"], values["exposed_s"]) == (st.total_s,
                                                            st.exposed_communication_s)
        busy = format_bytes(s["dp_bytes"][path], digits=3)
        assert rows[name]["cells"][0].startswith(f"GPU0 {busy}")
        assert rows[name]["cells"][1] == format_seconds(st.total_s)
    ddp = rows[X.DDP_RING]["values"]
    assert ddp["busiest_bytes"] == s["ddp_bytes"] == 2 * 7 / 8 * MODELS["GPT-2 XL"].parameters * 2
    assert ddp["buckets"] == s["ddp_buckets"] and ddp["hidden"] == s["hidden"][X.DDP_RING]
    memory = {item["key"]: item for item in result["readout"]["memory"]}
    for key, parts in s["memory"].items():
        assert memory[key]["bytes"] == total_bytes(parts) and memory[key]["fits"] == s["fits"][key]
    assert result["readout"]["verdict"] == X.verdict(s)


def test_the_figures_data_are_the_scenarios_curves_steps_and_memory():
    result = X.explore({"model": "Llama-2 7B", "gpus": "64"})
    s = _scenario("Llama-2 7B", 64)
    volume = result["volume"]
    ddp_rows = [(r["n"], r["bytes"]) for r in volume["rows"] if r["series"] == X.CURVE_NAMES["ddp"]]
    assert ddp_rows == [(n, v) for n, v in zip(X.CURVE_GPUS, s["ddp_curve"], strict=True) if v > 0]
    dp_ns = {r["n"] for r in volume["rows"] if r["series"] != X.CURVE_NAMES["ddp"]}
    assert max(dp_ns) == 8  # DataParallel's curves stop at one node
    assert volume["markers"] == [{"n": 64, "bytes": s["ddp_allreduce_bytes"],
                                  "series": X.CURVE_NAMES["ddp"]}]
    steps = result["steps"]
    assert steps["rows"] == [X.DP_COPY, X.DP_NCCL, X.DDP_TWO_LEVEL, X.DDP_FLAT, X.HSDP]
    labels = {label["row"]: label["label"] for label in steps["labels"]}
    assert labels[X.DP_COPY] == f" {X.CANNOT_SPAN}"
    assert labels[X.DDP_FLAT] == f" {format_seconds(s['steps'][X.DDP_FLAT].total_s)}"
    memory = result["memory"]
    assert memory["capacity_bytes"] == 80e9
    assert [t["label"] for t in memory["totals"]][0] == "one node"
    ddp_parts = [p for p in memory["parts"] if p["strategy"] == "DDP"]
    assert sum(p["bytes"] for p in ddp_parts) == pytest.approx(total_bytes(s["memory"]["ddp"]),
                                                               rel=1e-15)
    assert [p["order"] for p in ddp_parts] == sorted(COMPONENTS.index(p["component"])
                                                     for p in ddp_parts)


@pytest.mark.parametrize("settings,control,message", [
    ({"model": "custom", "custom": "abc"}, "custom", "custom parameters 'abc'"),
    ({"model": "custom", "custom": "1GB"}, "custom", "give a plain count"),
    ({"model": "custom", "custom": "2e12"}, "custom", "at most 1e12"),
    ({"batch_size": "0"}, "batch_size", "batch_size must be >= 1, got 0"),
    ({"batch_size": "x"}, "batch_size", "batch_size must be a whole number such as 64"),
    ({"batch_size": "2e3"}, "batch_size", "whole number"),
    ({"batch_size": str(2**20 + 1)}, "batch_size", "batch_size must be <= 1048576"),
    ({"outputs": "-1"}, "outputs", "outputs must be >= 1"),
    ({"gpus": "3"}, "gpus", "gpus must be one of"),
    ({"precision": "fp8"}, "precision", "precision must be one of"),
    ({"bucket_cap_mb": "7"}, "bucket_cap_mb", "bucket_cap_mb must be one of"),
    ({"bucket_cap_mb": "0.4"}, "bucket_cap_mb", "bucket_cap_mb must be one of"),
    # 2e12 bytes of 16-bit gradients in 1 MiB buckets: more than Setting.MAX_BUCKETS
    ({"model": "custom", "custom": "1e12", "bucket_cap_mb": "1"}, "bucket_cap_mb",
     "bucket_cap_mb"),
    ({"model": "GPT-5"}, "model", "model must be one of"),
])
def test_bad_input_gets_a_message_for_its_control_and_nothing_else(settings, control, message):
    result = X.explore(settings)
    assert not result["ok"] and list(result["errors"]) == [control]
    assert message in result["errors"][control]
    assert "readout" not in result and json.dumps(result, allow_nan=False)


def test_the_messages_for_the_custom_count_are_the_widgets():
    """The widget shows parse_parameter_count's message; the page gets the same text."""
    for text in ("abc", "1GB", "", "-5", "0.2", "9" * 100):
        with pytest.raises(ValueError) as error:
            X.parse_parameter_count(text)
        assert X.explore({"model": "custom", "custom": text})["errors"] == {
            "custom": str(error.value)}


def test_the_url_fragment_round_trips_and_holds_only_what_changed():
    settings = {"model": "Llama-2 7B", "gpus": 64}
    fragment = X.settings_to_hash(settings)
    assert fragment == "model=Llama-2%207B&gpus=64"  # the example
    back = X.explore(X.settings_from_hash("#" + fragment))
    assert back["settings"]["model"] == "Llama-2 7B" and back["settings"]["gpus"] == 64
    assert back["settings"]["batch_size"] == MODELS["Llama-2 7B"].default_batch_size
    every = {"model": "custom", "custom": "7.5e9 ", "precision": "bf16", "attention": "eager",
             "gpus": "256", "gpus_per_node": "16", "intra_link": "PCIe 4.0 x16",
             "inter_link": "100 GbE", "gpu": "A100 SXM 80GB", "bucket_cap_mb": "100",
             "optimizer": "sgd_momentum", "batch_size": "3", "outputs": "32000"}
    first = X.explore(every)
    again = X.explore(X.settings_from_hash(first["hash"]))
    assert again["settings"] == first["settings"] and again["readout"] == first["readout"]
    assert X.settings_from_hash("unknown=1&gpus=8&junk") == {"gpus": "8"}


def test_controls_offer_the_widgets_choices_and_every_default_is_one_of_them():
    c = X.controls()
    assert c["order"] == list(X.CONTROL_LABELS)
    for name, options in c["options"].items():
        if options is not None:
            assert c["defaults"][name] in [value for _, value in options], name
    assert [v for _, v in c["options"]["gpus"]] == X.GPU_CHOICES
    assert c["model_defaults"]["ResNet-50"] == {"batch_size": 256, "outputs": 1000}
    assert json.loads(json.dumps(c)) == c


def test_the_bucket_cap_reaches_ddps_setting_and_the_readout_counts_its_buckets():
    """25 MiB, torch's default, is DDP left to its own caps (1 MiB first); another cap is
    DDP(bucket_cap_mb=...). The readout's bucket count and time line follow the scenario."""
    assert X.explore({"bucket_cap_mb": "25"}) == X.explore({})  # the default, not in the URL
    for text, cap in (("25", None), ("1", 1), ("250", 250)):
        result = X.explore({"bucket_cap_mb": text})
        s = _scenario(bucket_cap_mb=cap)
        assert s["bucket_cap_mb"] == cap and result["settings"]["bucket_cap_mb"] == int(text)
        assert s["result"].setting.bucket_cap_mb == cap
        time, line = result["readout"]["time"], result["readout"]["time_line"]
        assert time["buckets"] == s["ddp_buckets"] == len(s["result"].buckets)
        assert f"bucket cap {text} MiB" in line and f"{s['ddp_buckets']} buckets" in line
        assert time["bound"] == s["result"].compute.bound
        ddp = {row["name"]: row for row in result["readout"]["rows"]}[X.DDP_RING]["values"]
        assert ddp["buckets"] == s["ddp_buckets"]
        assert ddp["total_s"] == s["steps"][X.DDP_RING].total_s
        assert result["hash"] == ("" if text == "25" else f"bucket_cap_mb={text}")


def test_explore_json_answers_every_request_even_a_broken_one():
    ok = json.loads(X.explore_json(json.dumps({"gpus": "16"})))
    assert ok["ok"] and ok["settings"]["gpus"] == 16
    broken = json.loads(X.explore_json("[1, 2"))
    assert not broken["ok"] and "JSONDecodeError" in broken["errors"][""]
    assert not math.isnan(json.loads(X.explore_json("{}"))["volume"]["rows"][0]["bytes"])
