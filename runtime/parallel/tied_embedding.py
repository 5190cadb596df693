"""Tied embeddings across pipeline stages, as Megatron-LM does them.

With pp > 1 the embedding (first stage) and the head (last stage) live on different ranks, so they
cannot be one parameter. The last stage keeps a copy: both start equal (same seeded init, same
Hugging Face tensor, same checkpoint entry, all under the name ``embed_tokens.weight``), their
gradients are summed between the first and the last pipeline rank of each (dp, tp) coordinate
after every backward, and identical gradients give identical AdamW updates, so they stay equal.
The copy's shards match the embedding's (both are ``[vocab, hidden]`` split on rows by tp and
FSDP), so the sum is over local shards. Gradient clipping counts the pair once.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn

from runtime.parallel.context import ParallelContext


class TiedEmbeddingSync:
    """This rank's half of the tied pair (None on middle pipeline ranks) and the group it sums over."""

    def __init__(self, chunks: list[nn.Module], ctx: ParallelContext) -> None:
        self.group = None
        if ctx.is_first_pp_rank or ctx.is_last_pp_rank:
            # only the pair takes part in making its group (not every rank of the world, once per pair)
            pair = [ctx.global_rank_of(p, ctx.dp_rank, ctx.tp_rank) for p in (0, ctx.pp_size - 1)]
            self.group = dist.new_group(pair, use_local_synchronization=True)
        self.param: nn.Parameter | None = None
        for chunk in chunks:
            if chunk.has_embedding:
                self.param = chunk.embed_tokens.weight
            elif chunk.head_copies_embedding:
                self.param = chunk.lm_head.weight

    @torch.no_grad()
    def sum_gradients(self) -> None:
        """After backward, before clipping: both halves get embedding grad + head grad."""
        if self.param is None:
            return
        grad = self.param.grad
        if hasattr(grad, "placements") and grad.placements != self.param.placements:
            # the vocabulary-parallel embedding's backward gives a replicated gradient: keep this rank's rows
            grad = self.param.grad = grad.redistribute(grad.device_mesh, self.param.placements)
        local = grad.to_local() if hasattr(grad, "to_local") else grad
        dist.all_reduce(local, group=self.group)

