"""Data parallelism with FSDP2 (``fully_shard``) over the dp axis: parameters, gradients and
optimizer state sharded; bf16 compute with fp32 gradient reduction on CUDA."""

from __future__ import annotations

import torch
from torch import nn
from torch.distributed.device_mesh import DeviceMesh


def apply_fsdp(chunk: nn.Module, dp_mesh: DeviceMesh, param_dtype: torch.dtype) -> None:
    """Shard each decoder layer, then the chunk (embedding, norm, head) as the root group."""
    try:
        from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
    except ImportError:  # torch < 2.6 kept it under _composable
        from torch.distributed._composable.fsdp import MixedPrecisionPolicy, fully_shard

    mp = MixedPrecisionPolicy(param_dtype=param_dtype, reduce_dtype=torch.float32)
    layers = list(chunk.layers.values())
    for i, layer in enumerate(layers):
        # the last layer's parameters are needed again right away by the root's backward
        fully_shard(layer, mesh=dp_mesh, mp_policy=mp, reshard_after_forward=i < len(layers) - 1)
    fully_shard(chunk, mesh=dp_mesh, mp_policy=mp)
