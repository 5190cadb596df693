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


def next_token_batches(ids: torch.Tensor, micro_batches: int, documents: bool = False) -> list[dict]:
    """``ids`` (rows of sequence length + 1) as ``micro_batches`` micro-batches of next-token prediction; with
    ``documents`` each row holds two documents (position ids restart halfway)."""
    inputs, labels = ids[:, :-1], ids[:, 1:]
    length = inputs.shape[1]
    positions = torch.arange(length).remainder(length // 2 if documents else length).expand(inputs.shape[0], -1)
    rows = inputs.shape[0] // micro_batches
    return [{"input_ids": inputs[i:i + rows].contiguous(), "label_ids": labels[i:i + rows].contiguous(),
             "label_mask": torch.ones_like(labels[i:i + rows], dtype=torch.bool),
             "position_ids": positions[i:i + rows].contiguous()} for i in range(0, inputs.shape[0], rows)]


def family_layouts_worker(rank: int, world: int, runs: list[tuple[str, str, dict]], ids: torch.Tensor,
                          out: str) -> None:
    """For each ``(name, hf folder, layout)``: load the model into the layout (``layout``'s ``attention``,
    ``activation_checkpointing`` and parallelism keys; every rank gets the same micro-batches), save its logits of
    ``ids[:, :-1]`` (without cp), its step-1 loss and gradient norm to ``out/name.pt``, and with ``checkpoint`` in
    the layout a checkpoint of the loaded weights to ``out/name-ckpt`` first. A run without a folder (``""``) is a
    fresh model of ``layout["family"]`` trained three steps: its losses."""
    from runtime.checkpoint.record import CheckpointRecord
    from runtime.checkpoint.store import CheckpointManager
    from runtime.data.order.record import TrainingMetadata
    from runtime.engine import Engine
    from runtime.hf.load import load_hf_weights
    from runtime.parallel.context import ParallelContext
    from tests.support.configs import HF_BASE, TINY, build, merged

    for name, hf, layout in runs:
        layout = dict(layout)
        checkpoint, attention = layout.pop("checkpoint", False), layout.pop("attention", "causal")
        recompute = layout.pop("activation_checkpointing", "none")
        parallel = {"dp": 1, "tp": 1, "pp": 1, "cp": 1, "pp_engine": "afab", **layout}
        if hf:
            data = merged(HF_BASE, model={"init_from_hf": hf, "attention": attention,
                                          "activation_checkpointing": recompute}, parallelism=parallel)
        else:
            data = merged(TINY, model={"family": parallel.pop("family")}, parallelism=parallel,
                          tokens={"batch_accumulation_per_replica": 2})
        data["data_stages"][0]["data"]["use_position_ids"] = True
        config = build(data)
        ctx = ParallelContext(tp=parallel["tp"], pp=parallel["pp"], dp=parallel["dp"], cp=parallel["cp"])
        engine = Engine(config, ctx, initialize=not hf)
        batches = next_token_batches(ids, 2, documents=attention == "document")
        saved = {}
        if not hf:
            saved["losses"] = [engine.train_step(batches).loss for _ in range(3)]
        else:
            load_hf_weights(engine.chunks, hf)
            if parallel["cp"] == 1 and attention == "causal":
                saved["logits"] = forward_logits(engine, ids[:, :-1])
            if checkpoint:
                training = TrainingMetadata(last_train_step=0, consumed_train_samples=0, last_stage_idx=0,
                                            global_batch_size=config.global_batch_size, data_stages=[])
                CheckpointManager(Path(out) / f"{name}-ckpt", keep_last=1, is_writer=rank == 0).save(
                    engine, 0, CheckpointRecord(training, config.to_dict()))
            result = engine.train_step(batches)
            saved["loss"], saved["grad_norm"] = result.loss, result.grad_norm
        if saved.get("logits", 0) is not None and ctx.dp_rank == ctx.tp_rank == ctx.cp_rank == 0:
            torch.save(saved, Path(out) / f"{name}.pt")
        dist.barrier()
