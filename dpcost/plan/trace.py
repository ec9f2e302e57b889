"""One forward and backward of a module, traced: FLOPs, saved bytes, gradient-ready order.

One pass on the module's own device (meta for a plan) gives the three together:

- FLOPs: ``torch.utils.flop_counter.FlopCounterMode`` around forward and backward (its matmul,
  convolution and attention formulas; operations without a formula count 0). On meta it
  counts attention too (causal counted as full).
- activations: every tensor autograd saves in forward (``torch.autograd.graph.
  saved_tensors_hooks``), deduplicated by storage (``untyped_storage()._cdata``: meta tensors
  have no ``data_ptr``), with the parameters excluded by storage (they are often saved as
  views, ``w.t()``). ``F.scaled_dot_product_attention`` is routed during the trace to
  ``aten._scaled_dot_product_flash_attention`` (``_scaled_dot_product_efficient_attention``
  when a mask is given), so the count is what CUDA's fused kernels save (no s x s matrix): on
  meta and on CPU, SDPA would pick its math kernel, which saves the s x s probabilities.
- the order gradients become ready: ``Tensor.register_post_accumulate_grad_hook`` on each
  trainable parameter fires once its gradient is accumulated, which is when DDP's reducer marks
  it ready (``reducer.cpp: Reducer::autograd_hook`` runs on the same AccumulateGrad node).

The loss is ``output.float().sum()`` (its backward saves nothing); a tuple or dict output is
reduced over its floating tensors.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["Trace", "trace_step", "ddp_parameters", "ATTENTION_NOTE"]

ATTENTION_NOTE = ("F.scaled_dot_product_attention counted as CUDA's flash kernel "
                  "(aten._scaled_dot_product_flash_attention; memory-efficient kernel with a mask)")


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


def ddp_parameters(module) -> list:
    """(name, parameter) as DDP lists them: ``named_parameters()`` (shared parameters once, at
    their first name) that require a gradient (``distributed.py: _build_params_for_module``)."""
    return [(name, p) for name, p in module.named_parameters() if p.requires_grad]


def _routing_mode():
    import torch
    import torch.nn.functional as F
    from torch.overrides import TorchFunctionMode

    class FusedAttention(TorchFunctionMode):
        calls = 0

        def __torch_function__(self, func, types, args=(), kwargs=None):
            kwargs = dict(kwargs or {})
            if func is not F.scaled_dot_product_attention:
                return func(*args, **kwargs)
            names = ("query", "key", "value", "attn_mask", "dropout_p", "is_causal", "scale")
            bound = dict(zip(names, args, strict=False))
            bound.update(kwargs)
            if bound.pop("enable_gqa", False):
                return func(*args, **kwargs)  # the fused ops want equal head counts
            q, k, v = bound["query"], bound["key"], bound["value"]
            mask, p = bound.get("attn_mask"), bound.get("dropout_p", 0.0)
            causal, scale = bound.get("is_causal", False), bound.get("scale")
            type(self).calls += 1
            if mask is None:
                return torch.ops.aten._scaled_dot_product_flash_attention(
                    q, k, v, p, causal, scale=scale)[0]
            return torch.ops.aten._scaled_dot_product_efficient_attention(
                q, k, v, mask, True, p, causal, scale=scale)[0]

    return FusedAttention


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
    return tensors, sum(t.float().sum() for t in tensors)


def trace_step(module, example) -> Trace:
    """Run ``module(example)`` and backward once, with the three recorders on (see above).

    Raises whatever the forward raises (a shape the module rejects); the hooks are removed and
    the parameters' ``.grad`` cleared either way.
    """
    import torch
    from torch.utils.flop_counter import FlopCounterMode

    params = ddp_parameters(module)
    index = {id(p): i for i, (_, p) in enumerate(params)}
    parameter_storages = {p.untyped_storage()._cdata for p in module.parameters()}
    saved: dict[int, int] = {}
    ready: list[int] = []

    def pack(tensor):
        storage = tensor.untyped_storage()
        if storage._cdata not in parameter_storages:
            saved[storage._cdata] = storage.nbytes()
        return tensor

    handles = [p.register_post_accumulate_grad_hook(lambda p: ready.append(index[id(p)]))
               for _, p in params]
    routing = _routing_mode()
    was_training = module.training
    module.train()
    try:
        with FlopCounterMode(display=False) as counter:
            with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t), routing():
                output = module(example)
            forward_flops = counter.get_total_flops()
            tensors, loss = _loss(output)
            loss.backward()
        total = counter.get_total_flops()
    finally:
        for handle in handles:
            handle.remove()
        for _, p in params:
            p.grad = None
        module.train(was_training)
    return Trace(forward_flops=int(forward_flops), backward_flops=int(total - forward_flops),
                 saved_bytes=int(sum(saved.values())), ready_order=ready,
                 output_elements=sum(t.numel() for t in tensors),
                 output_bytes=sum(t.numel() * t.element_size() for t in tensors),
                 sdpa_calls=routing.calls)
