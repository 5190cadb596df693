"""Benchmark the runtime's data loading.

    python tools/bench_loader.py [--work bench_work/loader] [--samples 20000]

0. One folder, 0 workers: the cost of position ids, and ours vs datatrove's ``DatatroveFolderDataset``
   + ``DataLoader`` building the same complete batch dict (skipped with a note when datatrove is not
   installed: it is a benchmark-only comparison, ``pip install datatrove``).
1. Throughput: a stage blending 3 folders (shuffle on, L=2048, position ids, 2 loader workers):
   samples/s of our DataLoader (sampler, blend, permutation, windows, position ids, collator,
   worker processes) vs a baseline that reads the same windows straight from numpy memmaps in a
   loop, in the same run. Target ratio ≥ 0.7.
   Next to it, the same folders with ``data.packing: documents`` (whole documents per sample,
   padded, label masks): samples/s of both, the share of real tokens in packed samples, and the
   time to pack (first start) and to load the cached packing (later starts).
2. Scale: a stage over 1,000 shards and ≥ 1 billion tokens (sparse files, generated in seconds):
   time from building the stage dataset to the first batch (target < 1 s), and RSS growth
   against a stage 10× smaller (target: it does not grow with the token count).
"""

from __future__ import annotations

import argparse
import os
import resource
import shutil
import time
from pathlib import Path
from types import SimpleNamespace

import numpy as np

from nanoset import Manifest, ShardInfo, ShardWriter, TokenizerInfo, write_manifest
from nanoset.format.spec import MANIFEST_NAME, metadata_text
from runtime.config import Config
from runtime.config.load import from_dict
from runtime.config.rules import validate_config
from runtime.data import DataPlan, StageDataset, get_train_dataloader

L = 2048
VOCAB = 32000


def make_folder(folder: Path, tokens: int, seed: int) -> None:
    """One dataset of random ids and documents of 50-3000 tokens, ending in EOS (id 0)."""
    rng = np.random.default_rng(seed)
    lengths = []
    while sum(lengths) < tokens:
        lengths.append(int(rng.integers(50, 3000)))
    ids = rng.integers(1, VOCAB, sum(lengths), dtype=np.uint16)
    ids[np.cumsum(lengths) - 1] = 0
    with ShardWriter(folder, "00000", np.uint16, "bench") as w:
        w.add_documents(ids, np.array(lengths))
        info = w.finalize()
    write_manifest(folder, Manifest(TokenizerInfo("bench", VOCAB, eos_id=0), "uint16", [info]))


def make_sparse_folder(folder: Path, shards: int, tokens_per_shard: int) -> None:
    """``shards`` shards of zeros (sparse files: no disk, no time), one document each."""
    folder.mkdir(parents=True, exist_ok=True)
    infos = []
    for i in range(shards):
        name = f"{i:05d}"
        with open(folder / f"{name}.ds", "wb") as f:
            f.truncate(2 * tokens_per_shard)
        (folder / f"{name}.ds.index").write_bytes(np.array([tokens_per_shard], "<u8").tobytes())
        (folder / f"{name}.ds.metadata").write_text(metadata_text("bench", 2, tokens_per_shard))
        infos.append(ShardInfo(name, tokens_per_shard, 1, {}))
    write_manifest(folder, Manifest(TokenizerInfo("bench", VOCAB, eos_id=0), "uint16", infos))


def config(folders: list[str], weights: list[float], mbs: int, steps: int, workers: int, packing: str = "window",
           cache_dir: Path | None = None, positions: bool = True) -> Config:
    c = from_dict(Config, {
        "general": {"project": "bench", "run": "loader", "seed": 1,
                    **({"cache_dir": str(cache_dir)} if cache_dir is not None else {})},
        "model": {"hidden_size": 64, "num_hidden_layers": 1, "num_attention_heads": 1, "intermediate_size": 64,
                  "vocab_size": VOCAB, "max_position_embeddings": L},
        "tokens": {"sequence_length": L, "micro_batch_size": mbs, "train_steps": steps},
        "optimizer": {"learning_rate": 1e-3},
        "data_stages": [{"name": "blend", "start_training_step": 1, "data": {
            "num_loading_workers": workers, "use_position_ids": positions, "packing": packing,
            "dataset": {"dataset_folder": folders, "dataset_weights": weights}}}],
    }, "config")
    validate_config(c)
    return c


def loader(plan: DataPlan, workers: int):
    stage = plan.stages[0]
    ctx = SimpleNamespace(dp_rank=0, dp_size=1, pp_rank=0)
    return get_train_dataloader(StageDataset(plan, stage), L, ctx, 0, 0, plan.config.tokens.micro_batch_size,
                                dataloader_num_workers=workers, use_position_ids=stage.use_position_ids)


