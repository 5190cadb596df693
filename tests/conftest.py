"""Shared fixtures: the committed corpus and tokenizer, a CLI runner, reference encodings."""

from __future__ import annotations

import gzip
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = ROOT / "data_fixtures"
CORPUS = FIXTURES / "corpus"
TOKENIZER = FIXTURES / "tokenizer"
sys.path.insert(0, str(ROOT / "tools"))


def run_cli(*args: str | Path, check: bool = True, cwd: Path | None = None, env: dict | None = None):
    """Run ``nanoset ARGS`` as a user would (a subprocess); returns the CompletedProcess."""
    proc = subprocess.run([sys.executable, "-m", "nanoset.cli", *map(str, args)], capture_output=True, text=True,
                          cwd=cwd, env={**os.environ, **(env or {})})
    if check and proc.returncode != 0:
        raise AssertionError(f"nanoset {args} failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}")
    return proc


def one_line_error(proc, *fragments: str) -> str:
    """Assert ``proc`` failed as a user mistake should: exit 1, one ``error:`` line holding every fragment."""
    assert proc.returncode == 1, proc.stdout + proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), proc.stderr
    for f in fragments:
        assert f in lines[0], lines[0]
    return lines[0]


def read_texts_in_corpus_order() -> list[str]:
    """The fixture corpus read independently of nanoset.tokenize.rows, in the documented order."""
    import pyarrow.parquet as pq
    import zstandard

    texts = [p.read_text() for p in sorted((CORPUS / "code" / "files").glob("*.txt"))]
    raw = zstandard.ZstdDecompressor().stream_reader(open(CORPUS / "code" / "snippets-000.jsonl.zst", "rb")).read()
    texts += [json.loads(line)["text"] for line in raw.decode().splitlines()]
    texts += [row["text"] for row in json.loads((CORPUS / "sft" / "sft-000.json").read_text())]
    texts += pq.read_table(CORPUS / "sft" / "sft-001.parquet").column("text").to_pylist()
    texts += [json.loads(line)["text"] for line in (CORPUS / "web" / "web-000.jsonl").read_text().splitlines()]
    with gzip.open(CORPUS / "web" / "web-001.jsonl.gz", "rt") as f:
        texts += [json.loads(line)["text"] for line in f]
    texts += pq.read_table(CORPUS / "web" / "web-002.parquet").column("text").to_pylist()
    return texts


@pytest.fixture(autouse=True, scope="session")
def _nanoset_cache_dir(tmp_path_factory):
    """Largest-token-id scan records (nanoset.format.maxid) go to a temporary cache, never the user's."""
    os.environ["NANOSET_CACHE_DIR"] = str(tmp_path_factory.mktemp("nanoset-cache"))


@pytest.fixture(scope="session")
def tokenizer():
    from tokenizers import Tokenizer

    return Tokenizer.from_file(str(TOKENIZER / "tokenizer.json"))


@pytest.fixture(scope="session")
def eos_id(tokenizer) -> int:
    return tokenizer.token_to_id("<|endoftext|>")


@pytest.fixture(scope="session")
def reference_docs(tokenizer, eos_id) -> list[np.ndarray]:
    """Direct ``Tokenizer.encode`` of every fixture document, plus EOS, in corpus order."""
    return [np.array(tokenizer.encode(t).ids + [eos_id]) for t in read_texts_in_corpus_order()]


@pytest.fixture(scope="session")
def fixture_dataset(tmp_path_factory) -> Path:
    """The whole fixture corpus tokenized once (several tasks, several shards)."""
    out = tmp_path_factory.mktemp("ds") / "all"
    run_cli("tokenize", CORPUS, "-o", out, "--tokenizer", TOKENIZER, "--task-bytes", 200_000, "--quiet")
    return out


CONFIGS = FIXTURES / "configs"


@pytest.fixture(scope="session")
def shards(tmp_path_factory) -> Path:
    """A folder holding shards/web, shards/code and shards/sft from the fixture corpora (cwd for configs)."""
    from nanoset.tokenize.job import TokenizeOptions, tokenize

    root = tmp_path_factory.mktemp("work")
    for name in ("web", "code", "sft"):
        tokenize(TokenizeOptions(inputs=[str(CORPUS / name)], output=root / "shards" / name, tokenizer=str(TOKENIZER),
                                 task_bytes=100_000, progress=False))
    return root
