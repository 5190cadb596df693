"""Benchmark the Trainer's overhead: full ``Trainer.train`` vs the engine's bare ``train_step`` loop.

    python tools/bench_train.py [--steps 30] [--rounds 2]

One process on CPU, the fixture corpora tokenized into three datasets, a two-stage config (a
blend with position ids, then another dataset at a shorter sequence length), metrics and logging
on, no checkpoints; three loader settings: reading in the training thread (0 workers, no
prefetch), a prefetch thread (``data.prefetch: 2``), and 1 loader worker process (on a 2-core
machine a worker process takes CPU from the training threads, which a GPU run does not have to
share). The baseline feeds the engine the very same batches, read beforehand, in the same run.
Prints the overhead ratio (target ≤ 1.03 for the default setting) and the share of step time
spent waiting for data (target < 1 %): medians over the steps (the first of each run left out)
of rounds in which the settings alternate, so that bursts of other load on the machine count little.

Then the cost of per-sample losses (``--only sample-losses`` measures just that): the engine's
``train_step`` on the same batches, steps alternating with and without them (target < 2 %).
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import shutil
import sys
import time
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from nanoset.format.spec import MANIFEST_NAME  # noqa: E402
from nanoset.tokenize.job import TokenizeOptions, tokenize  # noqa: E402
from runtime.config import Config  # noqa: E402
from runtime.config.load import from_dict  # noqa: E402
from runtime.config.rules import validate_config  # noqa: E402
from runtime.data import DataPlan, StageDataset, get_train_dataloader  # noqa: E402
from runtime.engine import Engine  # noqa: E402
from runtime.trainer import Trainer  # noqa: E402


def make_config(work: Path, steps: int, workers: int, prefetch: int = 0) -> Config:
    shards = work / "shards"
    for name in ("web", "code", "sft"):
        if not (shards / name / MANIFEST_NAME).exists():
            tokenize(TokenizeOptions(inputs=[str(ROOT / "data_fixtures" / "corpus" / name)], output=shards / name,
                                     tokenizer=str(ROOT / "data_fixtures" / "tokenizer"), progress=False))
    c = from_dict(Config, {
        "general": {"project": "bench", "run": "train", "seed": 1, "run_dir": str(work / "run")},
        "model": {"hidden_size": 256, "num_hidden_layers": 4, "num_attention_heads": 4, "num_key_value_heads": 2,
                  "intermediate_size": 1024, "vocab_size": 2048, "max_position_embeddings": 256},
        "tokens": {"sequence_length": 256, "micro_batch_size": 4, "batch_accumulation_per_replica": 2,
                   "train_steps": steps},
        "optimizer": {"learning_rate": 1e-3},
        "checkpoints": {"checkpoint_interval": 0, "save_final": False, "resume": None},
        "logging": {"tensorboard": False},
        "data_stages": [
            {"name": "pretrain", "start_training_step": 1, "data": {
             "num_loading_workers": workers, "prefetch": prefetch, "use_position_ids": True,
             "dataset": {"dataset_folder": [str(shards / "web"), str(shards / "code")],
                         "dataset_weights": [0.7, 0.3]}}},
            {"name": "anneal", "start_training_step": steps * 2 // 3, "sequence_length": 128,
             "data": {"num_loading_workers": workers, "prefetch": prefetch,
                      "dataset": {"dataset_folder": str(shards / "sft")}}},
        ],
    }, "config")
    validate_config(c)
    return c


def prefetch(plan: DataPlan, ctx) -> list[list[dict]]:
    """Every step's micro-batches, read beforehand from the same loaders the trainer builds."""
    c = plan.config
    steps = []
    for stage in plan.stages:
        loader = get_train_dataloader(StageDataset(plan, stage), stage.sequence_length, ctx, 0, 0,
                                      c.tokens.micro_batch_size, use_position_ids=stage.use_position_ids)
        it = iter(loader)
        for _ in range(stage.num_steps):
            steps.append([next(it) for _ in range(c.tokens.batch_accumulation_per_replica)])
    return steps


