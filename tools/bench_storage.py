"""Benchmark reading a dataset from object storage against reading it from a local folder, in one run.

    python tools/bench_storage.py [--work bench_work/storage] [--shards 100] [--shard-tokens 262144]
                                  [--sequence-length 1024] [--batch 8] [--compare-clients]

A dataset of ``--shards`` shards is written locally and uploaded to an S3 server started here on 127.0.0.1
(moto's server mode: a real S3 protocol over the loopback, so the figures are the client's and the cache's,
not a cloud's network). Then, each timed as a training read pass (every window of the first stage, in the
data order's permutation, read as the loader reads them):

- local: the local folder;
- cold: ``s3://`` with an empty shard cache (every shard downloaded and checked once);
- warm: ``s3://`` again with the cache filled (the target: ≥ 0.9× local).

And the bytes fetched before step 1 (the manifest, the shard table and the shards the first global batch reads,
prefetch off) as a share of the dataset (the target: < 10% of a 100-shard dataset). With ``--compare-clients``,
the download of one 64 MB object by s3fs and by ``nanoset.storage`` (obstore, what the ``s3`` extra installs).
"""

from __future__ import annotations

import argparse
import hashlib
import logging
import os
import shutil
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from nanoset import Manifest, ShardInfo, TokenizerInfo, storage, write_manifest  # noqa: E402
from nanoset.format.spec import MANIFEST_NAME, metadata_text, shard_files  # noqa: E402

VOCAB = 50_000
DOC_TOKENS = 2048
BUCKET = "bench"
ROUNDS = 7


def write_folder(folder: Path, shards: int, shard_tokens: int) -> None:
    """``shards`` shards of ``shard_tokens`` random tokens in documents of ``DOC_TOKENS``, and their manifest."""
    if (folder / MANIFEST_NAME).is_file():
        return
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    rng = np.random.default_rng(0)
    infos = []
    for k in range(shards):
        name = f"{k:05d}_00000"
        tokens = rng.integers(1, VOCAB, shard_tokens, dtype=np.uint16)
        ends = np.arange(DOC_TOKENS, shard_tokens + 1, DOC_TOKENS, dtype="<u8")
        tokens[ends.astype(np.int64) - 1] = 0
        data = {"ds": tokens.tobytes(), "index": ends.tobytes(),
                "metadata": metadata_text("tokenizer", 2, shard_tokens).encode()}
        for role, file in shard_files(name).items():
            (folder / file).write_bytes(data[role])
        sha = {role: hashlib.sha256(b).hexdigest() for role, b in data.items()}
        infos.append(ShardInfo(name, shard_tokens, len(ends), sha, [], max_token_id=int(tokens.max())))
    write_manifest(folder, Manifest(TokenizerInfo("tokenizer", VOCAB, eos_id=0, eos_token="<|endoftext|>",
                                                  sha256="0" * 64), "uint16", infos,
                                    build={"tokenizer_sha256": "0" * 64, "eos_id": 0, "dtype": "uint16"}))


def config(folder: str, sequence_length: int, batch: int, work: Path, steps: int):
    from runtime.config.load import config_from_data

    return config_from_data({
        "general": {"project": "bench", "run": "storage", "seed": 1, "run_dir": str(work / "run")},
        "model": {"hidden_size": 32, "num_hidden_layers": 1, "num_attention_heads": 2, "num_key_value_heads": 2,
                  "intermediate_size": 64, "vocab_size": VOCAB, "max_position_embeddings": sequence_length},
        "tokens": {"sequence_length": sequence_length, "micro_batch_size": batch,
                   "batch_accumulation_per_replica": 1, "train_steps": steps},
        "optimizer": {"learning_rate": 1e-3}, "lr_scheduler": {"warmup_steps": 1},
        "data_stages": [{"name": "s", "start_training_step": 1, "data": {"dataset": {"dataset_folder": folder}}}],
    })


def read_pass(folder: str, sequence_length: int, batch: int, work: Path, epoch_steps: int,
              steps: int | None = None) -> float:
    """Seconds to read the stage's windows (one epoch: ``epoch_steps`` global batches, or the first ``steps``) in
    the data order, a global batch at a time, as the loader does (prefetch off: the reads themselves; the plan is made,
    and the manifest read, before the clock starts)."""
    from nanoset.format.mapcache import shared_cache
    from runtime.data.order.plan import DataPlan

    shared_cache().clear()  # every pass maps its files again, as a new run does
    plan = DataPlan(config(folder, sequence_length, batch, work, epoch_steps))
    stage = plan.stages[0]
    t0 = time.perf_counter()
    total = stage.num_samples if steps is None else min(stage.num_samples, steps * batch)
    out = np.empty((batch, sequence_length + 1), dtype=np.int64)
    for first in range(0, total - batch + 1, batch):
        where = plan.locate(stage, np.arange(first, first + batch))
        plan.datasets[int(where.dataset[0])].read(where.sample, out, None)
    return time.perf_counter() - t0


