"""What the warm process (``launch.warm_context``, multiprocessing's forkserver) imports once,
before it forks any helper or rank; ranks that torchrun starts import it first too.

torch, ``torch._dynamo`` (DDP's constructor imports it) and ``torch.distributed``: slow imports,
paid once per session instead of once per run.

Then ``gc.freeze()``, Python's own pre-fork idiom (its documentation, ``gc.freeze``): the
collector never walks these objects again, neither in the forked children, whose pages then stay
shared, nor when the process exits. So the warm process ends sooner (its caller waits for it at
exit), and so does a torchrun rank; docs/ci.md gives the figures.
"""

import gc

import torch  # noqa: F401
import torch._dynamo  # noqa: F401
import torch.distributed  # noqa: F401

gc.freeze()
