"""The Qwen3 model: the shared decoder with an RMSNorm over each query and key head, before RoPE.

Under tensor parallelism a rank holds some of the heads (the shared plan's column split of q and k); the norms
are applied to its local heads, their weights (one per head dimension, shared by all heads) replicated. They are
planned as torch's ``SequenceParallel`` over the heads dimension, as torchtitan's Qwen3 does: the weight's
gradient, summed over this rank's heads only, is then summed over the tp ranks by DTensor.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.distributed.tensor.parallel import SequenceParallel

from runtime.config import ModelArgs
from runtime.models.decoder import Attention, DecoderChunk, RMSNorm
from runtime.models.init import init_weights
from runtime.models.spec import FamilyModules
from runtime.models.tensor_parallel import decoder_plan


class Qwen3Attention(Attention):
    def __init__(self, args: ModelArgs) -> None:
        super().__init__(args)
        self.q_norm = RMSNorm(self.head_dim, args.rms_norm_eps)
        self.k_norm = RMSNorm(self.head_dim, args.rms_norm_eps)

    def heads(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        q, k, v = super().heads(x)
        return self.q_norm(q), self.k_norm(k), v


class Qwen3Chunk(DecoderChunk):
    """A pipeline chunk of a Qwen3 decoder."""

    attention = Qwen3Attention


def tensor_parallel_plan(chunk: nn.Module) -> dict:
    """The decoder's plan, and the per-head norms on this rank's heads (dimension 2 of ``[batch, seq, heads,
    head_dim]``)."""
    plan = decoder_plan(chunk)
    for name in chunk.layers:
        for norm in ("q_norm", "k_norm"):
            plan[f"layers.{name}.attn.{norm}"] = SequenceParallel(sequence_dim=2, use_local_output=True)
    return plan


MODULES = FamilyModules(chunk=Qwen3Chunk, init_weights=init_weights, tensor_parallel_plan=tensor_parallel_plan)
