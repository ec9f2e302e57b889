"""Run ``python -m dpcost.measure``'s main under torchrun, then count this rank's gloo threads.

Used by test_measure_torchrun.py. Prints one JSON line per rank after main has returned (and
so after ``destroy_process_group``): {"probe_rank", "status", "gloo_threads_before_destroy",
"gloo_threads_after_destroy"}. A gloo thread alive after destroy is what aborted ranks at exit
when torch._dynamo was imported after init_process_group (dpcost/measure/worker.py: run_rank).
"""

import json
import os
import sys

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
print(json.dumps({"probe_rank": int(os.environ["RANK"]), "status": status,
                  "gloo_threads_before_destroy": seen.get("before"),
                  "gloo_threads_after_destroy": gloo_threads()}), flush=True)
sys.exit(status)
