"""Run ``python -m dpcost.measure``'s main under torchrun, then count this rank's gloo threads.

Used by test_measure_torchrun.py. After main has returned (and so after
``destroy_process_group``) each rank writes $DPCOST_PROBE_DIR/rank<R>.json: {"probe_rank",
"status", "gloo_threads_before_destroy", "gloo_threads_after_destroy"}. A file, not stdout:
torchrun merges the ranks' stdout, and two ranks' lines can interleave. A gloo thread alive
after destroy is what aborted ranks at exit when torch._dynamo was imported after
init_process_group (dpcost/measure/worker.py: run_rank).
"""

import json
import os
import sys
from pathlib import Path

import torch.distributed as dist

from dpcost.measure.__main__ import main
from dpcost.measure.worker import gloo_threads

seen = {}
destroy = dist.destroy_process_group


def destroy_counting(*args, **kwargs):
    seen["before"] = gloo_threads()
    return destroy(*args, **kwargs)


dist.destroy_process_group = destroy_counting  # run_rank looks it up when it calls it
status = main(sys.argv[1:])
rank = int(os.environ["RANK"])
probe = {"probe_rank": rank, "status": status, "gloo_threads_before_destroy": seen.get("before"),
         "gloo_threads_after_destroy": gloo_threads()}
Path(os.environ["DPCOST_PROBE_DIR"], f"rank{rank}.json").write_text(json.dumps(probe))
sys.exit(status)
