"""Benchmark the Trainer's overhead: full ``Trainer.train`` vs the engine's bare ``train_step`` loop.

    python tools/bench_train.py [--steps 30]

One process on CPU, the fixture corpora tokenized into three datasets, a two-stage config (a
blend with position ids, then another dataset at a shorter sequence length), metrics and logging
on, no checkpoints; with 0 and with 1 loader worker (on a 2-core machine a worker process takes
CPU from the training threads, which a GPU run does not have to share). The baseline feeds the engine the very same batches,
fetched beforehand, in the same run. Prints the overhead ratio (target ≤ 1.05) and the share of
step time spent waiting for data (target < 2 %).
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

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from nanoset.tokenize import TokenizeOptions, tokenize  # noqa: E402
from runtime.config import Config  # noqa: E402
from runtime.config_loading import from_dict  # noqa: E402
from runtime.data import DataPlan, StageDataset, get_train_dataloader  # noqa: E402
from runtime.engine import Engine  # noqa: E402
from runtime.trainer import Trainer  # noqa: E402


def make_config(work: Path, steps: int, workers: int) -> Config:
    shards = work / "shards"
    for name in ("web", "code", "sft"):
        if not (shards / name / "nanoset.json").exists():
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
            {"name": "pretrain", "start_training_step": 1, "data": {"num_loading_workers": workers, "use_position_ids": True,
             "dataset": {"dataset_folder": [str(shards / "web"), str(shards / "code")], "dataset_weights": [0.7, 0.3]}}},
            {"name": "anneal", "start_training_step": steps * 2 // 3, "sequence_length": 128,
             "data": {"num_loading_workers": workers, "dataset": {"dataset_folder": str(shards / "sft")}}},
        ],
    }, "config")
    c.validate()
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


def measure(config: Config, ctx) -> tuple[float, float, float]:
    """(bare engine seconds, trainer seconds, data-wait seconds) for one config, same process."""
    shutil.rmtree(config.general.run_path, ignore_errors=True)
    trainer = Trainer(config, parallel_context=ctx)
    data = prefetch(trainer.plan, ctx)
    bare = Engine(config, ctx)
    t0 = time.perf_counter()
    for step_batches in data:
        bare.train_step(step_batches)
    bare_s = time.perf_counter() - t0
    with contextlib.redirect_stdout(io.StringIO()):
        t0 = time.perf_counter()
        trainer.train()
        trainer_s = time.perf_counter() - t0
    rows = [json.loads(line) for line in (config.general.run_path / "metrics.jsonl").read_text().splitlines()]
    trainer.metrics.close()
    return bare_s, trainer_s, sum(r["data_wait_ms"] for r in rows) / 1000


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--work", type=Path, default=Path("bench_work/train"))
    args = ap.parse_args()
    from runtime.parallel.context import ParallelContext

    ctx = ParallelContext()
    print(f"CPU, 1 process, Llama 256 × 4 layers, two stages (seq 256 then 128), {args.steps} steps:")
    for workers in (0, 1):
        bare_s, trainer_s, wait_s = measure(make_config(args.work, args.steps, workers), ctx)
        print(f"  loader workers {workers}: engine train_step loop (batches prefetched) "
              f"{1000 * bare_s / args.steps:.1f} ms/step, full Trainer {1000 * trainer_s / args.steps:.1f} ms/step, "
              f"overhead ratio {trainer_s / bare_s:.3f} (target <= 1.05); data wait "
              f"{1000 * wait_s / args.steps:.2f} ms/step = {100 * wait_s / trainer_s:.2f}% of step time (target < 2%)")
    ctx.destroy()


if __name__ == "__main__":
    main()