def baseline(plan: DataPlan, n: int) -> float:
    """The same windows, read from plain numpy memmaps of the .ds files in a loop."""
    stage = plan.stages[0]
    loc = plan.locate(stage, np.arange(n))
    maps = [np.memmap(Path(w.folder) / "00000.ds", dtype=np.uint16, mode="r") for w in plan.datasets]
    starts = (loc.sample * L).tolist()
    ds = loc.dataset.tolist()
    t0 = time.perf_counter()
    total = 0
    for d, s in zip(ds, starts):
        total += int(np.array(maps[d][s : s + L + 1])[0])
    return time.perf_counter() - t0


def ours(plan: DataPlan, n: int, workers: int) -> tuple[float, float]:
    """(seconds for n samples after the first batch, seconds to the first batch)."""
    mbs = plan.config.tokens.micro_batch_size
    t0 = time.perf_counter()
    it = iter(loader(plan, workers))
    next(it)
    first = time.perf_counter() - t0
    t0 = time.perf_counter()
    for _ in range(n // mbs):
        batch = next(it)
    assert batch["input_ids"].shape == (mbs, L)
    return time.perf_counter() - t0, first


def rss_mb() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def scale(work: Path, shards: int, tokens_per_shard: int) -> tuple[float, float]:
    folder = work / f"sparse_{shards}x{tokens_per_shard}"
    if not (folder / MANIFEST_NAME).exists():
        make_sparse_folder(folder, shards, tokens_per_shard)
    before = rss_mb()
    t0 = time.perf_counter()
    plan = DataPlan(config([str(folder)], [1.0], 8, 1000, 0))
    batch = next(iter(loader(plan, 0)))
    seconds = time.perf_counter() - t0
    assert batch["input_ids"].shape == (8, L)
    return seconds, rss_mb() - before


def documents_packing(args: argparse.Namespace, folders: list[str]) -> None:
    """Windows vs whole-document packing on the same folders and loader settings."""
    weights = [0.5, 0.3, 0.2]
    cache = args.work / "packing_cache"
    shutil.rmtree(cache, ignore_errors=True)
    t0 = time.perf_counter()
    DataPlan(config(folders, weights, args.mbs, 100_000, 0, "documents", cache))
    pack_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    packed = DataPlan(config(folders, weights, args.mbs, 100_000, 0, "documents", cache))
    cached_s = time.perf_counter() - t0
    docs = sum(w.reader.num_documents for w in packed.datasets)
    fill = sum(int(w.lengths(np.arange(len(w))).sum()) for w in packed.datasets) / sum(len(w) * (L + 1)
                                                                                     for w in packed.datasets)
    print(f"documents packing, same folders ({docs:,} documents; real tokens fill {100 * fill:.1f}% of packed "
          f"samples): packing {pack_s:.2f}s at the first start, {cached_s:.3f}s from the cache")
    for workers in (args.workers, 0):
        windows = DataPlan(config(folders, weights, args.mbs, 100_000, workers))
        packed = DataPlan(config(folders, weights, args.mbs, 100_000, workers, "documents", cache))
        win_s, _ = ours(windows, args.samples, workers)
        doc_s, _ = ours(packed, args.samples, workers)
        print(f"  {workers} workers, micro-batch {args.mbs:>3}: windows {args.samples / win_s:>8,.0f} samples/s, "
              f"documents {args.samples / doc_s:>8,.0f} samples/s, ratio {win_s / doc_s:.3f}")


def _timed(make_iter, n: int, mbs: int) -> float:
    """Seconds for ``n`` samples from a fresh iterator, after its first batch."""
    it = make_iter()
    next(it)
    t0 = time.perf_counter()
    for _ in range(n // mbs):
        batch = next(it)
    seconds = time.perf_counter() - t0
    assert batch["input_ids"].shape[0] == mbs
    return seconds


def complete_batch(samples: list[dict]) -> dict:
    """datatrove's samples (``L + 1`` ids, positions) as the complete batch dict the engine takes: ids,
    labels, masks, positions (the label before a document start masked), as our collator makes it."""
    import torch

    ids = torch.stack([s["input_ids"] for s in samples])
    pos = torch.stack([s["positions"] for s in samples]).long()
    mask = torch.ones(len(samples), L, dtype=torch.bool)
    return {"input_ids": ids[:, :-1], "label_ids": ids[:, 1:], "position_ids": pos[:, :-1], "input_mask": mask,
            "label_mask": pos[:, 1:] != 0}


def versus_datatrove(args: argparse.Namespace, folder: str) -> None:
    """One folder, 0 workers, micro-batch ``--mbs``: position ids' cost, and ours vs datatrove's
    ``DatatroveFolderDataset`` + ``DataLoader``. Configurations alternate, ``--rounds`` times; the
    best round of each counts (the machine may be shared)."""
    from torch.utils.data import DataLoader

    mbs = args.mbs
    runs = {}
    for positions in (False, True):
        plan = DataPlan(config([folder], [1.0], mbs, 100_000, 0, positions=positions))
        runs[f"ours, {'with' if positions else 'no'} position ids"] = lambda plan=plan: iter(loader(plan, 0))
    try:
        from datatrove.utils.dataset import DatatroveFolderDataset
    except ImportError:
        print("  datatrove is not installed: its comparison is skipped (pip install datatrove to add it)")
    else:
        def datatrove(positions: bool):
            ds = DatatroveFolderDataset(folder, L, filename_pattern="*.ds", token_size=2, return_positions=positions)
            collate = complete_batch if positions else None  # its own default_collate without positions
            return iter(DataLoader(ds, batch_size=mbs, num_workers=0, collate_fn=collate))

        runs["datatrove, ids only"] = lambda: datatrove(False)
        runs["datatrove, complete batch"] = lambda: datatrove(True)
    best = {name: float("inf") for name in runs}
    for _ in range(args.rounds):
        for name, make in runs.items():
            best[name] = min(best[name], _timed(make, args.samples, mbs))
    print(f"one folder, 0 workers, micro-batch {mbs}, best of {args.rounds} alternating rounds of {args.samples} "
          f"samples (ours: shuffled windows; datatrove: its sequential order):")
    for name, s in best.items():
        print(f"  {name:<30} {args.samples / s:>9,.0f} samples/s")
    with_pos, no_pos = best["ours, with position ids"], best["ours, no position ids"]
    print(f"  position ids cost: {with_pos / no_pos:.2f}x the time without (target <= 1.3)")
    if "datatrove, complete batch" in best:
        complete, ids_only = best["datatrove, complete batch"], best["datatrove, ids only"]
        print(f"  ours with position ids vs datatrove's complete batch: {complete / with_pos:.2f}x faster "
              f"(target >= 1.5); vs datatrove's ids only: {ids_only / with_pos:.2f}x")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--work", type=Path, default=Path("bench_work/loader"))
    ap.add_argument("--samples", type=int, default=16384)
    ap.add_argument("--mbs", type=int, default=8)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=5, help="alternating rounds of the 0-worker comparison")
    ap.add_argument("--only-datatrove", action="store_true", help="run only the 0-worker comparison")
    args = ap.parse_args()
    args.work.mkdir(parents=True, exist_ok=True)
    folders = []
    for i, tokens in enumerate((60_000_000, 30_000_000, 10_000_000)):
        folder = args.work / f"blend_{i}"
        if not (folder / MANIFEST_NAME).exists():
            shutil.rmtree(folder, ignore_errors=True)
            make_folder(folder, tokens, i)
        folders.append(str(folder))
    versus_datatrove(args, folders[0])
    if args.only_datatrove:
        return
    print(f"throughput, L={L}, 3-folder blend, shuffle, position ids, {args.samples} samples "
          f"(baseline: the same windows read from numpy memmaps in a loop):")
    for workers in (args.workers, 0):
        for mbs in (args.mbs, 4 * args.mbs):
            plan = DataPlan(config(folders, [0.5, 0.3, 0.2], mbs, 100_000, workers))
            baseline(plan, 2000)  # warm the page cache for both sides
            base_s = baseline(plan, args.samples)
            our_s, first = ours(plan, args.samples, workers)
            print(f"  {workers} workers, micro-batch {mbs:>3}: baseline {args.samples / base_s:>9,.0f} samples/s, "
                  f"nanoset DataLoader {args.samples / our_s:>8,.0f} samples/s (first batch {first:.2f}s), "
                  f"ratio {base_s / our_s:.3f}  (target >= 0.7)")
    documents_packing(args, folders)
    small_s, small_rss = scale(args.work, 100, 1_000_000)
    big_s, big_rss = scale(args.work, 1000, 1_000_000)
    print("scale: build stage dataset -> first batch")
    print(f"  100 shards, 100M tokens: {small_s:.3f}s, RSS +{small_rss:.1f} MB")
    print(f"  1,000 shards, 1.0B tokens: {big_s:.3f}s (target < 1 s), RSS +{big_rss:.1f} MB")
    print(f"  peak RSS of this process: {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:.0f} MB")


if __name__ == "__main__":
    main()
