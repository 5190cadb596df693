"""The decoder's tensor-parallel plan (Megatron-style), in torch's own parallel styles: a family's plan is this one
plus what its own modules need.

Column splits of q, k, v (their biases too: rows of the output, so each rank keeps its heads' biases), gate and
up; row splits of o and down; a vocabulary-parallel embedding; a vocabulary-sharded head whose loss is computed
without gathering the logits (``loss_parallel``).
"""

from __future__ import annotations

from torch import nn
from torch.distributed.tensor import Replicate, Shard
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel


def decoder_plan(chunk: nn.Module) -> dict:
    """Module name (in ``chunk``) → parallel style."""
    plan = {}
    if chunk.embed_tokens is not None:
        plan["embed_tokens"] = RowwiseParallel(input_layouts=Replicate(), output_layouts=Replicate())
    if chunk.lm_head is not None:
        # logits stay sharded over the vocabulary; the loss runs under loss_parallel()
        plan["lm_head"] = ColwiseParallel(output_layouts=Shard(-1), use_local_output=False)
    for name in chunk.layers:
        for proj in ("q_proj", "k_proj", "v_proj"):
            plan[f"layers.{name}.attn.{proj}"] = ColwiseParallel()
        plan[f"layers.{name}.attn.o_proj"] = RowwiseParallel()
        plan[f"layers.{name}.mlp.gate_proj"] = ColwiseParallel()
        plan[f"layers.{name}.mlp.up_proj"] = ColwiseParallel()
        plan[f"layers.{name}.mlp.down_proj"] = RowwiseParallel()
    return plan
