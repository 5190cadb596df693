"""Scoring a task's requests through the engine: each request is one row (context + choice, right-padded, only the
choice's tokens labelled), rows fill global batches in order, each dp rank builds its own rows of them, and
``Engine.eval_rows`` gives every row's summed token loss on every layout (tp, cp and pp ranks build the same rows:
a task is small and every rank has read it). A choice's log-probability is minus its summed token loss."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import torch

from runtime.evaluation.tasks import Request, Task, task_metrics


def row_tensors(request: Request | None, sequence_length: int) -> tuple[list[int], list[int], list[bool]]:
    """(inputs, labels, label mask) of one row: the last ``sequence_length + 1`` tokens of the pair (the context cut
    from the left), right-padded with id 0 whose labels count in nothing; None: a padding row."""
    length = sequence_length
    if request is None:
        return [0] * length, [0] * length, [False] * length
    ids = list(request.ids[-(length + 1):])
    inputs, labels = ids[:-1], ids[1:]
    mask = [False] * (len(labels) - request.scored) + [True] * request.scored
    pad = length - len(inputs)
    return inputs + [0] * pad, labels + [0] * pad, mask + [False] * pad


def task_batches(requests: list[Request], sequence_length: int, ctx: Any, micro_batch_size: int,
                 accumulation: int) -> Iterator[list[dict]]:
    """This rank's micro-batches of each global batch of ``requests``: global row ``p`` of a batch is request
    ``first + p``, and micro-batch ``m`` of dp rank ``r`` holds rows ``[m·dp·mbs + r·mbs, +mbs)``
    (``sample_losses.global_rows``); the last batch is padded."""
    per_batch = ctx.dp_size * micro_batch_size * accumulation
    for first in range(0, len(requests), per_batch):
        batches = []
        for m in range(accumulation):
            start = first + m * ctx.dp_size * micro_batch_size + ctx.dp_rank * micro_batch_size
            rows = [row_tensors(requests[i] if i < len(requests) else None, sequence_length)
                    for i in range(start, start + micro_batch_size)]
            inputs = torch.tensor([r[0] for r in rows], dtype=torch.int64)
            batches.append({"input_ids": inputs, "input_mask": torch.ones_like(inputs, dtype=torch.bool),
                            "position_ids": torch.arange(sequence_length).expand(micro_batch_size, -1).contiguous(),
                            "label_ids": torch.tensor([r[1] for r in rows], dtype=torch.int64),
                            "label_mask": torch.tensor([r[2] for r in rows], dtype=torch.bool)})
        yield batches


def choice_logprobs(engine, task: Task, sequence_length: int) -> list[float]:
    """Each request's summed log-probability of its choice's tokens, the same on every rank."""
    tokens = engine.config.tokens
    out: list[float] = []
    for batches in task_batches(task.requests, sequence_length, engine.ctx, tokens.micro_batch_size,
                                tokens.batch_accumulation_per_replica):
        rows = engine.eval_rows(batches, sequence_length)
        out += [-float(x) for x in rows.loss]
    return out[:len(task.requests)]


def score(engine, task: Task, sequence_length: int) -> dict[str, float | int]:
    """``{"acc", "acc_norm", "n"}`` of ``task`` on the engine's model."""
    return task_metrics(task, choice_logprobs(engine, task, sequence_length))
