"""Tensor parallelism with DTensor: Megatron-style column/row splits of attention and MLP, a
vocabulary-parallel embedding, and a vocabulary-sharded head whose loss is computed without
gathering the logits (``loss_parallel``). A tied head is the embedding: both are split over the
vocabulary (rows of the ``[vocab, hidden]`` weight), so one sharded parameter serves both."""

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
    tied = chunk.has_embedding and chunk.has_head and chunk.lm_head.weight is chunk.embed_tokens.weight
    parallelize_module(chunk, tp_mesh, plan)
    if tied:
        # parallelize_module gives each module its own DTensor copy; share the embedding's again
        # (before FSDP, as with tp = 1) so both uses' gradients add into one parameter
        chunk.lm_head.weight = chunk.embed_tokens.weight
