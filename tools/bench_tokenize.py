"""Benchmark: `nanoset tokenize` end to end against bare encoder scripts, in the same run.

    python tools/bench_tokenize.py [--mb 24] [--workers 2] [--rounds 3] [--work bench_work]
                                   [--corpus FILE_OR_FOLDER ...] [--tokenizer PATH] [--text fixture|installed]
                                   [--chat]

Without ``--corpus`` it writes a JSON-lines corpus of ``--mb`` MB (``fixture``: documents from the fixture
generators of tools/make_fixtures.py; ``installed``: Python sources and documentation installed on this
machine) in files of a few MB, and without ``--tokenizer`` trains a GPT-2-style byte-level BPE (GPT-2's
regex, 50,257 entries at most, ``<|endoftext|>``, the ChatML tokens and template) on a slice of it. Then,
each ``--rounds`` times, interleaved, each run as its own process tree with ``--workers`` processes:

* bare tokenizers: a script that reads the files (``json.loads`` per line), ``encode_batch_fast`` in
  batches of 1M characters, and writes the ids as uint16: what a bare Hugging Face pipeline does;
* bare fastokens: the same script with fastokens' ``encode_batch_flat``;
* nanoset auto and nanoset --backend tokenizers: the real CLI (shards, index, checksums, manifest).

The best time of each counts. It prints the times and the ratios (targets: nanoset auto ≥ 3× bare
tokenizers and ≥ 0.6× bare fastokens), also in CPU seconds of each process tree (steadier than wall
time on a machine shared with other jobs), checks that both nanoset runs wrote byte-identical shards and
that every run produced the same tokens, and gives the peak RSS of nanoset's largest process on a quarter
of the corpus and on all of it (it must not grow with the corpus).

``--chat``: the corpus is conversations (``messages`` rows from the fixture generator) and the runs are
``nanoset tokenize --chat`` with each backend (target: auto ≥ 2× tokenizers), shards and loss masks
compared byte for byte.
"""

from __future__ import annotations

import argparse
import filecmp
import json
import os
import random
import resource
import shutil
import subprocess
import sys
import time
from pathlib import Path

TOOLS = Path(__file__).resolve().parent
TEXT_ROOTS = [Path(sys.prefix).resolve().parent, Path("/usr/share/doc"), Path("/usr/lib/python3"),
              Path(sys.base_prefix) / "lib"]
SUFFIXES = {".py", ".md", ".rst", ".txt"}
FILE_BYTES = 3 << 20  # corpus files of about this size, so that the bare scripts' processes share work evenly

BARE = r"""
import json, sys
from multiprocessing import get_context

import numpy as np


def work(args):
    backend, tokenizer, paths, out = args
    if backend == "tokenizers":
        from tokenizers import Tokenizer

        tok = Tokenizer.from_file(tokenizer)

        def encode(texts):
            return np.concatenate([np.array(e.ids, dtype=np.uint32) for e in tok.encode_batch_fast(texts)])
    else:
        import fastokens

        tok = fastokens.Tokenizer.from_file(tokenizer)

        def encode(texts):
            return np.frombuffer(tok.encode_batch_flat(texts, add_special_tokens=True)[0], dtype=np.uint32)

    tokens = 0
    with open(out, "wb") as o:
        for path in paths:
            batch, chars = [], 0
            with open(path, "rb") as f:
                for line in f:
                    text = json.loads(line)["text"]
                    batch.append(text)
                    chars += len(text)
                    if chars >= 1 << 20:
                        ids = encode(batch)
                        o.write(ids.astype(np.uint16).tobytes())
                        tokens += len(ids)
                        batch, chars = [], 0
            if batch:
                ids = encode(batch)
                o.write(ids.astype(np.uint16).tobytes())
                tokens += len(ids)
    return tokens


if __name__ == "__main__":
    backend, tokenizer, out, workers, *paths = sys.argv[1:]
    n = int(workers)
    jobs = [(backend, tokenizer, paths[i::n], f"{out}.{i}") for i in range(n)]
    with get_context("spawn").Pool(n) as pool:
        print(sum(pool.map(work, jobs)))
"""


def iter_installed_texts():
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


def iter_fixture_rows(chat: bool):
    """Rows from the fixture generators, seeded: web, code and sft documents, or conversations."""
    sys.path.insert(0, str(TOOLS))
    import make_fixtures as fx

    r = random.Random(20240601)
    while True:
        if chat:
            yield {"messages": fx.chat_messages(r)}
        else:
            kind = r.randrange(4)
            yield {"text": fx.code_doc(r) if kind == 0 else fx.sft_doc(r) if kind == 1 else fx.web_doc(r)}


