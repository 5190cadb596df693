"""Benchmark the engine's overhead: ``Engine.train_step`` vs a bare PyTorch loop, same run.

    python tools/bench_engine.py [--steps 20] [--hidden 256] [--layers 4]

One process on CPU: the same small Llama (same initial weights), the same batches and the same
AdamW settings; the bare loop is forward, masked cross-entropy, backward, clip, step. Prints
both times per step and the ratio (target ≤ 1.10). Runs alternate and the best of each counts.

    python tools/bench_engine.py --compile [--steps 10]      # CPU: eager vs compiled layers
    python tools/bench_engine.py --checkpointing              # CPU: peak RSS per activation_checkpointing

    python tools/bench_engine.py --cp [--seq 4096] [--steps 3]  # CPU: context parallelism, cp 1 vs 2

``--cp``: the same tiny Llama (hidden 256, 4 layers, GQA 4:1, vocab 8192) on one micro-batch of
``L = 4096`` tokens, causal and document attention (a row packed with documents of 64-1024 tokens),
as one process (cp 1) and as two (cp 2, gloo), one thread per rank (a core plays a GPU: cp 2 uses
two, as it would two GPUs): the bytes of activations each rank saves for the backward pass (every tensor autograd
saves, counted once per storage with ``torch.autograd.graph.saved_tensors_hooks``, parameters left
out; target ≤ 0.6× of cp 1) and the step times (best of the timed steps over ``--repeat`` rounds in
which cp 1 and cp 2 alternate, so that bursts of other load on the machine count little).

    python tools/bench_engine.py --gpu-1b [--steps 20] [--gpu-compile both|on|off]

On a CUDA machine: a ~1B-parameter Llama (hidden 2048, 16 layers, GQA, vocab 32000) in bf16 at
sequence 2048 through ``Engine.train_step``, compiled layers off and on, causal and document
attention: one JSON line per configuration with tokens/s, MFU against the device's bf16 peak,
peak memory, and whether the micro-batch loop synchronizes with the host.
"""

from __future__ import annotations

import argparse
import os
import time

import torch
import torch.nn.functional as F

from runtime.config import Config
from runtime.config.load import from_dict
from runtime.config.rules import validate_config
from runtime.engine import Engine
from runtime.models.registry import spec_of
from runtime.parallel.context import ParallelContext


def make_config(hidden: int, layers: int, seq: int, mbs: int, accum: int, steps: int, vocab: int = 8192,
                intermediate: int | None = None, kv_heads: int | None = None, cp: int = 1,
                attention: str = "causal") -> Config:
    c = from_dict(Config, {
        "general": {"project": "bench", "run": "engine", "seed": 3},
        "parallelism": {"cp": cp},
        "model": {"hidden_size": hidden, "num_hidden_layers": layers, "num_attention_heads": hidden // 64,
                  "num_key_value_heads": kv_heads, "intermediate_size": intermediate or 4 * hidden,
                  "vocab_size": vocab, "max_position_embeddings": seq, "attention": attention},
        "tokens": {"sequence_length": seq, "micro_batch_size": mbs, "batch_accumulation_per_replica": accum,
                   "train_steps": steps},
        "optimizer": {"learning_rate": 1e-3, "weight_decay": 0.1, "clip_grad": 1.0},
        "data_stages": [{"name": "s", "start_training_step": 1, "data": {
            "use_position_ids": attention == "document", "dataset": {"dataset_folder": "unused"}}}],
    }, "config")
    validate_config(c)
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
    family = spec_of(config.model).modules()
    model = family.chunk(config.model)
    family.init_weights(model, config.model, config.general.seed)
    o = config.optimizer
    decay = [p for p in model.parameters() if p.ndim >= 2]
    rest = [p for p in model.parameters() if p.ndim < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": o.weight_decay}, {"params": rest, "weight_decay": 0.0}],
                            lr=o.learning_rate, betas=(o.adam_beta1, o.adam_beta2), eps=o.adam_eps, fused=True)
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


def document_positions(mbs: int, seq: int, generator: torch.Generator) -> torch.Tensor:
    """Position ids of rows packed with documents of 64-1024 tokens (restarting at each start)."""
    pos = torch.empty(mbs, seq, dtype=torch.int64)
    for row in range(mbs):
        i = 0
        while i < seq:
            n = min(int(torch.randint(64, 1025, (), generator=generator)), seq - i)
            pos[row, i : i + n] = torch.arange(n)
            i += n
    return pos


