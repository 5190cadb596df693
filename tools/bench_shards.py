"""Benchmark the start-up cost per shard: ``python -m runtime.explain --step STEP`` (a far step) on a folder of
many shards against the same on a folder of few, in one run.

    python tools/bench_shards.py [--work bench_work/shards] [--shards 100000] [--baseline 100] [--repeat 3]
                                 [--step 999999]

Both folders hold one short document per shard (what ``nanoset tokenize --max-tokens-per-shard 1`` writes
for short documents) and a manifest as ``nanoset tokenize`` writes it (checksums, sources, largest ids).
Each ``explain`` is its own process; its wall time and peak RSS are measured (best of ``--repeat``, the two
folders in turn). The
folders are written by another process: a child's peak RSS counts the memory of the process that started it
(Linux keeps the larger at ``exec``), and writing 100,000 records grows this one by ~500 MB.
Targets: the many-shard folder costs < 0.5 s (a miss beyond 0.8 s) and < 100 MB more than the baseline folder.
Then the first open of the many-shard folder as an older nanoset wrote it (no shard table: it is built, once).
"""

from __future__ import annotations

import argparse
import hashlib
import multiprocessing
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from nanoset import Manifest, ShardInfo, TokenizerInfo, write_manifest  # noqa: E402
from nanoset.format.spec import MANIFEST_NAME, SHARD_TABLE_NAME, metadata_text, shard_files  # noqa: E402

DOC_TOKENS = 12
VOCAB = 8192
TARGET_SECONDS, MISS_SECONDS, TARGET_MB = 0.5, 0.8, 100
TRAIN_STEPS = 1_000_000


def write_folder(folder: Path, shards: int) -> None:
    """``shards`` one-document shards and their manifest (written without fsync: a benchmark fixture)."""
    if (folder / MANIFEST_NAME).is_file():
        return
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    rng = np.random.default_rng(0)
    source = str(folder.parent / "input.jsonl")
    infos = []
    for k in range(shards):
        name = f"{k // 1000:05d}_{k % 1000:05d}"
        tokens = rng.integers(1, VOCAB, DOC_TOKENS, dtype=np.uint16)
        tokens[-1] = 0
        data = {"ds": tokens.tobytes(), "index": np.array([DOC_TOKENS], dtype="<u8").tobytes(),
                "metadata": metadata_text("tokenizer", 2, DOC_TOKENS).encode()}
        for role, file in shard_files(name).items():
            (folder / file).write_bytes(data[role])
        infos.append(ShardInfo(name, DOC_TOKENS, 1, {role: hashlib.sha256(b).hexdigest() for role, b in data.items()},
                               [{"path": source, "split": None, "start": 64 * k, "stop": 64 * k + 64}],
                               max_token_id=int(tokens.max())))
    write_manifest(folder, Manifest(TokenizerInfo("tokenizer", VOCAB, eos_id=0, eos_token="<|endoftext|>",
                                                  sha256="0" * 64, path=source), "uint16", infos,
                                    build={"tokenizer_sha256": "0" * 64, "eos_id": 0, "dtype": "uint16"}))


def write_config(work: Path, folder: Path) -> Path:
    cfg = work / f"{folder.name}.yaml"
    cfg.write_text(f"""general: {{project: bench, run: {folder.name}, seed: 1, run_dir: {work / 'runs' / folder.name}}}
model: {{hidden_size: 32, num_hidden_layers: 1, num_attention_heads: 2, num_key_value_heads: 2,
        intermediate_size: 64, vocab_size: {VOCAB}, max_position_embeddings: 64}}
tokens: {{sequence_length: 8, micro_batch_size: 2, batch_accumulation_per_replica: 1, train_steps: {TRAIN_STEPS}}}
optimizer: {{learning_rate: 1.0e-3}}
lr_scheduler: {{warmup_steps: 1}}
data_stages:
  - name: s
    start_training_step: 1
    data: {{dataset: {{dataset_folder: {folder}}}}}
""")
    return cfg


def run_explain(cfg: Path, step: int) -> tuple[float, float]:
    """Wall seconds and peak RSS (MB) of one ``python -m runtime.explain --step STEP`` process."""
    t0 = time.perf_counter()
    proc = subprocess.Popen([sys.executable, "-m", "runtime.explain", "--config", str(cfg), "--step", str(step)],
                            cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            env={**os.environ, "PYTHONPATH": str(ROOT)})
    _, status, usage = os.wait4(proc.pid, 0)
    seconds = time.perf_counter() - t0
    if os.waitstatus_to_exitcode(status) != 0:
        raise SystemExit(f"explain failed on {cfg}: {proc.stderr.read().decode()}")
    return seconds, usage.ru_maxrss / 1024


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--work", default="bench_work/shards")
    ap.add_argument("--shards", type=int, default=100_000)
    ap.add_argument("--baseline", type=int, default=100)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--step", type=int, default=TRAIN_STEPS - 1)
    args = ap.parse_args()
    work = Path(args.work).resolve()
    work.mkdir(parents=True, exist_ok=True)
    os.environ.setdefault("NANOSET_CACHE_DIR", str(work / "cache"))
    configs = {}
    for n in (args.baseline, args.shards):
        folder = work / f"shards-{n}"
        t0 = time.perf_counter()
        writer = multiprocessing.get_context("spawn").Process(target=write_folder, args=(folder, n))
        writer.start()
        writer.join()
        if writer.exitcode:
            raise SystemExit(f"writing {folder} failed")
        print(f"{folder}: {n:,} shards ready ({time.perf_counter() - t0:.1f}s)", flush=True)
        configs[n] = write_config(work, folder)
    runs = {n: [] for n in configs}
    for _ in range(args.repeat):  # alternated: a change of the machine's load meets both folders alike
        for n, cfg in configs.items():
            runs[n].append(run_explain(cfg, args.step))
    results = {n: (min(s for s, _ in r), min(m for _, m in r)) for n, r in runs.items()}
    for n, (seconds, mb) in results.items():
        print(f"  {n:,} shards: explain --step {args.step}: {seconds:.2f}s, peak RSS {mb:.0f} MB (best of "
              f"{args.repeat})", flush=True)
    (t_base, m_base), (t_many, m_many) = results[args.baseline], results[args.shards]
    dt, dm = t_many - t_base, m_many - m_base
    print(f"{args.shards:,} vs {args.baseline:,} shards: +{dt:.2f}s ({t_many / t_base:.2f}x), +{dm:.0f} MB "
          f"({m_many / m_base:.2f}x); per shard {1e6 * dt / (args.shards - args.baseline):.1f} µs, "
          f"{1024 * dm / (args.shards - args.baseline):.2f} KB")
    verdict = "met" if dt < TARGET_SECONDS and dm < TARGET_MB else "NOT met" + " (a miss)" * (dt > MISS_SECONDS)
    print(f"targets: < {TARGET_SECONDS}s and < {TARGET_MB} MB more: {verdict}")
    many = work / f"shards-{args.shards}"
    (many / SHARD_TABLE_NAME).unlink(missing_ok=True)  # as a folder written before shard tables
    seconds, mb = run_explain(configs[args.shards], args.step)
    print(f"first open of {args.shards:,} shards without a shard table (builds it, once): {seconds:.2f}s, "
          f"peak RSS {mb:.0f} MB", flush=True)


if __name__ == "__main__":
    main()
