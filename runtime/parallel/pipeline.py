"""Pipeline parallelism with ``torch.distributed.pipelining``: how layers split into chunks, which
chunks a rank owns, the schedule (afab = GPipe, 1f1b, interleaved-1f1b) that runs them, and its
forward-only step for evaluation."""

from __future__ import annotations

import inspect
from collections.abc import Callable

import torch
from torch import nn

from nanoset.errors import ConfigError
from runtime.config.schema import PP_ENGINES

# the torch.distributed.pipelining schedule of each parallelism.pp_engine
SCHEDULES = dict(zip(PP_ENGINES, ("ScheduleGPipe", "Schedule1F1B", "ScheduleInterleaved1F1B")))


def chunk_layer_ranges(num_layers: int, num_chunks: int) -> list[tuple[int, int]]:
    """Balanced contiguous layer ranges: chunk c gets layers ``[c·n // C, (c+1)·n // C)``."""
    if num_chunks > num_layers:
        raise ValueError(f"{num_layers} layers cannot fill {num_chunks} pipeline chunks; lower pp or "
                         f"pp_virtual_stages, or add layers")
    return [(c * num_layers // num_chunks, (c + 1) * num_layers // num_chunks) for c in range(num_chunks)]


def is_interleaved(pp_size: int, engine: str) -> bool:
    """With pp = 1 there is no pipeline: the engine is irrelevant and the model is one chunk."""
    return pp_size > 1 and engine == "interleaved-1f1b"


def chunks_of_rank(pp_rank: int, pp_size: int, engine: str, virtual_stages: int) -> list[int]:
    """Chunk (stage) indices this pipeline rank runs: one, or ``virtual_stages`` looped ones."""
    if is_interleaved(pp_size, engine):
        return [pp_rank + v * pp_size for v in range(virtual_stages)]
    return [pp_rank]


def num_chunks(pp_size: int, engine: str, virtual_stages: int) -> int:
    return pp_size * (virtual_stages if is_interleaved(pp_size, engine) else 1)


def build_schedule(chunks: list[nn.Module], stage_ids: list[int], total_stages: int, pp_group, device: torch.device,
                   engine: str, n_microbatches: int, loss_fn: Callable):
    """PipelineStage objects for this rank's chunks and the schedule that drives them."""
    from torch.distributed import pipelining

    stages = [pipelining.PipelineStage(c, i, total_stages, device, group=pp_group) for c, i in zip(chunks, stage_ids)]
    cls = getattr(pipelining, SCHEDULES[engine])
    kwargs = {"n_microbatches": n_microbatches, "loss_fn": loss_fn}
    if "scale_grads" in inspect.signature(cls.__init__).parameters:
        kwargs["scale_grads"] = False  # the loss is already each micro-batch's share (older torch never scales)
    try:
        return cls(stages if engine == "interleaved-1f1b" else stages[0], **kwargs)
    except ValueError as e:  # the schedule's own constraints (e.g. micro-batches vs stages)
        raise ConfigError(f"pipeline schedule {engine}: {e}; adjust tokens.batch_accumulation_per_replica "
                         f"or parallelism.pp") from None


def forward_only(schedule, *args, **kwargs):
    """``schedule.eval`` (torch ≥ 2.9). Before it existed, the same by hand: a step with backward off,
    which on those versions also skips the schedule's loss; the last stage then returns the merged
    outputs (logits of all micro-batches) and the caller computes the loss from them."""
    if hasattr(schedule, "eval"):
        schedule.eval(*args, **kwargs)
        return None
    stages = getattr(schedule, "_stages", None) or [schedule._stage]
    saved = schedule._has_backward, [s.has_backward for s in stages]
    schedule._has_backward = False
    for s in stages:
        s.has_backward = False
    kwargs.pop("losses", None)  # none are computed: asking for them would be an error
    try:
        return schedule.step(*args, **kwargs)
    finally:
        schedule._has_backward = saved[0]
        for s, flag in zip(stages, saved[1]):
            s.has_backward = flag
