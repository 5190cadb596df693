"""Gradient clipping across the parallel layout: the global L2 norm of the gradients over every tp and dp shard
and pp stage, computed and applied on the device without a host read (the engine skips a step whose norm is not
finite)."""

from __future__ import annotations

from collections import defaultdict

import torch
import torch.distributed as dist
from torch import nn

from runtime.parallel.context import ParallelContext


def clip_grad_norm_(params: list[nn.Parameter], max_norm: float | None, ctx: ParallelContext,
                    counted: list[nn.Parameter] | None = None, divisor: torch.Tensor | None = None) -> torch.Tensor:
    """Total L2 norm of the gradients of ``counted`` (default: ``params``) over every tp, dp shard and
    pp stage, divided by ``divisor`` (the gradients are sums of ``divisor`` tokens' losses), then scale all of
    ``params`` by ``1 / divisor`` and clip them to ``max_norm``; returns the norm (after the division,
    before clipping), on the device.

    No host read: one ``_foreach_norm`` per group of gradients on the same mesh and placements (each group's
    norm then reduces correctly over its own shards and replicas), the pipeline stages' squares added over
    the pp group, and one ``_foreach_mul_`` per group by a coefficient computed on the device. A non-finite
    norm makes a non-finite coefficient: the engine skips such a step.
    """
    total_sq = torch.zeros((), dtype=torch.float32, device=ctx.device)
    for grads in _gradient_groups(params if counted is None else counted).values():
        norm = torch.linalg.vector_norm(torch.stack(torch._foreach_norm(grads)))
        if hasattr(norm, "full_tensor"):
            norm = norm.full_tensor()
        total_sq += norm.to(ctx.device) ** 2
    if ctx.pp_size > 1:
        dist.all_reduce(total_sq, group=ctx.pp_pg)
    total = total_sq.sqrt()
    if divisor is not None:
        total = total / divisor
    coef = None if divisor is None else 1.0 / divisor
    if max_norm is not None:
        clip = (max_norm / (total + 1e-6)).clamp(max=1.0)
        coef = clip if coef is None else coef * clip
    if coef is not None:
        for grads in _gradient_groups(params).values():
            torch._foreach_mul_(grads, coef.to(torch.float32))
    return total


def _gradient_groups(params: list[nn.Parameter]) -> dict[tuple, list[torch.Tensor]]:
    """The gradients of ``params`` by (device mesh, placements); plain tensors in one group."""
    groups: dict[tuple, list[torch.Tensor]] = defaultdict(list)
    for p in params:
        if p.grad is not None:
            g = p.grad
            key = (g.device_mesh, tuple(g.placements)) if hasattr(g, "device_mesh") else ("local",)
            groups[key].append(g)
    return groups
