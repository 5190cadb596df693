"""Processes for tests/test_engine_speed.py: a tiny Llama trained 5 steps with compile or activation
checkpointing, against the same run without."""

from __future__ import annotations

import json

import torch

from tests.support.configs import tiny_config
from tests.support.engine_workers import rank_batches

STEPS = 5


def _counted(forward, calls: dict[int, int], i: int):
    def run(*args, **kwargs):
        calls[i] += 1
        return forward(*args, **kwargs)
    return run


def train_modes(rank: int, world: int, runs: dict[str, dict], out_path: str) -> None:
    """Per run name: losses, parameter names and how often each layer's MLP ran (2 per micro-batch
    when the layer is recomputed in the backward pass); written as JSON to ``out_path``."""
    from runtime.engine import Engine
    from runtime.parallel.context import ParallelContext

    ctx = ParallelContext()
    out = {}
    for name, model in runs.items():
        config = tiny_config(accum=2, num_hidden_layers=3, **model)
        engine = Engine(config, ctx)
        calls = {int(i): 0 for i in engine.chunks[0].layers}
        for i, layer in engine.chunks[0].layers.items():  # (module hooks do not run in a recomputation)
            if not model.get("compile"):  # a counter inside a compiled layer would recompile it each call
                layer.mlp.forward = _counted(layer.mlp.forward, calls, int(i))
        losses = [engine.train_step(rank_batches(s, ctx, 2)).loss for s in range(STEPS)]
        out[name] = {"losses": losses, "mlp_calls": [calls[i] for i in sorted(calls)],
                     "names": [n for n, _ in engine.named_parameters()]}
        if model.get("compile"):
            from torch._dynamo.utils import counters

            out[name]["unique_graphs"] = counters["stats"]["unique_graphs"]
    with open(out_path, "w") as f:
        json.dump(out, f)
    ctx.destroy()


def cuda_mixed_precision(rank: int, world: int, out_path: str) -> None:
    """bf16 compute with fp32 master weights, gradients and reduction; fused AdamW; no host sync
    inside the micro-batch loop (``set_sync_debug_mode("error")`` raises at one)."""
    from runtime.engine import Engine
    from runtime.parallel.context import ParallelContext

    ctx = ParallelContext()
    config = tiny_config(accum=2, num_hidden_layers=3)
    engine = Engine(config, ctx)
    seen = {}
    layer = engine.chunks[0].layers["1"]
    layer.attn.q_proj.register_forward_hook(lambda m, inp, out: seen.update(compute=str(out.dtype)))
    loop = engine._run_accumulation

    def checked(*args, **kwargs):
        torch.cuda.set_sync_debug_mode("error")
        try:
            return loop(*args, **kwargs)
        finally:
            torch.cuda.set_sync_debug_mode("default")
            seen["grads"] = sorted({str(p.grad.dtype) for p in engine.parameters() if p.grad is not None})

    engine._run_accumulation = checked
    # the loader's form: pinned host tensors
    losses = [engine.train_step([{k: v.pin_memory() for k, v in b.items()} for b in rank_batches(s, ctx, 2)]).loss
              for s in range(STEPS)]
    out = {"losses": losses, "fsdp": engine.use_fsdp, "compute": seen["compute"], "grads": seen["grads"],
           "params": sorted({str(p.dtype) for p in engine.parameters()}),
           "fused": [g.get("fused") for g in engine.optimizer.param_groups]}
    with open(out_path, "w") as f:
        json.dump(out, f)
    ctx.destroy()
