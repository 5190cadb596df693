"""Tensor parallelism with DTensor: Megatron-style column/row splits of attention and MLP, a
vocabulary-parallel embedding, and a vocabulary-sharded head whose loss is computed without
gathering the logits (``loss_parallel``)."""

from __future__ import annotations

from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import Replicate, Shard
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module


def apply_tensor_parallel(chunk: nn.Module, tp_mesh: DeviceMesh) -> None:
    """Shard ``chunk`` (a LlamaChunk) over ``tp_mesh`` in place."""
    if tp_mesh.size() == 1:
        return
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
    parallelize_module(chunk, tp_mesh, plan)
