"""Benchmark data surgery's start-up cost: 100,000 excised documents against none, in one run.

    python tools/bench_surgery.py [--work bench_work/surgery] [--documents 2000000] [--excluded 100000]
                                  [--repeat 3]

One dataset of ``--documents`` documents of 32 tokens (a sparse token file: only the index is read) at
sequence length 16 (~4 million windows). Timed, best of ``--repeat``: building the data plan (which
maps the excluded documents to windows and sorts their positions in the epochs a step needs) plus the
global batch of a far step, with and without ``surgery.exclude_documents_file`` naming ``--excluded``
random documents; then the per-sample lookup cost of that far step's batch. Target: the surgery adds
< 1 s to start-up (a miss beyond 1.5 s).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from nanoset import Manifest, ShardInfo, TokenizerInfo, write_manifest  # noqa: E402
from nanoset.format.spec import MANIFEST_NAME, metadata_text  # noqa: E402
from runtime.config import Config  # noqa: E402
from runtime.config.load import from_dict  # noqa: E402
from runtime.config.rules import validate_config  # noqa: E402
from runtime.data import DataPlan  # noqa: E402

DOC_TOKENS, L, VOCAB, MBS, STEPS = 32, 16, 8192, 64, 1_000_000
TARGET_SECONDS, MISS_SECONDS = 1.0, 1.5


def make_folder(folder: Path, documents: int) -> None:
    """One shard of ``documents`` documents of DOC_TOKENS tokens (zeros, a sparse file) and its index."""
    if (folder / MANIFEST_NAME).is_file():
        return
    folder.mkdir(parents=True, exist_ok=True)
    tokens = documents * DOC_TOKENS
    with open(folder / "00000.ds", "wb") as f:
        f.truncate(2 * tokens)
    ends = np.arange(1, documents + 1, dtype="<u8") * DOC_TOKENS
    (folder / "00000.ds.index").write_bytes(ends.tobytes())
    (folder / "00000.ds.metadata").write_text(metadata_text("bench", 2, tokens))
    write_manifest(folder, Manifest(TokenizerInfo("bench", VOCAB, eos_id=0), "uint16",
                                    [ShardInfo("00000", tokens, documents, {})]))


def config(folder: Path, excluded: Path | None) -> Config:
    surgery = {"exclude_documents_file": str(excluded), "exclude_from_step": 1} if excluded is not None else {}
    c = from_dict(Config, {
        "general": {"project": "bench", "run": "surgery", "seed": 1},
        "model": {"hidden_size": 64, "num_hidden_layers": 1, "num_attention_heads": 1, "intermediate_size": 64,
                  "vocab_size": VOCAB, "max_position_embeddings": L},
        "tokens": {"sequence_length": L, "micro_batch_size": MBS, "train_steps": STEPS},
        "optimizer": {"learning_rate": 1e-3},
        "data_stages": [{"name": "s", "start_training_step": 1, "data": {"dataset": {"dataset_folder": str(folder)}}}],
        "surgery": surgery,
    }, "config")
    validate_config(c)
    return c


def start(c: Config, step: int) -> tuple[float, float, DataPlan]:
    """Seconds (wall, and this process's CPU: what the work costs on a shared machine) to build the plan and locate
    the global batch of ``step``."""
    t, cpu = time.perf_counter(), time.process_time()
    plan = DataPlan(c)
    plan.global_batch(step)
    return time.perf_counter() - t, time.process_time() - cpu, plan


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--work", type=Path, default=ROOT / "bench_work" / "surgery")
    ap.add_argument("--documents", type=int, default=2_000_000)
    ap.add_argument("--excluded", type=int, default=100_000)
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    folder = args.work / "data"
    make_folder(folder, args.documents)
    rng = np.random.default_rng(0)
    docs = np.sort(rng.choice(args.documents, args.excluded, replace=False))
    listed = args.work / "excluded.txt"
    listed.write_text("".join(f"{folder}:{d}\n" for d in docs.tolist()))
    plain, cut = config(folder, None), config(folder, listed)
    windows = (args.documents * DOC_TOKENS - 1) // L
    step = STEPS // 2  # epoch ~ step · MBS / windows: a far step, several epochs in
    base = min(start(plain, step)[:2] for _ in range(args.repeat))
    runs = [start(cut, step) for _ in range(args.repeat)]
    surgery = min(r[:2] for r in runs)
    plan = runs[-1][2]
    passed = len(plan.draw_indexes[0].excluded_samples())
    t = time.perf_counter()
    loc = plan.global_batch(step + 1)[1]
    lookup = (time.perf_counter() - t) / MBS
    print(f"{args.documents:,} documents, {windows:,} windows of {L + 1} tokens; {args.excluded:,} excised documents "
          f"→ {passed:,} windows passed over; step {step:,} (epoch {int(loc.epoch[0])})")
    print(f"start-up (plan + a far step's batch): {base[0]:.3f} s without surgery, {surgery[0]:.3f} s with it: "
          f"+{surgery[0] - base[0]:.3f} s wall, +{surgery[1] - base[1]:.3f} s CPU (load average "
          f"{os.getloadavg()[0]:.1f} on {os.cpu_count()} cores)")
    print(f"a sample of a far step, located with surgery: {1e6 * lookup:.1f} µs")
    added = surgery[0] - base[0]
    verdict = "ok" if added < TARGET_SECONDS else ("near" if added < MISS_SECONDS else "MISS")
    print(f"target: surgery adds < {TARGET_SECONDS:g} s to start-up: {verdict}")
    return 0 if added < MISS_SECONDS else 1


if __name__ == "__main__":
    sys.exit(main())