def build_corpus(folder: Path, megabytes: int, text: str, chat: bool) -> list[Path]:
    """JSON-lines files of about ``FILE_BYTES`` each, ``megabytes`` in all."""
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    if text == "installed" and not chat:
        def rows():
            while True:  # not enough text installed: go round again
                yield from ({"text": t} for t in iter_installed_texts())
        source = rows()
    else:
        source = iter_fixture_rows(chat)
    files, size, part = [], 0, None
    while size < megabytes << 20:
        if part is None or part.tell() > FILE_BYTES:
            if part:
                part.close()
            files.append(folder / f"part-{len(files):04d}.jsonl")
            part = open(files[-1], "w", encoding="utf-8")
        line = json.dumps(next(source)) + "\n"
        part.write(line)
        size += len(line.encode("utf-8"))
    part.close()
    return files


def texts_of(files: list[Path], limit_chars: int):
    chars = 0
    for f in files:
        with open(f, encoding="utf-8") as lines:
            for line in lines:
                row = json.loads(line)
                for text in [row["text"]] if "text" in row else [m["content"] for m in row["messages"]]:
                    yield text
                    chars += len(text)
                    if chars >= limit_chars:
                        return


def train_tokenizer(corpus: list[Path], out: Path) -> Path:
    """A GPT-2-style byte-level BPE (GPT-2's regex and alphabet, at most 50,257 entries) trained on the first
    8M characters of the corpus, with the ChatML tokens and template of the fixtures."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    sys.path.insert(0, str(TOOLS))
    from make_fixtures import CHAT_TOKENS, CHATML_TEMPLATE

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    tok.train_from_iterator(texts_of(corpus, 8 << 20), trainers.BpeTrainer(
        vocab_size=50257, special_tokens=["<|endoftext|>"], show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    tok.add_special_tokens(CHAT_TOKENS)
    out.mkdir(parents=True, exist_ok=True)
    tok.save(str(out / "tokenizer.json"))
    (out / "tokenizer_config.json").write_text(json.dumps({"eos_token": "<|endoftext|>",
                                                           "chat_template": CHATML_TEMPLATE}))
    return out / "tokenizer.json"


def _cpu_seconds() -> float:
    """User + system seconds of every finished child process (and theirs): steadier than wall time on a
    machine shared with other jobs."""
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def _env() -> dict:
    root = str(TOOLS.parent)
    return {**os.environ, "PYTHONPATH": root + os.pathsep + os.environ.get("PYTHONPATH", "")}


def run_bare(backend: str, files: list[Path], tokenizer: Path, work: Path,
             workers: int) -> tuple[int, float, float]:
    """Tokens, wall seconds and CPU seconds of the bare script."""
    out = work / f"bare-{backend}"
    script = work / "bare_encode.py"  # a file: spawned processes import their function from it
    script.write_text(BARE)
    env = {**_env(), "TOKENIZERS_PARALLELISM": "false", "RAYON_NUM_THREADS": "1"}  # one core per process
    t0, c0 = time.perf_counter(), _cpu_seconds()
    proc = subprocess.run([sys.executable, str(script), backend, str(tokenizer), str(out), str(workers),
                           *map(str, files)], capture_output=True, text=True, env=env)
    seconds, cpu = time.perf_counter() - t0, _cpu_seconds() - c0
    if proc.returncode:
        raise SystemExit(proc.stderr)
    for p in work.glob(f"bare-{backend}.*"):
        p.unlink()
    return int(proc.stdout.split()[-1]), seconds, cpu


def run_nanoset(files: list[Path], tokenizer: Path, out: Path, workers: int, backend: str,
                chat: bool) -> tuple[int, float, float, float]:
    """Tokens, wall seconds, CPU seconds and the peak RSS (MB) of the job's largest process."""
    shutil.rmtree(out, ignore_errors=True)
    cmd = [sys.executable, "-m", "nanoset.cli", "tokenize", *map(str, files), "-o", str(out),
           "--tokenizer", str(tokenizer), "--workers", str(workers), "--quiet", "--backend", backend]
    cmd += ["--chat"] if chat else []
    code = ("import resource, subprocess, sys; p = subprocess.run(sys.argv[1:]); "
            "print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss); sys.exit(p.returncode)")
    t0, c0 = time.perf_counter(), _cpu_seconds()
    proc = subprocess.run([sys.executable, "-c", code, *cmd], capture_output=True, text=True, env=_env())
    seconds, cpu = time.perf_counter() - t0, _cpu_seconds() - c0
    if proc.returncode:
        raise SystemExit(proc.stderr)
    peak_kb = int(proc.stdout.strip().splitlines()[-1])
    manifest = json.loads((out / "nanoset.json").read_text())
    return manifest["num_tokens"], seconds, cpu, peak_kb / 1024


