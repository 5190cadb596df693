"""Benchmark the engine's overhead: ``Engine.train_step`` vs a bare PyTorch loop, same run.

    python tools/bench_engine.py [--steps 20] [--hidden 256] [--layers 4]

One process on CPU: the same small Llama (same initial weights), the same batches and the same
AdamW settings; the bare loop is forward, masked cross-entropy, backward, clip, step. Prints
both times per step and the ratio (target ≤ 1.10). Runs alternate and the best of each counts.

    python tools/bench_engine.py --gpu-1b [--steps 20]

On a CUDA machine: a ~1B-parameter Llama (hidden 2048, 16 layers, GQA, vocab 32000) in bf16 at
sequence 2048 through ``Engine.train_step``: tokens/s and MFU against the device's bf16 peak.
"""

from __future__ import annotations

import argparse
import os
import time

import torch
import torch.nn.functional as F

from runtime.config import Config
from runtime.config_loading import from_dict
from runtime.engine import Engine
from runtime.models.llama import LlamaChunk, init_weights
from runtime.parallel.context import ParallelContext


def make_config(hidden: int, layers: int, seq: int, mbs: int, accum: int, steps: int, vocab: int = 8192,
                intermediate: int | None = None, kv_heads: int | None = None) -> Config:
    c = from_dict(Config, {
        "general": {"project": "bench", "run": "engine", "seed": 3},
        "model": {"hidden_size": hidden, "num_hidden_layers": layers, "num_attention_heads": hidden // 64,
                  "num_key_value_heads": kv_heads, "intermediate_size": intermediate or 4 * hidden,
                  "vocab_size": vocab, "max_position_embeddings": seq},
        "tokens": {"sequence_length": seq, "micro_batch_size": mbs, "batch_accumulation_per_replica": accum,
                   "train_steps": steps},
        "optimizer": {"learning_rate": 1e-3, "weight_decay": 0.1, "clip_grad": 1.0},
        "data_stages": [{"name": "s", "start_training_step": 1, "data": {"dataset": {"dataset_folder": "unused"}}}],
    }, "config")
    c.validate()
    return c


def batches(config: Config, steps: int) -> list[list[dict]]:
    t = config.tokens
    g = torch.Generator().manual_seed(0)
    out = []
    for _ in range(steps):
        step = []
        for _ in range(t.batch_accumulation_per_replica):
            tokens = torch.randint(0, config.model.vocab_size, (t.micro_batch_size, t.sequence_length + 1), generator=g)
            step.append({"input_ids": tokens[:, :-1], "label_ids": tokens[:, 1:],
                         "position_ids": torch.arange(t.sequence_length).expand(t.micro_batch_size, -1),
                         "input_mask": torch.ones(t.micro_batch_size, t.sequence_length, dtype=torch.bool),
                         "label_mask": torch.ones(t.micro_batch_size, t.sequence_length, dtype=torch.bool)})
        out.append(step)
    return out


def bare_loop(config: Config, data: list[list[dict]]) -> float:
    model = LlamaChunk(config.model)
    init_weights(model, config.model, config.general.seed)
    o = config.optimizer
    decay = [p for p in model.parameters() if p.ndim >= 2]
    rest = [p for p in model.parameters() if p.ndim < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": o.weight_decay}, {"params": rest, "weight_decay": 0.0}],
                            lr=o.learning_rate, betas=(o.adam_beta1, o.adam_beta2), eps=o.adam_eps, foreach=True)
    t0 = time.perf_counter()
    for step in data:
        n = sum(int(b["label_mask"].sum()) for b in step)
        for b in step:
            logits = model(b["input_ids"], b["position_ids"])
            labels = torch.where(b["label_mask"], b["label_ids"], -100)
            loss = F.cross_entropy(logits.flatten(0, 1), labels.flatten(), ignore_index=-100, reduction="sum") / n
            loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), o.clip_grad)
        opt.step()
        opt.zero_grad(set_to_none=True)
        float(loss.detach())
    return time.perf_counter() - t0


def engine_loop(engine: Engine, data: list[list[dict]]) -> float:
    t0 = time.perf_counter()
    for step in data:
        engine.train_step(step)
    return time.perf_counter() - t0


def gpu_1b(steps: int) -> None:
    """tokens/s and MFU of a ~1B model in bf16 on one CUDA device."""
    from runtime.metrics import flops_per_token, peak_flops

    config = make_config(2048, 16, 2048, 4, 2, steps, vocab=32000, intermediate=5632, kv_heads=8)
    ctx = ParallelContext()
    engine = Engine(config, ctx)
    params = sum(p.numel() for p in engine.parameters())
    data = [[{k: v.to(ctx.device) for k, v in b.items()} for b in step] for step in batches(config, steps + 3)]
    for step in data[:3]:  # warm-up: kernels, allocator
        engine.train_step(step)
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for step in data[3:]:
        engine.train_step(step)
    torch.cuda.synchronize()
    seconds = time.perf_counter() - t0
    tokens = steps * config.global_batch_size * config.tokens.sequence_length
    tps = tokens / seconds
    peak = peak_flops(ctx.device)
    mfu = tps * flops_per_token(config.model, config.tokens.sequence_length) / peak if peak else float("nan")
    print(f"{torch.cuda.get_device_name(ctx.device)}: Llama {params / 1e9:.2f}B params, bf16, seq 2048, "
          f"global batch {config.global_batch_size}: {tps:,.0f} tokens/s, MFU {100 * mfu:.1f}% (target >= 45%)")
    ctx.destroy()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--gpu-1b", action="store_true", help="the ~1B bf16 MFU benchmark on one CUDA device")
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--seq", type=int, default=256)
    ap.add_argument("--repeat", type=int, default=2)
    args = ap.parse_args()
    if args.gpu_1b:
        return gpu_1b(args.steps)
    config = make_config(args.hidden, args.layers, args.seq, 4, 2, args.steps)
    data = batches(config, args.steps)
    ctx = ParallelContext()
    bare_s = ours_s = float("inf")
    for _ in range(args.repeat):
        bare_s = min(bare_s, bare_loop(config, data))
        ours_s = min(ours_s, engine_loop(Engine(config, ctx), data))
    print(f"CPU, {torch.get_num_threads()} threads, Llama hidden {args.hidden} × {args.layers} layers, "
          f"seq {args.seq}, micro-batch 4 × 2 accumulation, {args.steps} steps:")
    print(f"  bare PyTorch loop: {1000 * bare_s / args.steps:.1f} ms/step")
    print(f"  Engine.train_step: {1000 * ours_s / args.steps:.1f} ms/step")
    print(f"  ratio engine/bare: {ours_s / bare_s:.3f}  (target <= 1.10)")
    ctx.destroy()


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", str(os.cpu_count()))
    main()
