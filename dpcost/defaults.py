"""The course's one default for each knob; every view (explorer, plan, evaluator, plots) reads
them here. Why each one is what it is: README.md, "Defaults the course uses".

Functions that model what the course measures on a CPU (gloo, fp32) ask for ``"fp32"`` by name.
"""

PRECISION = "mixed"  # 16-bit parameters and gradients, fp32 master and moments (ZeRO Sec. 3.1)
ATTENTION = "sdpa"  # F.scaled_dot_product_attention: what nn.MultiheadAttention and HF use
OPTIMIZER = "adam"
UTILISATION = 0.4  # step_time.compute_time's default only; the course's steps use dpcost.gpu_time
BUCKET_CAP_MB = 25  # torch/nn/parallel/distributed.py: _DEFAULT_BUCKET_CAP_MB
GPU = "H100 SXM 80GB"
GPUS = 8
GPUS_PER_NODE = 8  # DGX/HGX boards
INTER_LINK = "InfiniBand NDR"
# The link inside a node that each GPU preset comes with.
INTRA_LINK = {"A100 SXM 80GB": "NVLink 3 (A100)", "H100 SXM 80GB": "NVLink 4 (H100)",
              "V100 SXM2 32GB": "NVLink 2 (V100)", "H200 SXM 141GB": "NVLink 4 (H200)"}
