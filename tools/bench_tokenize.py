"""Benchmark: `nanoset tokenize --workers 2` end to end vs the bare tokenizer on the same texts.

    python tools/bench_tokenize.py [--mb 64] [--workers 2] [--work bench_work]

Builds a corpus of JSON-lines files from text installed on this machine (Python sources and
documentation), trains a 16k BPE tokenizer on a slice of it, then measures in the same run:

* baseline: the texts already in memory, ``encode_batch_fast`` (the fastest batch encoder,
  Rust threads on all cores) in batches, no I/O and nothing written;
* nanoset: the real CLI as a subprocess, reading files, writing shards, manifest and all.

Each side runs ``--repeat`` times, interleaved; the best time of each counts. It prints both tokens/s, their ratio
(target ≥ 0.9) and the peak RSS of the job's processes for a quarter of the corpus and for all of it (target: it
does not grow with corpus size).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

TEXT_ROOTS = [Path(sys.prefix).resolve().parent, Path("/usr/share/doc"), Path("/usr/lib/python3"),
              Path(sys.base_prefix) / "lib"]
SUFFIXES = {".py", ".md", ".rst", ".txt"}


def iter_texts():
    seen = set()
    for root in TEXT_ROOTS:
        if not root.is_dir():
            continue
        for dirpath, dirnames, filenames in os.walk(root):
            dirnames.sort()
            for name in sorted(filenames):
                p = Path(dirpath) / name
                if p.suffix not in SUFFIXES or p.is_symlink():
                    continue
                try:
                    real = p.resolve()
                    if real in seen or real.stat().st_size < 512:
                        continue
                    seen.add(real)
                    yield real.read_bytes()[:200_000].decode("utf-8")
                except (OSError, UnicodeDecodeError):
                    continue


def build_corpus(folder: Path, megabytes: int) -> list[Path]:
    """JSON-lines files of about 8 MB each, ``megabytes`` in all."""
    folder.mkdir(parents=True, exist_ok=True)
    files, size, part = [], 0, None
    texts = iter_texts()
    while size < megabytes << 20:
        try:
            text = next(texts)
        except StopIteration:
            texts = iter_texts()  # not enough text installed: go round again
            continue
        if part is None or part.tell() > 8 << 20:
            if part:
                part.close()
            files.append(folder / f"part-{len(files):04d}.jsonl")
            part = open(files[-1], "w")
        line = json.dumps({"text": text}) + "\n"
        part.write(line)
        size += len(line)
    part.close()
    return files


def train_tokenizer(corpus: list[Path], out: Path) -> Path:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    def sample():
        with open(corpus[0]) as f:
            for i, line in enumerate(f):
                if i >= 400:
                    return
                yield json.loads(line)["text"]

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(sample(), trainers.BpeTrainer(
        vocab_size=16384, special_tokens=["<|endoftext|>"], show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    out.mkdir(parents=True, exist_ok=True)
    tok.save(str(out / "tokenizer.json"))
    return out / "tokenizer.json"


def baseline(files: list[Path], tokenizer: Path) -> tuple[int, float]:
    """Bare ``encode_batch_fast`` over in-memory texts, batches of about 1M characters."""
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(tokenizer))
    texts = [json.loads(line)["text"] for f in files for line in open(f)]
    batches, cur, chars = [], [], 0
    for t in texts:
        cur.append(t)
        chars += len(t)
        if chars >= 1 << 20:
            batches.append(cur)
            cur, chars = [], 0
    batches.append(cur)
    t0 = time.perf_counter()
    tokens = 0
    for b in batches:
        tokens += sum(len(e) for e in tok.encode_batch_fast(b))
    return tokens, time.perf_counter() - t0


def run_nanoset(files: list[Path], tokenizer: Path, out: Path, workers: int) -> tuple[int, float, float]:
    shutil.rmtree(out, ignore_errors=True)
    cmd = [sys.executable, "-m", "nanoset.cli", "tokenize", *map(str, files), "-o", str(out),
           "--tokenizer", str(tokenizer), "--workers", str(workers), "--quiet"]
    code = ("import resource, subprocess, sys; p = subprocess.run(sys.argv[1:]); "
            "print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss); sys.exit(p.returncode)")
    t0 = time.perf_counter()
    proc = subprocess.run([sys.executable, "-c", code, *cmd], capture_output=True, text=True)
    seconds = time.perf_counter() - t0
    if proc.returncode:
        raise SystemExit(proc.stderr)
    peak_kb = int(proc.stdout.strip().splitlines()[-1])
    tokens = json.loads((out / "nanoset.json").read_text())["num_tokens"]
    return tokens, seconds, peak_kb / 1024


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--mb", type=int, default=64)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--work", type=Path, default=Path("bench_work"))
    ap.add_argument("--repeat", type=int, default=2)
    args = ap.parse_args()
    corpus = build_corpus(args.work / "corpus", args.mb)
    tokenizer = train_tokenizer(corpus, args.work / "tokenizer")
    quarter = corpus[: max(1, len(corpus) // 4)]
    _, _, rss_quarter = run_nanoset(quarter, tokenizer, args.work / "out_quarter", args.workers)
    base_s = seconds = float("inf")
    for _ in range(args.repeat):  # interleaved, best of each: the machine is noisy
        base_tokens, b = baseline(corpus, tokenizer)
        tokens, s, rss = run_nanoset(corpus, tokenizer, args.work / "out", args.workers)
        base_s, seconds = min(base_s, b), min(seconds, s)
    assert tokens >= base_tokens, (tokens, base_tokens)  # ours adds one EOS per document
    size = sum(f.stat().st_size for f in corpus) / 2**20
    print(f"corpus: {size:.0f} MB in {len(corpus)} files, {tokens:,} tokens; {os.cpu_count()} cores")
    print(f"baseline encode_batch_fast (in memory): {base_tokens / base_s:,.0f} tokens/s ({base_s:.1f}s)")
    print(f"nanoset tokenize --workers {args.workers} (end to end): {tokens / seconds:,.0f} tokens/s ({seconds:.1f}s)")
    print(f"ratio nanoset/baseline: {(tokens / seconds) / (base_tokens / base_s):.3f}  (target >= 0.9)")
    print(f"peak RSS of the job's largest process: {rss_quarter:.0f} MB on {size / 4:.0f} MB of corpus, "
          f"{rss:.0f} MB on {size:.0f} MB")


if __name__ == "__main__":
    main()
