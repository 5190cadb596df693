"""Processes for the per-sample loss tests: two steps of the tiny Llama on the engine tests' fixed batches."""

from __future__ import annotations

import torch

from tests.support.configs import tiny_config
from tests.support.engine_workers import rank_batches

STEPS = 2


def train_and_dump_samples(rank: int, world: int, layout: dict, out_path: str) -> None:
    """Every rank writes its StepResults' loss, label tokens and per-sample sums (the same on every rank)."""
    from runtime.engine import Engine
    from runtime.parallel.context import ParallelContext

    config = tiny_config(**layout)
    p = config.parallelism
    ctx = ParallelContext(tp=p.tp, pp=p.pp, dp=p.dp, cp=p.cp)
    engine = Engine(config, ctx)
    out = []
    for step in range(STEPS):
        result = engine.train_step(rank_batches(step, ctx, config.tokens.batch_accumulation_per_replica))
        out.append({"loss": result.loss, "label_tokens": result.num_label_tokens,
                    "sample_loss": torch.from_numpy(result.samples.loss),
                    "sample_tokens": torch.from_numpy(result.samples.label_tokens)})
    torch.save(out, f"{out_path}.{rank}")
