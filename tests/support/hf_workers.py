"""Processes for the Hugging Face tests: load a transformers Llama into a given layout, compute the
logits of fixed ids, and optionally save a checkpoint of the loaded weights (for export)."""

from __future__ import annotations

from pathlib import Path

import torch
import torch.distributed as dist

from tests.support.configs import hf_config


def forward_logits(engine, ids: torch.Tensor) -> torch.Tensor | None:
    """Full logits of ``ids`` on the last pipeline rank (None elsewhere); hidden states go rank to rank."""
    ctx = engine.ctx
    pos = torch.arange(ids.shape[1]).expand(ids.shape[0], -1)
    chunk = engine.chunks[0]
    with torch.no_grad():
        if ctx.pp_rank == 0:
            x = ids
        else:
            x = torch.empty(ids.shape[0], ids.shape[1], engine.config.model.hidden_size)
            dist.recv(x, src=ctx.global_rank_of(ctx.pp_rank - 1, ctx.dp_rank, ctx.tp_rank))
        out = chunk(x, pos)
        if not engine.owns_loss:
            dist.send(out[0].contiguous(), dst=ctx.global_rank_of(ctx.pp_rank + 1, ctx.dp_rank, ctx.tp_rank))
            return None
        return out.full_tensor() if hasattr(out, "full_tensor") else out


def logits_worker(rank: int, world: int, hf_path: str, layout: dict, ids: torch.Tensor, out: str,
                  checkpoint: str | None = None, tokenizer: dict | None = None) -> None:
    from runtime.checkpoint.store import CheckpointManager
    from runtime.engine import Engine
    from runtime.hf.load import load_hf_weights
    from runtime.parallel.context import ParallelContext

    config = hf_config(hf_path, **layout)
    ctx = ParallelContext(tp=config.parallelism.tp, pp=config.parallelism.pp, dp=config.parallelism.dp)
    engine = Engine(config, ctx)
    load_hf_weights(engine.chunks, hf_path)
    logits = forward_logits(engine, ids)
    if logits is not None and ctx.dp_rank == 0 and ctx.tp_rank == 0:
        torch.save(logits, out)
    if checkpoint is not None:
        from nanoset import TokenizerInfo
        from runtime.checkpoint.record import CheckpointRecord
        from runtime.checkpoint.tokenizer_record import TokenizerRecord
        from runtime.data.order.record import TrainingMetadata

        training = TrainingMetadata(last_train_step=0, consumed_train_samples=0, last_stage_idx=0,
                                    global_batch_size=config.global_batch_size, data_stages=[])
        record = CheckpointRecord(training, config.to_dict(),
                                  tokenizer=TokenizerRecord(TokenizerInfo(**tokenizer)) if tokenizer else None)
        CheckpointManager(Path(checkpoint), keep_last=1, is_writer=rank == 0).save(engine, 0, record)


def resumed_logits_worker(rank: int, world: int, hf_path: str, layout: dict, ids: torch.Tensor, out: str,
                          checkpoint: str) -> None:
    """Logits of a model resumed from ``checkpoint`` (any layout) into ``layout`` instead of read from HF."""
    from runtime.checkpoint.store import CheckpointManager
    from runtime.engine import Engine
    from runtime.parallel.context import ParallelContext

    config = hf_config(hf_path, **layout)
    ctx = ParallelContext(tp=config.parallelism.tp, pp=config.parallelism.pp, dp=config.parallelism.dp)
    engine = Engine(config, ctx)  # seeded random weights, replaced by the checkpoint's
    (step,) = Path(checkpoint).glob("step-*")
    CheckpointManager(Path(checkpoint), keep_last=1, is_writer=rank == 0).load(engine, step)
    logits = forward_logits(engine, ids)
    if logits is not None and ctx.dp_rank == 0 and ctx.tp_rank == 0:
        torch.save(logits, out)