def same_shards(a: Path, b: Path) -> bool:
    names = sorted(p.name for p in a.iterdir() if p.name != "nanoset.json")
    if names != sorted(p.name for p in b.iterdir() if p.name != "nanoset.json"):
        return False
    _, mismatch, errors = filecmp.cmpfiles(a, b, names, shallow=False)
    return not mismatch and not errors


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--mb", type=int, default=24, help="size of the generated corpus (without --corpus)")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--work", type=Path, default=Path("bench_work"))
    ap.add_argument("--corpus", nargs="+", type=Path, help="JSON-lines files or folders (default: generated)")
    ap.add_argument("--tokenizer", type=Path, help="a tokenizer.json (default: a GPT-2-style BPE trained here)")
    ap.add_argument("--text", choices=("fixture", "installed"), default="fixture",
                    help="what the generated corpus holds")
    ap.add_argument("--chat", action="store_true", help="conversations, tokenized with --chat")
    args = ap.parse_args()
    args.work.mkdir(parents=True, exist_ok=True)
    if args.corpus:
        corpus = sorted(p for c in args.corpus for p in ([c] if c.is_file() else c.rglob("*.jsonl")))
    else:
        corpus = build_corpus(args.work / "corpus", args.mb, args.text, args.chat)
    tokenizer = args.tokenizer or train_tokenizer(corpus, args.work / "tokenizer")
    size = sum(f.stat().st_size for f in corpus) / 2**20
    w = args.workers

    runs = {"nanoset auto": lambda: run_nanoset(corpus, tokenizer, args.work / "out-auto", w, "auto", args.chat)[:3],
            "nanoset --backend tokenizers": lambda: run_nanoset(corpus, tokenizer, args.work / "out-tokenizers", w,
                                                                "tokenizers", args.chat)[:3]}
    if not args.chat:
        runs = {"bare tokenizers": lambda: run_bare("tokenizers", corpus, tokenizer, args.work, w),
                "bare fastokens": lambda: run_bare("fastokens", corpus, tokenizer, args.work, w), **runs}
    best = {name: float("inf") for name in runs}
    best_cpu = dict(best)
    tokens = {}
    for _ in range(args.rounds):  # interleaved, best of each: the machine is noisy
        for name, run in runs.items():
            tokens[name], seconds, cpu = run()
            best[name], best_cpu[name] = min(best[name], seconds), min(best_cpu[name], cpu)
    identical = same_shards(args.work / "out-auto", args.work / "out-tokenizers")
    auto = json.loads((args.work / "out-auto" / "nanoset.json").read_text())
    print(f"corpus: {size:.0f} MB in {len(corpus)} files, {auto['num_documents']:,} documents, "
          f"{auto['num_tokens']:,} tokens; tokenizer {tokenizer} (vocab {auto['tokenizer']['vocab_size']:,}); "
          f"{os.cpu_count()} cores, {w} processes, best of {args.rounds} rounds")
    for name, seconds in best.items():
        print(f"  {name:30s} {seconds:6.2f}s  {size / seconds:6.1f} MB/s  {tokens[name] / seconds:12,.0f} tokens/s"
              f"  ({best_cpu[name]:.2f} CPU-s)")
    print(f"nanoset auto encoded with: {', '.join(auto.get('encoders', ['?']))}; shards byte-identical to "
          f"--backend tokenizers: {identical}")
    def ratio(base: str, name: str) -> str:  # speed of name over base's: wall time, and CPU time
        return f"{best[base] / best[name]:.2f}x ({best_cpu[base] / best_cpu[name]:.2f}x in CPU time)"

    if args.chat:
        print(f"ratio nanoset --chat auto / --backend tokenizers: "
              f"{ratio('nanoset --backend tokenizers', 'nanoset auto')}  (target >= 2)")
    else:
        if {tokens["bare tokenizers"], tokens["bare fastokens"]} != {auto["num_tokens"] - auto["num_documents"]}:
            raise SystemExit(f"token counts differ: {tokens} (nanoset adds {auto['num_documents']} EOS)")
        print(f"ratio nanoset auto / bare tokenizers: {ratio('bare tokenizers', 'nanoset auto')}  (target >= 3)")
        print(f"ratio nanoset auto / bare fastokens:  {ratio('bare fastokens', 'nanoset auto')}  (target >= 0.6)")
        print(f"ratio nanoset --backend tokenizers / bare tokenizers: "
              f"{ratio('bare tokenizers', 'nanoset --backend tokenizers')}")
        quarter = corpus[: max(1, len(corpus) // 4)]
        rss_quarter = run_nanoset(quarter, tokenizer, args.work / "out-quarter", w, "auto", False)[3]
        rss = run_nanoset(corpus, tokenizer, args.work / "out-auto", w, "auto", False)[3]
        print(f"peak RSS of the job's largest process: {rss_quarter:.0f} MB on {size / 4:.0f} MB of corpus, "
              f"{rss:.0f} MB on {size:.0f} MB")
    if not identical:
        raise SystemExit("nanoset auto and --backend tokenizers wrote different shards")


if __name__ == "__main__":
    main()
