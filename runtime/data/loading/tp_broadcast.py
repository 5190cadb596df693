"""The tensor- and context-parallel ranks of a replica need identical batches: only one of them (tp rank 0
of cp rank 0) reads them from disk and broadcasts them over the cp × tp group (Nanotron has every tp
rank read the same data). The batches are full-length: each cp rank keeps its part in the engine."""

from __future__ import annotations

import torch
import torch.distributed as dist

from runtime.data.loading.collator import INPUT_KEYS, LABEL_KEYS, SOURCE_KEY, pointer_batch
from runtime.parallel.tensor_pointer import TensorPointer

INT_KEYS = ("input_ids", "label_ids", "position_ids")


def reads_for_replica(ctx) -> bool:
    """Whether this rank is the one of its cp × tp group that reads (and broadcasts) the batches."""
    return ctx.tp_rank == 0 and ctx.cp_rank == 0


def needs_broadcast(ctx) -> bool:
    """Whether the replica's batches reach this rank by broadcast: cp × tp > 1 and it owns data (first or last
    pipeline rank; the others hold TensorPointers only)."""
    return ctx.cp_size * ctx.tp_size > 1 and (ctx.is_first_pp_rank or ctx.is_last_pp_rank)


def owned_keys(pp_rank: int, pp_size: int, use_position_ids: bool) -> list[str]:
    keys = []
    if pp_rank == 0:
        keys += list(INPUT_KEYS) + (["position_ids"] if use_position_ids else [])
    if pp_rank == pp_size - 1:
        keys += list(LABEL_KEYS)
    return keys


def broadcast_batches(batches: list[dict] | None, num: int, rows: int, length: int, use_position_ids: bool,
                      ctx, with_sources: bool = False) -> list[dict]:
    """The reading rank (``reads_for_replica``) passes ``batches`` (``num`` micro-batches of ``[rows, length]``);
    every cp and tp rank of the replica returns the same micro-batches, on its device, TensorPointers where
    it owns nothing. ``with_sources``: the batches carry ``source_ids`` (``[rows]``, sent to the ranks owning
    the labels)."""
    keys = owned_keys(ctx.pp_rank, ctx.pp_size, use_position_ids)
    int_keys = [k for k in keys if k in INT_KEYS]
    bool_keys = [k for k in keys if k not in INT_KEYS]
    ints = torch.empty((len(int_keys), num, rows, length), dtype=torch.int64, device=ctx.device)
    bools = torch.empty((len(bool_keys), num, rows, length), dtype=torch.bool, device=ctx.device)
    if reads_for_replica(ctx):
        for i, b in enumerate(batches):
            for j, k in enumerate(int_keys):
                ints[j, i] = b[k]
            for j, k in enumerate(bool_keys):
                bools[j, i] = b[k]
    owns_labels = ctx.pp_rank == ctx.pp_size - 1
    sources = torch.empty((num, rows) if with_sources and owns_labels else (0,), dtype=torch.int64, device=ctx.device)
    if reads_for_replica(ctx) and sources.numel():
        for i, b in enumerate(batches):
            sources[i] = b[SOURCE_KEY]
    src = ctx.global_rank_of(ctx.pp_rank, ctx.dp_rank, 0, cp_rank=0)
    for t in (ints, bools, sources):
        if t.numel():
            dist.broadcast(t, src=src, group=ctx.cp_tp_pg)
    out = []
    for i in range(num):
        b: dict = pointer_batch(0, ctx.pp_size - 1, use_position_ids)
        b.update({k: ints[j, i] for j, k in enumerate(int_keys)})
        b.update({k: bools[j, i] for j, k in enumerate(bool_keys)})
        if with_sources:
            b[SOURCE_KEY] = sources[i] if sources.numel() else TensorPointer(ctx.pp_size - 1)
        out.append(b)
    return out
