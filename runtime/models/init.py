"""The seeded initialisation every family shares: the same full weights whatever the tp/pp/dp layout.

Each parameter's generator is seeded by its layout-independent name, and each rank draws only its shard.
"""

from __future__ import annotations

import hashlib

import torch
from torch import nn

from runtime.config import ModelArgs
from runtime.parallel.shards import local_slices, local_tensor


def init_weights(chunk: nn.Module, args: ModelArgs, seed: int) -> None:
    """Seeded per parameter name, so the full weights are the same for every tp/pp/dp layout.

    Linear and embedding weights ~ N(0, init_std); the projections that write into the residual
    stream (o_proj, down_proj) use init_std / sqrt(2 · layers); norms start at 1, biases at 0. Each weight is
    drawn on the CPU in blocks of rows, and only this rank's shard of it is kept.
    """
    scaled = args.init_std / (2 * args.num_hidden_layers) ** 0.5
    for name, p in chunk.named_parameters():
        name = chunk.stored_name(name)
        local = local_tensor(p)
        if name.endswith(("norm.weight", ".bias")):
            with torch.no_grad():
                local.fill_(1.0 if name.endswith("norm.weight") else 0.0)
            continue
        digest = hashlib.blake2b(f"{seed}:{name}".encode(), digest_size=8).digest()
        gen = torch.Generator(device="cpu").manual_seed(int.from_bytes(digest, "little") & (2**63 - 1))
        std = scaled if name.endswith(("o_proj.weight", "down_proj.weight")) else args.init_std
        with torch.no_grad():
            draw_normal_part(local, tuple(p.shape), std, gen, local_slices(p))


def draw_normal_part(out: torch.Tensor, shape: tuple[int, ...], std: float, gen: torch.Generator,
                     part: tuple[slice, ...], block_values: int = 1 << 22) -> None:
    """``out.copy_(torch.empty(shape).normal_(0, std, generator=gen)[part])`` without holding the whole
    tensor: the rows are drawn in blocks of ``block_values`` values (and not past the part's last row).

    Equal to the whole draw, bit for bit: torch's CPU ``normal_`` turns its uniforms into normals 16
    at a time and redraws the last 16 when the size is no multiple of 16, so blocks whose sizes are
    multiples of 16, and a last block of at least 16 values, consume and transform the same numbers.
    """
    row_values = 1
    for n in shape[1:]:
        row_values *= n
    rows = max(16, block_values // max(row_values, 1) // 16 * 16)  # a multiple of 16 rows
    if len(shape) < 2 or shape[0] <= rows:
        out.copy_(torch.empty(shape, dtype=torch.float32).normal_(0.0, std, generator=gen)[part])
        return
    first, last = part[0].start, part[0].stop
    start = 0
    while start < last:
        stop = min(start + rows, shape[0])
        if (shape[0] - stop) * row_values < 16:  # the last block must hold at least 16 values
            stop = shape[0]
        block = torch.empty((stop - start,) + shape[1:], dtype=torch.float32).normal_(0.0, std, generator=gen)
        lo, hi = max(start, first), min(stop, last)
        if lo < hi:
            out[lo - first : hi - first] = block[(slice(lo - start, hi - start),) + part[1:]]
        start = stop