def gpu_run(config: Config, ctx: ParallelContext, steps: int, label: dict) -> dict:
    """One configuration on one CUDA device: tokens/s, MFU, peak memory, and whether the
    micro-batch loop makes a host sync (``torch.cuda.set_sync_debug_mode("error")`` around it)."""
    from runtime.observe.metrics import flops_per_token, peak_flops

    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats(ctx.device)
    engine = Engine(config, ctx)
    params = sum(p.numel() for p in engine.parameters())
    g = torch.Generator().manual_seed(1)
    data = batches(config, steps + 3)
    for step in data:
        for b in step:
            if config.model.attention == "document":
                b["position_ids"] = document_positions(*b["input_ids"].shape, g)
    # the loader's form: host tensors, pinned, copied by the engine (asynchronously)
    data = [[{k: v.contiguous().pin_memory() for k, v in b.items()} for b in step] for step in data]
    for step in data[:2]:  # warm-up: kernels, allocator, compilation
        engine.train_step(step)
    loop = engine._run_accumulation
    sync = "none"

    def checked(*args, **kwargs):
        torch.cuda.set_sync_debug_mode("error")
        try:
            return loop(*args, **kwargs)
        finally:
            torch.cuda.set_sync_debug_mode("default")

    engine._run_accumulation = checked
    try:
        engine.train_step(data[2])
    except RuntimeError as e:  # a synchronizing call inside the loop
        sync = str(e).splitlines()[0][:200]
        torch.cuda.set_sync_debug_mode("default")
    engine._run_accumulation = loop
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for step in data[3:]:
        engine.train_step(step)
    torch.cuda.synchronize()
    seconds = time.perf_counter() - t0
    tps = steps * config.global_batch_size * config.tokens.sequence_length / seconds
    peak = peak_flops(ctx.device)
    mfu = tps * flops_per_token(config.model, config.tokens.sequence_length) / peak if peak else None
    out = {**label, "device": torch.cuda.get_device_name(ctx.device), "params_b": round(params / 1e9, 3),
           "seq": config.tokens.sequence_length, "global_batch": config.global_batch_size,
           "tokens_per_s": round(tps), "mfu": round(mfu, 4) if mfu is not None else None,
           "peak_memory_gib": round(torch.cuda.max_memory_allocated(ctx.device) / 2**30, 2),
           "host_syncs_in_micro_batch_loop": sync}
    del engine
    return out


def gpu_1b(steps: int, compile_modes: list[bool]) -> None:
    """A ~1B Llama in bf16 at L=2048 on one CUDA device, one JSON line per configuration: compile
    off/on × attention causal/document (when the model has document attention)."""
    import json

    from runtime.config import ModelArgs

    attentions = ["causal", "document"] if "attention" in ModelArgs.__dataclass_fields__ else ["causal"]
    ctx = ParallelContext()
    for compiled in compile_modes:
        for attention in attentions:
            config = make_config(2048, 16, 2048, 4, 2, steps, vocab=32000, intermediate=5632, kv_heads=8)
            config.model.compile = compiled
            if attention != "causal":
                config.model.attention = attention
            try:
                row = gpu_run(config, ctx, steps, {"compile": compiled, "attention": attention})
            except Exception as e:  # noqa: BLE001 - one failing configuration does not hide the others
                row = {"compile": compiled, "attention": attention, "error": f"{type(e).__name__}: {e}"[:500]}
            print(json.dumps(row), flush=True)
    ctx.destroy()


def compare_compile(args: argparse.Namespace) -> None:
    """Eager vs compiled layers, same weights and batches, timed after a warm-up (compilation) step."""
    ctx = ParallelContext()
    times = {}
    for compiled in (False, True):
        config = make_config(args.hidden, args.layers, args.seq, 4, 2, args.steps)
        config.model.compile = compiled
        data = batches(config, args.steps + 2)
        engine = Engine(config, ctx)
        t0 = time.perf_counter()
        for step in data[:2]:
            engine.train_step(step)
        warm = time.perf_counter() - t0
        times[compiled] = min(engine_loop(engine, data[2:]) for _ in range(args.repeat)) / args.steps
        print(f"  {'compiled' if compiled else 'eager   '} layers: {1000 * times[compiled]:.1f} ms/step "
              f"(2 warm-up steps {warm:.1f}s)", flush=True)
    print(f"  ratio compiled/eager: {times[True] / times[False]:.3f}")
    ctx.destroy()


