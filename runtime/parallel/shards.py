"""Which part of a full parameter this rank holds.

Full tensors that come from outside the model (the seeded initialisation, Hugging Face weights) are
written straight into each rank's shard: the model itself is never materialised whole on a rank,
whatever its tensor-parallel rows or columns and FSDP dim-0 shards.
"""

from __future__ import annotations

import torch


def local_slices(p: torch.Tensor) -> tuple[slice, ...]:
    """The part of the full tensor that this rank's shard of ``p`` holds (all of it for a plain tensor)."""
    from torch.distributed.tensor import DTensor

    if not isinstance(p, DTensor):
        return tuple(slice(0, n) for n in p.shape)
    from torch.distributed.tensor._utils import compute_local_shape_and_global_offset

    shape, offset = compute_local_shape_and_global_offset(p.shape, p.device_mesh, p.placements)
    return tuple(slice(o, o + n) for o, n in zip(offset, shape))


def local_tensor(p: torch.Tensor) -> torch.Tensor:
    """This rank's shard of ``p`` (``p`` itself when it is not distributed); writing it writes ``p``."""
    return p.to_local() if hasattr(p, "to_local") else p
