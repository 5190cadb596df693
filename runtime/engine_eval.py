"""Forward-only loss of one global batch through the engine: what validation measures.

The batch goes through the same input, target and loss code as a training step (so the same label
mask rules), under ``no_grad``; with pp > 1 through the training schedule's forward-only path
(``schedule.eval``). The result is the sum of token losses and the number of label tokens of the
whole global batch (all micro-batches, all dp ranks), identical on every rank.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from runtime.engine import Engine


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


def eval_loss(engine: Engine, batches: list[dict], sequence_length: int) -> tuple[float, int]:
    """(Σ token losses, label tokens) of this global batch; ``batches`` are this rank's micro-batches."""
    losses: list[torch.Tensor] = []
    scale, engine._loss_scale = engine._loss_scale, 1.0  # the loss function returns plain sums
    try:
        with torch.no_grad(), engine._loss_context():
            if engine.ctx.pp_size == 1:
                chunk = engine.chunks[0]
                inputs = engine._inputs(batches)
                targets = engine._targets(batches)
                rows = batches[0]["input_ids"].shape[0]
                for i in range(len(batches)):
                    sl = slice(i * rows, (i + 1) * rows)
                    losses.append(engine._loss(chunk(*(t[sl] for t in inputs)), targets[sl]))
            else:
                schedule = engine._schedule((sequence_length,))
                if engine.owns_inputs:
                    forward_only(schedule, *engine._inputs(batches))
                elif engine.owns_loss:
                    targets = engine._targets(batches)
                    logits = forward_only(schedule, target=targets, losses=losses)
                    if not losses:  # torch without schedule.eval computed no loss: take it from the logits
                        losses.append(engine._loss(logits, targets))
                else:
                    forward_only(schedule)
    finally:
        engine._loss_scale = scale
    ctx = engine.ctx
    total = torch.zeros(2, dtype=torch.float64, device=engine.device)  # Σ loss, label tokens
    if engine.owns_loss:
        total[0] = sum(float(x.detach()) for x in losses)
        total[1] = sum(int(b["label_mask"].sum()) for b in batches)
        if ctx.dp_size > 1:
            dist.all_reduce(total, group=ctx.dp_pg)
    if ctx.pp_size > 1:
        src = ctx.global_rank_of(ctx.pp_size - 1, ctx.dp_rank, ctx.tp_rank)
        dist.broadcast(total, src=src, group=ctx.pp_pg)
    return float(total[0]), int(total[1])
