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
    ctx = ParallelContext(tp=p.tp, pp=p.pp, dp=p.dp, cp=p.cp)
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


def packed_sft_batches() -> list[dict]:
    """``ROWS`` as one global batch of two micro-batches, trained like SFT data: a label is the next token of
    its document, masked for each document's first two tokens (its prompt), its last token and padding."""
    ids, pos = packed_inputs()
    next_pos = torch.cat((pos[:, 1:], torch.zeros_like(pos[:, :1])), dim=1)
    mask = (next_pos != 0) & (pos >= 2)
    labels = torch.roll(ids, -1, dims=1)
    full = {"input_ids": ids, "position_ids": pos, "input_mask": torch.ones_like(mask), "label_ids": labels,
            "label_mask": mask}
    return [{k: v[m * 2 : m * 2 + 2] for k, v in full.items()} for m in range(2)]


def packed_sft_step(rank: int, world: int, layout: dict, out_path: str) -> None:
    """Document attention on the packed rows in ``layout`` (dp 1): the full logits of a forward pass (pp = 1;
    each cp rank's part gathered back into sequence order), then one train step: its loss, label tokens and
    the gradients before the optimizer step, as whole tensors."""
    from runtime.engine import Engine
    from runtime.parallel.context import ParallelContext
    from runtime.parallel.context_parallel import ContextParallel
    from runtime.parallel.tensor_pointer import TensorPointer
    from tests.support.engine_workers import _full

    config = docmask_config(accum=2, **layout)
    p = config.parallelism
    ctx = ParallelContext(tp=p.tp, pp=p.pp, dp=p.dp, cp=p.cp)
    engine = Engine(config, ctx)
    logits = None
    if p.pp == 1:
        ids, pos = packed_inputs()
        cp = ContextParallel.of(ctx)
        with torch.no_grad():
            local = engine.chunks[0](*(t if cp is None else cp.shard(t) for t in (ids, pos)))
            local = local.full_tensor() if hasattr(local, "full_tensor") else local  # a collective: every tp rank
            logits = local
            if cp is not None:
                logits = torch.empty(ids.shape + local.shape[2:])
                logits[:, cp.gathered_positions(ids.shape[1], ids.device)] = cp.gather(local)
    batches = packed_sft_batches()
    for b in batches:
        if ctx.pp_rank != 0:
            b.update({k: TensorPointer(0) for k in ("input_ids", "input_mask", "position_ids")})
        if ctx.pp_rank != ctx.pp_size - 1:
            b.update({k: TensorPointer(ctx.pp_size - 1) for k in ("label_ids", "label_mask")})
    grads: dict[str, torch.Tensor] = {}
    optimizer_step = engine.optimizer.step

    def step_keeping_gradients(*args, **kwargs):
        grads.update(_full(engine, lambda param: param.grad))
        return optimizer_step(*args, **kwargs)

    engine.optimizer.step = step_keeping_gradients
    result = engine.train_step(batches)
    if ctx.tp_rank == 0 and ctx.cp_rank == 0:
        torch.save({"logits": logits, "loss": result.loss, "label_tokens": result.num_label_tokens, "grads": grads},
                   f"{out_path}.pp{ctx.pp_rank}")
