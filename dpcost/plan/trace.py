"""One forward and backward of a module, traced: FLOPs, saved bytes, gradient-ready order, ops.

One pass on the module's own device (meta for a plan) gives them together:

- FLOPs: ``torch.utils.flop_counter.FlopCounterMode`` around forward and backward (its matmul,
  convolution and attention formulas; operations without a formula count 0). On meta it
  counts attention too (causal counted as full). Its per-op counts give the share of the FLOPs
  in convolutions (``aten.convolution`` and ``convolution_backward``).
- activations: every tensor autograd saves in forward (``torch.autograd.graph.
  saved_tensors_hooks``), deduplicated by storage (``untyped_storage()._cdata``: meta tensors
  have no ``data_ptr``), with the parameters excluded by storage (they are often saved as
  views, ``w.t()``). Two calls are routed to what CUDA runs, since meta and CPU would pick
  another kernel that saves other tensors:
  ``F.scaled_dot_product_attention`` to ``aten._scaled_dot_product_flash_attention``
  (``_scaled_dot_product_efficient_attention`` when a mask is given), which saves no s x s
  matrix (the math kernel that meta and CPU pick saves the probabilities); and ``F.dropout`` to
  ``aten.native_dropout``, which saves a 1-byte bool mask (``at::dropout`` uses the fused op on
  CUDA only, ``is_fused_kernel_acceptable``; elsewhere it multiplies by a mask of the input's
  dtype). ``nn.MultiheadAttention`` calls SDPA inside ``F.multi_head_attention_forward``, which
  a TorchFunctionMode sees as one call (``handle_torch_function`` at its top) and runs with the
  mode off, so while it runs functional's own names ``scaled_dot_product_attention`` and
  ``dropout`` point at the routed calls.
- the order gradients become ready: ``Tensor.register_post_accumulate_grad_hook`` on each
  trainable parameter fires once its gradient is accumulated, which is when DDP's reducer marks
  it ready (``reducer.cpp: Reducer::autograd_hook`` runs on the same AccumulateGrad node).
- ops: every aten op dispatched in forward and backward (a ``TorchDispatchMode``), counted
  apart: those that are views (``OpOverload.is_view``: ``t``, ``view``, ``expand``,
  ``detach``; no kernel, but the host still dispatches them) and those that are not (on a GPU
  each is about one kernel launch: the count ``dpcost.gpu_time`` takes), of them those in
  forward, and the convolutions.

The loss is ``output.float().sum()`` (its backward saves nothing); a tuple or dict output is
reduced over its floating tensors.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["Trace", "trace_step", "ddp_parameters", "ATTENTION_NOTE", "DROPOUT_NOTE"]

ATTENTION_NOTE = ("F.scaled_dot_product_attention (nn.MultiheadAttention's too) counted as "
                  "CUDA's flash kernel (aten._scaled_dot_product_flash_attention; "
                  "memory-efficient kernel with a mask)")
DROPOUT_NOTE = "dropout counted as CUDA's native_dropout (a 1-byte mask)"


@dataclass
class Trace:
    """What one traced step found. Bytes and FLOPs are for the traced (per-GPU) batch."""

    forward_flops: int
    backward_flops: int
    saved_bytes: int  # activations autograd kept for backward, parameters excluded
    ready_order: list  # indices into ddp_parameters(module), in the order gradients were ready
    output_elements: int
    output_bytes: int
    sdpa_calls: int  # calls routed to the fused kernels (0: no SDPA in the module)
    ops: int = 0  # aten ops dispatched in forward and backward that are not views
    views: int = 0  # the view ops dispatched beside them
    forward_ops: int = 0  # of ``ops``, those in forward
    convolutions: int = 0  # of ``ops``, the convolutions (forward and backward)
    conv_flops_share: float = 0.0  # of all the FLOPs, those of convolutions
    saved_by_dtype: dict | None = None  # saved_bytes by dtype ("bfloat16", "bool", ...)


def ddp_parameters(module) -> list:
    """(name, parameter) as DDP lists them: ``named_parameters()`` (shared parameters once, at
    their first name) that require a gradient (``distributed.py: _build_params_for_module``)."""
    return [(name, p) for name, p in module.named_parameters() if p.requires_grad]


class _Routing:
    """The routed calls and how many attention calls took the fused kernels."""

    def __init__(self):
        self.sdpa_calls = 0

    def sdpa(self, query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False,
             scale=None, enable_gqa=False):
        import torch
        import torch.nn.functional as F

        if enable_gqa:  # the fused ops want equal head counts
            return F.scaled_dot_product_attention(query, key, value, attn_mask, dropout_p,
                                                  is_causal, scale=scale, enable_gqa=True)
        self.sdpa_calls += 1
        if attn_mask is None:
            return torch.ops.aten._scaled_dot_product_flash_attention(
                query, key, value, dropout_p, is_causal, scale=scale)[0]
        return torch.ops.aten._scaled_dot_product_efficient_attention(
            query, key, value, attn_mask, True, dropout_p, is_causal, scale=scale)[0]

    @staticmethod
    def dropout(input, p=0.5, training=True, inplace=False):
        import torch
        import torch.nn.functional as F

        if not training or inplace or not 0 < p < 1:
            return F.dropout(input, p, training, inplace)
        return torch.ops.aten.native_dropout(input, p, True)[0]


def _bind(names, args, kwargs):
    bound = dict(zip(names, args, strict=False))
    bound.update(kwargs)
    return bound


def _routing_mode(routing: _Routing):
    import torch.nn.functional as F
    from torch.overrides import TorchFunctionMode

    sdpa_names = ("query", "key", "value", "attn_mask", "dropout_p", "is_causal", "scale")
    dropout_names = ("input", "p", "training", "inplace")
    sdpa, dropout, mha = (F.scaled_dot_product_attention, F.dropout,
                          F.multi_head_attention_forward)

    class FusedKernels(TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            kwargs = dict(kwargs or {})
            if func is sdpa:
                return routing.sdpa(**_bind(sdpa_names, args, kwargs))
            if func is dropout:
                return routing.dropout(**_bind(dropout_names, args, kwargs))
            if func is mha:  # its inner calls, by functional's own names (see above)
                F.scaled_dot_product_attention, F.dropout = routing.sdpa, routing.dropout
                try:
                    return func(*args, **kwargs)
                finally:
                    F.scaled_dot_product_attention, F.dropout = sdpa, dropout
            return func(*args, **kwargs)

    return FusedKernels()


def _op_counter():
    from torch.utils._python_dispatch import TorchDispatchMode

    class OpCounter(TorchDispatchMode):
        """Counts the aten ops dispatched: views apart, convolutions among the others."""

        def __init__(self):
            super().__init__()
            self.ops = self.views = self.convolutions = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            if func.is_view:
                self.views += 1
            else:
                self.ops += 1
                self.convolutions += func.overloadpacket in _convolution_ops()
            return func(*args, **(kwargs or {}))

    return OpCounter()


def _convolution_ops() -> tuple:
    import torch

    aten = torch.ops.aten
    return (aten.convolution, aten._convolution, aten.cudnn_convolution,
            aten.convolution_backward)


def _conv_share(counter) -> float:
    """The share of FlopCounterMode's FLOPs in convolutions, forward and backward."""
    counts = counter.get_flop_counts().get("Global", {})
    total = sum(counts.values())
    conv = _convolution_ops()
    return float(sum(v for op, v in counts.items() if op in conv) / total) if total else 0.0


