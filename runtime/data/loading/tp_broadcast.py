"""The tensor- and context-parallel ranks of a replica need identical batches: only one of them (tp rank 0
of cp rank 0) reads them from disk and broadcasts them over the cp × tp group (Nanotron has every tp
rank read the same data). The batches are full-length: each cp rank keeps its part in the engine.

A user's loaders run on every rank instead, so their batches are compared across the group when each
loader starts (``check_same_batches``): a loader sharded by the process's rank would otherwise give cp
ranks other samples, whose keys attention would mix, without any error."""

from __future__ import annotations

import hashlib

import torch
import torch.distributed as dist

from nanoset.errors import ConfigError
from runtime.data.loading.contract import SOURCE_KEY, owned_keys, pointer_batch
from runtime.parallel.tensor_pointer import TensorPointer

INT_KEYS = ("input_ids", "label_ids", "position_ids")


def reads_for_replica(ctx) -> bool:
    """Whether this rank is the one of its cp × tp group that reads (and broadcasts) the batches."""
    return ctx.tp_rank == 0 and ctx.cp_rank == 0


def needs_broadcast(ctx) -> bool:
    """Whether the replica's batches reach this rank by broadcast: cp × tp > 1 and it owns data (first or last
    pipeline rank; the others hold TensorPointers only)."""
    return ctx.cp_size * ctx.tp_size > 1 and (ctx.is_first_pp_rank or ctx.is_last_pp_rank)


def _fingerprint(batches: list[dict]) -> str:
    """A digest of the tensors of ``batches`` (keys, dtypes, shapes and values; TensorPointers left out)."""
    digest = hashlib.blake2b(digest_size=16)
    for batch in batches:
        for key in sorted(batch):
            value = batch[key]
            if isinstance(value, torch.Tensor):
                t = value.detach().cpu().contiguous()
                digest.update(f"{key}:{t.dtype}:{tuple(t.shape)};".encode())
                digest.update(t.view(-1).view(torch.uint8).numpy().tobytes() if t.numel() else b"")
    return digest.hexdigest()


def check_same_batches(batches: list[dict], ctx, where: str) -> None:
    """Refuse, on every rank of the replica's cp × tp group, micro-batches that differ from those of its first
    rank (cp rank 0, tp rank 0). One small gather; the trainer calls it at a user loader's first step."""
    fingerprints: list = [None] * (ctx.cp_size * ctx.tp_size)
    dist.all_gather_object(fingerprints, _fingerprint(batches), group=ctx.cp_tp_pg)
    other = next((i for i, f in enumerate(fingerprints) if f != fingerprints[0]), None)
    if other is not None:
        cp_rank, tp_rank = divmod(other, ctx.tp_size)  # the group's ranks are the (cp, tp) grid, tp innermost
        raise ConfigError(f"{where}: the data loader gave cp rank {cp_rank}, tp rank {tp_rank} of replica "
                          f"{ctx.dp_rank} other micro-batches than cp rank 0, tp rank 0: every cp and tp rank of a "
                          f"replica needs the replica's full-length batches; shard a custom loader by ctx.dp_rank "
                          f"and ctx.dp_size, not by the process's rank as torch's DistributedSampler does (see "
                          f"docs/parallelism.md)")


def on_device(batches: list[dict] | None, keys: list[str], dtype: torch.dtype, shape: tuple[int, ...],
              device: torch.device) -> torch.Tensor:
    """``[len(keys), *shape]`` on ``device``: with ``batches`` (the reading rank), every micro-batch's value of
    each key, gathered on the host into one buffer (pinned on CUDA) and copied in one asynchronous copy, not a
    synchronous copy per key and micro-batch; without, an empty tensor for the broadcast to fill."""
    if batches is None:
        return torch.empty((len(keys), *shape), dtype=dtype, device=device)
    host = torch.empty((len(keys), *shape), dtype=dtype, pin_memory=device.type == "cuda")
    for j, k in enumerate(keys):
        for i, b in enumerate(batches):
            host[j, i] = b[k]
    return host.to(device, non_blocking=True)


def broadcast_batches(batches: list[dict] | None, num: int, rows: int, length: int, use_position_ids: bool,
                      ctx, with_sources: bool = False) -> list[dict]:
    """The reading rank (``reads_for_replica``) passes ``batches`` (``num`` micro-batches of ``[rows, length]``);
    every cp and tp rank of the replica returns the same micro-batches, on its device, TensorPointers where
    it owns nothing. ``with_sources``: the batches carry ``source_ids`` (``[rows]``, sent to the ranks owning
    the labels)."""
    keys = owned_keys(ctx.pp_rank, ctx.pp_size, use_position_ids)
    int_keys = [k for k in keys if k in INT_KEYS]
    bool_keys = [k for k in keys if k not in INT_KEYS]
    reads = reads_for_replica(ctx)
    ints = on_device(batches if reads else None, int_keys, torch.int64, (num, rows, length), ctx.device)
    bools = on_device(batches if reads else None, bool_keys, torch.bool, (num, rows, length), ctx.device)
    owns_labels = ctx.pp_rank == ctx.pp_size - 1
    sources = torch.empty((0,), dtype=torch.int64, device=ctx.device)
    if with_sources and owns_labels:
        sources = on_device(batches if reads else None, [SOURCE_KEY], torch.int64, (num, rows), ctx.device)[0]
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