def checkpointing_child(mode: str, args: argparse.Namespace) -> None:
    """One activation-checkpointing mode in this (fresh) process: ms/step and peak RSS, as JSON."""
    import json
    import resource

    ctx = ParallelContext()
    config = make_config(args.hidden, args.layers, args.seq, 4, 2, args.steps)
    config.model.activation_checkpointing = mode
    data = batches(config, args.steps + 1)
    engine = Engine(config, ctx)
    engine.train_step(data[0])
    seconds = engine_loop(engine, data[1:])
    print(json.dumps({"mode": mode, "ms_per_step": 1000 * seconds / args.steps,
                      "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}))
    ctx.destroy()


def compare_checkpointing(args: argparse.Namespace) -> None:
    """Each mode in its own process, so that each peak RSS is its own."""
    import json
    import subprocess
    import sys

    rows = []
    for mode in ("none", "selective", "full"):
        cmd = [sys.executable, __file__, "--checkpointing-child", mode, "--hidden", str(args.hidden), "--layers",
               str(args.layers), "--seq", str(args.seq), "--steps", str(args.steps)]
        out = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout
        rows.append(json.loads(out.strip().splitlines()[-1]))
    base = rows[0]
    for r in rows:
        print(f"  activation_checkpointing {r['mode']:>9}: {r['ms_per_step']:.1f} ms/step "
              f"({r['ms_per_step'] / base['ms_per_step']:.2f}x), peak RSS {r['peak_rss_mb']:.0f} MB "
              f"({r['peak_rss_mb'] - base['peak_rss_mb']:+.0f} MB)")


class SavedActivations:
    """Bytes autograd saves for the backward pass while active, each storage once, parameters (and views of
    them: a linear layer saves its weight) left out."""

    def __init__(self) -> None:
        self.storages: dict[int, int] = {}

    def _pack(self, t: torch.Tensor) -> torch.Tensor:
        base = t
        while base._base is not None:
            base = base._base
        if not isinstance(base, torch.nn.Parameter):
            storage = t.untyped_storage()
            self.storages[storage.data_ptr()] = storage.nbytes()
        return t

    def hooks(self):
        return torch.autograd.graph.saved_tensors_hooks(self._pack, lambda t: t)

    @property
    def bytes(self) -> int:
        return sum(self.storages.values())


def cp_child(rank: int, world: int, port: int, args: argparse.Namespace, attention: str, out: str) -> None:
    """One rank of a cp = ``world`` run: saved activation bytes of one step, then the best time of the others."""
    import json

    os.environ.update(RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank), MASTER_ADDR="127.0.0.1",
                      MASTER_PORT=str(port))
    torch.set_num_threads(1)  # one core per rank, as one GPU per rank
    ctx = ParallelContext(cp=world)
    config = make_config(256, 4, args.seq, 1, 1, args.steps, kv_heads=1, cp=world, attention=attention)
    g = torch.Generator().manual_seed(1)
    data = batches(config, args.steps + 1)
    if attention == "document":
        for step in data:
            step[0]["position_ids"] = document_positions(1, args.seq, g)
    engine = Engine(config, ctx)
    saved = SavedActivations()
    with saved.hooks():
        engine.train_step(data[0])
    times = []
    for step in data[1:]:
        t0 = time.perf_counter()
        engine.train_step(step)
        times.append(time.perf_counter() - t0)
    with open(f"{out}.{rank}", "w") as f:
        json.dump({"saved_bytes": saved.bytes, "step_s": min(times), "threads": torch.get_num_threads()}, f)
    ctx.destroy()


def compare_context_parallel(args: argparse.Namespace) -> None:
    """cp 1 (one process) and cp 2 (two processes, gloo): saved activation bytes per rank and step times."""
    import json
    import socket
    import tempfile

    import torch.multiprocessing as mp

    print(f"CPU, Llama hidden 256 × 4 layers, GQA 4:1, vocab 8192, one row of {args.seq} tokens, best of "
          f"{args.steps} steps × {args.repeat} alternating rounds:", flush=True)
    with tempfile.TemporaryDirectory() as tmp:
        for attention in ("causal", "document"):
            rows: dict[int, dict] = {}
            for round_ in range(args.repeat):
                for cp in (1, 2):
                    with socket.socket() as sock:
                        sock.bind(("127.0.0.1", 0))
                        port = sock.getsockname()[1]
                    out = os.path.join(tmp, f"{attention}-cp{cp}-{round_}")
                    mp.start_processes(cp_child, args=(cp, port, args, attention, out), nprocs=cp,
                                       start_method="spawn")
                    ranks = [json.loads(open(f"{out}.{r}").read()) for r in range(cp)]
                    row = {"saved_bytes": max(r["saved_bytes"] for r in ranks),
                           "step_s": max(r["step_s"] for r in ranks), "threads": ranks[0]["threads"]}
                    if cp not in rows or row["step_s"] < rows[cp]["step_s"]:
                        rows[cp] = row
            for cp, row in rows.items():
                print(f"  {attention:>8} attention, cp {cp}: {row['saved_bytes'] / 2**20:,.1f} MiB of activations "
                      f"saved per rank, {1000 * row['step_s']:.0f} ms/step ({cp} process(es) × {row['threads']} "
                      f"threads)", flush=True)
            print(f"  {attention:>8} attention: saved activations cp 2 / cp 1 = "
                  f"{rows[2]['saved_bytes'] / rows[1]['saved_bytes']:.3f} (target <= 0.60), step time cp 2 / cp 1 = "
                  f"{rows[2]['step_s'] / rows[1]['step_s']:.3f}", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--gpu-1b", action="store_true", help="the ~1B bf16 benchmark on one CUDA device")
    ap.add_argument("--gpu-compile", choices=["both", "on", "off"], default="both",
                    help="with --gpu-1b: compiled layers on, off, or both")
    ap.add_argument("--compile", action="store_true", help="CPU: eager vs compiled layers (model.compile)")
    ap.add_argument("--checkpointing", action="store_true",
                    help="CPU: step time and peak RSS of activation_checkpointing none/selective/full")
    ap.add_argument("--checkpointing-child", help=argparse.SUPPRESS)
    ap.add_argument("--cp", action="store_true",
                    help="CPU: saved activation bytes per rank and step time, context parallel cp 1 vs 2")
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--seq", type=int, default=256)
    ap.add_argument("--repeat", type=int, default=2)
    args = ap.parse_args()
    if args.gpu_1b:
        return gpu_1b(args.steps, {"both": [False, True], "on": [True], "off": [False]}[args.gpu_compile])
    if args.checkpointing_child:
        return checkpointing_child(args.checkpointing_child, args)
    if args.cp:
        if args.seq == ap.get_default("seq"):
            args.seq = 4096
        if args.steps == ap.get_default("steps"):
            args.steps = 3
        return compare_context_parallel(args)
    header = (f"CPU, {torch.get_num_threads()} threads, Llama hidden {args.hidden} × {args.layers} layers, "
              f"seq {args.seq}, micro-batch 4 × 2 accumulation, {args.steps} steps:")
    if args.compile or args.checkpointing:
        print(header, flush=True)
        if args.compile:
            compare_compile(args)
        if args.checkpointing:
            compare_checkpointing(args)
        return
    config = make_config(args.hidden, args.layers, args.seq, 4, 2, args.steps)
    data = batches(config, args.steps)
    ctx = ParallelContext()
    bare_s = ours_s = float("inf")
    for _ in range(args.repeat):
        bare_s = min(bare_s, bare_loop(config, data))
        ours_s = min(ours_s, engine_loop(Engine(config, ctx), data))
    print(header)
    print(f"  bare PyTorch loop: {1000 * bare_s / args.steps:.1f} ms/step")
    print(f"  Engine.train_step: {1000 * ours_s / args.steps:.1f} ms/step")
    print(f"  ratio engine/bare: {ours_s / bare_s:.3f}  (target <= 1.10)")
    ctx.destroy()


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", str(os.cpu_count()))
    main()