def _loss(output):
    import torch

    if isinstance(output, torch.Tensor):
        tensors = [output]
    elif isinstance(output, dict):
        tensors = list(output.values())
    elif isinstance(output, (tuple, list)):
        tensors = list(output)
    else:
        tensors = [getattr(output, key) for key in ("logits", "last_hidden_state")
                   if isinstance(getattr(output, key, None), torch.Tensor)]
    tensors = [t for t in tensors if isinstance(t, torch.Tensor) and t.is_floating_point()]
    if not tensors or not any(t.requires_grad for t in tensors):
        raise ValueError("the forward returned no floating tensor that requires a gradient")
    loss = tensors[0].float().sum()  # not sum(...): its 0 + loss would dispatch one more op
    for t in tensors[1:]:
        loss = loss + t.float().sum()
    return tensors, loss


def trace_step(module, example) -> Trace:
    """Run ``module(example)`` and backward once, with the recorders on (see above).

    Raises whatever the forward raises (a shape the module rejects); the hooks are removed and
    the parameters' ``.grad`` cleared either way.
    """
    import torch
    from torch.utils.flop_counter import FlopCounterMode

    params = ddp_parameters(module)
    index = {id(p): i for i, (_, p) in enumerate(params)}
    parameter_storages = {p.untyped_storage()._cdata for p in module.parameters()}
    saved: dict[int, tuple] = {}  # storage -> (bytes, dtype)
    ready: list[int] = []

    def pack(tensor):
        storage = tensor.untyped_storage()
        if storage._cdata not in parameter_storages:
            saved[storage._cdata] = (storage.nbytes(), str(tensor.dtype).removeprefix("torch."))
        return tensor

    handles = [p.register_post_accumulate_grad_hook(lambda p: ready.append(index[id(p)]))
               for _, p in params]
    routing = _Routing()
    was_training = module.training
    module.train()
    try:
        with FlopCounterMode(display=False) as counter, _op_counter() as ops:
            with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t), \
                    _routing_mode(routing):
                output = module(example)
            forward_flops, forward_ops = counter.get_total_flops(), ops.ops
            tensors, loss = _loss(output)
            loss.backward()
        total = counter.get_total_flops()
    finally:
        for handle in handles:
            handle.remove()
        for _, p in params:
            p.grad = None
        module.train(was_training)
    by_dtype: dict[str, int] = {}
    for size, dtype in saved.values():
        by_dtype[dtype] = by_dtype.get(dtype, 0) + size
    return Trace(forward_flops=int(forward_flops), backward_flops=int(total - forward_flops),
                 saved_bytes=int(sum(size for size, _ in saved.values())), ready_order=ready,
                 output_elements=sum(t.numel() for t in tensors),
                 output_bytes=sum(t.numel() * t.element_size() for t in tensors),
                 sdpa_calls=routing.sdpa_calls, ops=ops.ops, views=ops.views,
                 forward_ops=forward_ops, convolutions=ops.convolutions,
                 conv_flops_share=_conv_share(counter), saved_by_dtype=by_dtype)
