"""Context parallelism: each sample's sequence split over the cp ranks of a replica, load-balanced.

A sequence of ``L`` tokens is cut into ``2·cp`` chunks of ``c = L / (2·cp)``; cp rank ``r`` holds
chunks ``r`` and ``2·cp − 1 − r`` (a head and a tail chunk), so under causal attention every rank has
the same work: a chunk near the start attends to few keys, its partner near the end to many.
Token-wise layers (embedding, norms, MLP, head, loss) run on the rank's ``2·c`` tokens as they are.
Attention all-gathers K and V over the cp group, the Llama 3 choice: any mask works (documents
included) for a K/V gather that grouped-query attention keeps small; the local queries are masked
against the gathered keys by the global positions of both (``runtime.models.document_attention``).
The gather is differentiable (PyTorch's functional collectives): its backward reduce-scatters dK
and dV, so each rank's K/V projection gets the gradient of every query that read its keys.

The loaders know nothing of this: batches stay full-length up to the engine, which keeps this
rank's chunks of every ``[batch, L]`` tensor (``shard``).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist


def chunk_positions(length: int, cp_size: int, cp_rank: int, device: torch.device | str = "cpu") -> torch.Tensor:
    """The global token indices cp rank ``cp_rank`` holds, in its local order: ``[2·c]``."""
    if length % (2 * cp_size):
        raise ValueError(f"sequence length {length} is not divisible by 2 × cp = {2 * cp_size}")
    c = length // (2 * cp_size)
    head = torch.arange(cp_rank * c, (cp_rank + 1) * c, device=device)
    tail = torch.arange((2 * cp_size - 1 - cp_rank) * c, (2 * cp_size - cp_rank) * c, device=device)
    return torch.cat((head, tail))


def _all_gather():
    """The differentiable all-gather of the functional collectives (renamed in torch 2.9)."""
    import torch.distributed._functional_collectives as fc

    return getattr(fc, "all_gather_single_autograd", None) or fc.all_gather_tensor_autograd


@dataclass(frozen=True)
class ContextParallel:
    """This rank's place in its cp group: which tokens it holds, and the gather of the others'."""

    group: dist.ProcessGroup
    size: int
    rank: int

    @classmethod
    def of(cls, ctx) -> ContextParallel | None:
        """The cp group of a ``ParallelContext``; None without context parallelism."""
        return cls(ctx.cp_pg, ctx.cp_size, ctx.cp_rank) if ctx.cp_size > 1 else None

    def local_positions(self, length: int, device: torch.device) -> torch.Tensor:
        """Global indices of this rank's tokens of a sequence of ``length``: ``[length / cp]``."""
        return chunk_positions(length, self.size, self.rank, device)

    def gathered_positions(self, length: int, device: torch.device) -> torch.Tensor:
        """Global indices of the gathered tokens, in the gather's (rank-major) order: ``[length]``."""
        return torch.cat([chunk_positions(length, self.size, r, device) for r in range(self.size)])

    def shard(self, t: torch.Tensor) -> torch.Tensor:
        """This rank's tokens of a full-length ``[batch, L, ...]`` tensor."""
        return t.index_select(1, self.local_positions(t.shape[1], t.device))

    def gather(self, t: torch.Tensor) -> torch.Tensor:
        """``[batch, L / cp, ...]`` local tensors of every cp rank → ``[batch, L, ...]`` in the gather's order
        (``gathered_positions``); differentiable: the backward sums the gradients into each rank's part.

        Gathered on the leading dimension, then concatenated: the result is a plain tensor (the collective's
        own concatenation may return views of its asynchronous wrapper tensor, which is what attention
        would then keep for the backward pass)."""
        gathered = _all_gather()(t.contiguous(), 0, self.group)
        return torch.cat(gathered.chunk(self.size, dim=0), dim=1)
