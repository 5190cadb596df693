"""Processes for the document-attention tests: logits of packed rows in a parallel layout."""

from __future__ import annotations

import torch

from tests.support.configs import docmask_config

# four packed rows of 16 tokens (documents of these lengths; the rest is padding, one position-0 token each)
ROWS = [[5, 7, 3], [9, 7], [16], [2, 2, 2, 4]]
LENGTH = 16


def packed_inputs() -> tuple[torch.Tensor, torch.Tensor]:
    """Token ids and position ids (restarting per document, 0 for every padding token) of ``ROWS``."""
    g = torch.Generator().manual_seed(3)
    ids = torch.randint(1, 128, (len(ROWS), LENGTH), generator=g)
    pos = torch.zeros(len(ROWS), LENGTH, dtype=torch.int64)
    for r, docs in enumerate(ROWS):
        at = 0
        for n in docs:
            pos[r, at : at + n] = torch.arange(n)
            at += n
    return ids, pos


def packed_logits(rank: int, world: int, layout: dict, out_path: str) -> None:
    """Full logits of the packed rows under document attention, from the last pipeline rank."""
    from runtime.engine import Engine
    from runtime.parallel.context import ParallelContext
    from runtime.parallel.pipeline import build_schedule

    config = docmask_config(**layout)
    p = config.parallelism
    ctx = ParallelContext(tp=p.tp, pp=p.pp, dp=p.dp)
    engine = Engine(config, ctx)
    ids, pos = packed_inputs()
    with torch.no_grad():
        if p.pp == 1:
            logits = engine.chunks[0](ids, pos)
        else:
            schedule = build_schedule(engine.chunks, engine.stage_ids, engine.total_stages, ctx.pp_pg, ctx.device,
                                      p.pp_engine, len(ROWS), None)
            logits = schedule.eval(ids, pos) if ctx.pp_rank == 0 else schedule.eval()
    if engine.owns_loss:
        full = logits.full_tensor() if hasattr(logits, "full_tensor") else logits  # a collective: every tp rank
        if ctx.tp_rank == 0:
            torch.save(full, out_path)


def label_tokens_on_every_rank(rank: int, world: int) -> None:
    """pp = 2 with document attention: a train step reports the global batch's label-token count on
    every rank (the first pipeline rank owns no labels; metrics are written by global rank 0)."""
    from runtime.engine import Engine
    from runtime.parallel.context import ParallelContext
    from tests.support.engine_workers import global_batch, rank_batches

    engine = Engine(docmask_config(pp=2), ParallelContext(pp=2))
    result = engine.train_step(rank_batches(0, engine.ctx, 4))
    expected = int(global_batch(0)["label_mask"].sum())
    assert result.num_label_tokens == expected, (rank, result.num_label_tokens, expected)
