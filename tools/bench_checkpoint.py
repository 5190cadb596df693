"""Checkpoint saves: how long the training loop is blocked by a save written in the loop (``async_save: false``)
against one written in the background (``async_save: true``: blocked only while the state is copied to host
memory), for a ~100M-parameter Llama and its AdamW state, in one process; the median of a few saves each and the
ratio background/loop.

    PYTHONPATH=. python tools/bench_checkpoint.py [--hidden 768] [--layers 8] [--vocab 32000] [--saves 3]
        [--folder /tmp/nanoset-bench-checkpoint]

On CUDA the background save stages into pinned host buffers kept from one save to the next.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import tempfile
import time
from pathlib import Path

from runtime.checkpoint.record import CheckpointRecord
from runtime.checkpoint.store import CheckpointManager
from runtime.config.load import config_from_data
from runtime.data.order.record import TrainingMetadata
from runtime.engine import Engine
from runtime.parallel.context import ParallelContext


def model_config(hidden: int, layers: int, vocab: int):
    return config_from_data({
        "general": {"project": "bench", "run": "checkpoint"},
        "model": {"hidden_size": hidden, "num_hidden_layers": layers, "num_attention_heads": hidden // 64,
                  "intermediate_size": hidden * 8 // 3 // 64 * 64, "vocab_size": vocab,
                  "max_position_embeddings": 256},
        "tokens": {"sequence_length": 128, "micro_batch_size": 1, "train_steps": 10},
        "optimizer": {"learning_rate": 1e-4},
        "data_stages": [{"name": "s", "start_training_step": 1, "data": {"dataset": {"dataset_folder": "unused"}}}],
    })


def blocking_times(engine: Engine, folder: Path, background: bool, saves: int) -> tuple[list[float], list[float]]:
    """The loop's blocked seconds per save and, in the background, each write's whole time."""
    manager = CheckpointManager(folder, keep_last=1, is_writer=True, async_save=background,
                                pinned=engine.device.type == "cuda")
    record = CheckpointRecord(TrainingMetadata(0, 0, 0, 1, []), {})
    blocked, whole = [], []
    for step in range(1, saves + 1):
        began = time.perf_counter()
        manager.save(engine, step, record)
        blocked.append(time.perf_counter() - began)
        manager.wait()
        whole.append(time.perf_counter() - began)
    return blocked, whole


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--hidden", type=int, default=768)
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--vocab", type=int, default=32000)
    ap.add_argument("--saves", type=int, default=3)
    ap.add_argument("--folder", type=Path, default=None, help="where to write (default: a temporary folder)")
    args = ap.parse_args()
    config = model_config(args.hidden, args.layers, args.vocab)
    engine = Engine(config, ParallelContext())
    parameters = sum(p.numel() for p in engine.parameters())
    folder = args.folder or Path(tempfile.mkdtemp(prefix="nanoset-bench-checkpoint-"))
    try:
        loop, _ = blocking_times(engine, folder / "loop", False, args.saves)
        background, whole = blocking_times(engine, folder / "background", True, args.saves)
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    ratio = statistics.median(background) / statistics.median(loop)
    print(json.dumps({"parameters": parameters, "device": engine.device.type, "saves": args.saves,
                      "loop_blocked_s": [round(t, 3) for t in loop],
                      "background_blocked_s": [round(t, 3) for t in background],
                      "background_whole_s": [round(t, 3) for t in whole]}))
    print(f"blocking ratio background/loop: {ratio:.3f} (median {statistics.median(background):.3f} s against "
          f"{statistics.median(loop):.3f} s, {parameters / 1e6:.0f}M parameters on {engine.device.type})")


if __name__ == "__main__":
    main()