def measure(config: Config, ctx) -> list[tuple[float, float, float]]:
    """Per step: (bare engine seconds, trainer seconds, data-wait seconds), one config, same process.

    The trainer's step time is the wall time between the ends of consecutive steps (from its
    ``tokens_per_s``): loading, logging and metrics included."""
    shutil.rmtree(config.general.run_path, ignore_errors=True)
    trainer = Trainer(config, parallel_context=ctx)
    data = prefetch(trainer.plan, ctx)
    bare = Engine(config, ctx)
    bare_s = []
    for step_batches in data:
        t0 = time.perf_counter()
        bare.train_step(step_batches)
        bare_s.append(time.perf_counter() - t0)
    with contextlib.redirect_stdout(io.StringIO()):
        trainer.train()
    rows = [json.loads(line) for line in (config.general.run_path / "metrics.jsonl").read_text().splitlines()]
    trainer.metrics.close()
    c = config.tokens
    seqs = {s.name: s.sequence_length for s in trainer.plan.stages}
    return [(b, c.micro_batch_size * c.batch_accumulation_per_replica * seqs[r["stage"]] / r["tokens_per_s"],
             r["data_wait_ms"] / 1000) for b, r in zip(bare_s, rows)]


def measure_sample_losses(config: Config, ctx, rounds: int) -> tuple[float, float]:
    """Median seconds of the engine's step (the loader's batches, read beforehand) with and without per-sample
    losses, the two alternating step by step on one engine so that other load on the machine hits both alike."""
    data = prefetch(DataPlan(config), ctx)
    engine = Engine(config, ctx)
    times: dict[bool, list[float]] = {True: [], False: []}
    for i in range(rounds * len(data)):
        batches = data[i % len(data)]
        engine.count_samples = i % 2 == 0
        t0 = time.perf_counter()
        engine.train_step(batches, num_sources=2 if "source_ids" in batches[0] else 0)
        times[engine.count_samples].append(time.perf_counter() - t0)
    return float(np.median(times[True][1:])), float(np.median(times[False][1:]))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--rounds", type=int, default=2, help="alternating rounds; the best of each setting counts")
    ap.add_argument("--work", type=Path, default=Path("bench_work/train"))
    ap.add_argument("--only", choices=["sample-losses"], help="measure only the cost of per-sample losses")
    args = ap.parse_args()
    from runtime.parallel.context import ParallelContext

    ctx = ParallelContext()
    if args.only is None:
        trainer_overhead(args, ctx)
    with_samples, without = measure_sample_losses(make_config(args.work, args.steps, 0), ctx, 2 * args.rounds)
    print(f"  per-sample losses: engine train_step {1000 * with_samples:.1f} ms/step with them, {1000 * without:.1f} "
          f"without: {100 * (with_samples / without - 1):+.2f}% (target < 2%)")
    ctx.destroy()


def trainer_overhead(args: argparse.Namespace, ctx) -> None:
    print(f"CPU, 1 process, {torch.get_num_threads()} threads, Llama 256 × 4 layers, two stages (seq 256 then "
          f"128), {args.steps} steps, {args.rounds} alternating rounds; medians over every step of every round "
          f"(robust to other load on the machine):")
    settings = [(0, 0), (0, 2), (1, 0)]  # (num_loading_workers, prefetch)
    steps: dict[tuple[int, int], list[tuple[float, float, float]]] = {s: [] for s in settings}
    for _ in range(args.rounds):
        for workers, depth in settings:
            steps[(workers, depth)] += measure(make_config(args.work, args.steps, workers, depth), ctx)[1:]
    from runtime.config import DataArgs

    defaults = (DataArgs.__dataclass_fields__["num_loading_workers"].default,
                DataArgs.__dataclass_fields__["prefetch"].default)
    for (workers, depth), rows in steps.items():
        mark = "  (the default)" if (workers, depth) == defaults else ""
        bare, full, wait = (np.array(x) for x in zip(*rows))
        print(f"  loader workers {workers}, prefetch {depth}: engine train_step (batches read beforehand) "
              f"{1000 * np.median(bare):.1f} ms/step, full Trainer {1000 * np.median(full):.1f} ms/step, "
              f"overhead ratio {np.median(full) / np.median(bare):.3f} (target <= 1.03); data wait "
              f"{1000 * np.median(wait):.2f} ms/step = {100 * np.median(wait / full):.2f}% of step time "
              f"(target < 1%){mark}")


if __name__ == "__main__":
    main()