def cache_bytes(cache: Path) -> int:
    return sum(p.stat().st_size for p in cache.rglob("*") if p.is_file() and not p.name.endswith(".lock"))


def compare_clients(endpoint: str, work: Path) -> None:
    """One 64 MB object downloaded by s3fs and by the client ``nanoset.storage`` uses (obstore), best of 3."""
    try:
        import s3fs
    except ImportError:
        raise SystemExit("--compare-clients needs s3fs, which no extra installs (it pins an fsspec that datasets "
                         "refuses): pip install s3fs") from None

    blob = work / "blob.bin"
    blob.write_bytes(np.random.default_rng(1).integers(0, 255, 64 << 20, dtype=np.uint8).tobytes())
    storage.upload(blob, f"s3://{BUCKET}/blob.bin")
    fs = s3fs.S3FileSystem(endpoint_url=endpoint)
    times: dict[str, list[float]] = {"s3fs": [], "obstore": []}
    for _ in range(3):
        t0 = time.perf_counter()
        fs.get_file(f"{BUCKET}/blob.bin", str(work / "got-s3fs.bin"))
        times["s3fs"].append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        storage.download(f"s3://{BUCKET}/blob.bin", work / "got.bin")  # sha256 and fsync included
        times["obstore"].append(time.perf_counter() - t0)
    slow, fast = min(times["s3fs"]), min(times["obstore"])
    print(f"64 MB download, best of 3: s3fs get_file {slow:.2f} s, nanoset.storage (obstore) {fast:.2f} s "
          f"({fast / slow:.2f}× the time)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--work", type=Path, default=ROOT / "bench_work" / "storage")
    parser.add_argument("--shards", type=int, default=100)
    parser.add_argument("--shard-tokens", type=int, default=262_144)
    parser.add_argument("--sequence-length", type=int, default=1024)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--compare-clients", action="store_true")
    args = parser.parse_args()
    from moto.server import ThreadedMotoServer

    logging.getLogger("werkzeug").setLevel(logging.ERROR)
    work = args.work.resolve()
    local = work / "local"
    write_folder(local, args.shards, args.shard_tokens)
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    endpoint = f"http://{host}:{port}"
    os.environ.update(AWS_ENDPOINT_URL=endpoint, AWS_ACCESS_KEY_ID="bench", AWS_SECRET_ACCESS_KEY="bench",
                      AWS_DEFAULT_REGION="us-east-1", NANOSET_CACHE_DIR=str(work / "derived"))
    import boto3

    boto3.client("s3", endpoint_url=endpoint).create_bucket(Bucket=BUCKET)
    url = f"s3://{BUCKET}/data"
    for path in sorted(local.iterdir()):
        storage.upload(path, f"{url}/{path.name}")
    total = sum(p.stat().st_size for p in local.iterdir())
    cache = work / "cache"
    seq, batch = args.sequence_length, args.batch
    epoch = args.shards * args.shard_tokens // seq // batch  # global batches in one pass over the data

    shutil.rmtree(cache, ignore_errors=True)
    os.environ["NANOSET_STORAGE_CACHE_DIR"] = str(cache)
    read_pass(url, seq, batch, work, epoch, steps=1)
    first = cache_bytes(cache)
    shutil.rmtree(cache, ignore_errors=True)
    cold = read_pass(url, seq, batch, work, epoch)
    base, warm = [], []
    for _ in range(ROUNDS):  # interleaved: the machine's load falls on both alike
        base.append(read_pass(str(local), seq, batch, work, epoch))
        warm.append(read_pass(url, seq, batch, work, epoch))
    base, warm = min(base), min(warm)
    print(f"dataset: {args.shards} shards, {total / 1e6:.1f} MB; an epoch of {epoch * batch} windows of {seq} tokens, "
          f"global batch {batch}")
    print(f"read pass: local {base:.3f} s, s3 cold cache {cold:.3f} s, s3 warm cache {warm:.3f} s (best of {ROUNDS})")
    print(f"s3 warm vs local: {base / warm:.2f}× the speed; cold vs local: {base / cold:.2f}×")
    print(f"fetched before step 1: {first / 1e6:.2f} MB, {100 * first / total:.1f}% of the dataset")
    if args.compare_clients:
        compare_clients(endpoint, work)
    server.stop()


if __name__ == "__main__":
    main()
