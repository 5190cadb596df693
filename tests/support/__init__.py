"""What the tests share: the repository's paths and fixtures, the CLI as a user runs it, the corpus read
independently of nanoset. The rest of the package: ``harness`` (processes, torchrun), ``configs`` (the
one config builder), ``data`` (global batches through the loaders), the workers of multi-process tests."""

from __future__ import annotations

import gzip
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent.parent
FIXTURES = ROOT / "data_fixtures"
CORPUS = FIXTURES / "corpus"
TOKENIZER = FIXTURES / "tokenizer"


def run_cli(*args: str | Path, check: bool = True, cwd: Path | None = None, env: dict | None = None):
    """Run ``nanoset ARGS`` as a user would (a subprocess); returns the CompletedProcess."""
    proc = subprocess.run([sys.executable, "-m", "nanoset.cli", *map(str, args)], capture_output=True, text=True,
                          cwd=cwd, env={**os.environ, **(env or {})})
    if check and proc.returncode != 0:
        raise AssertionError(f"nanoset {args} failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}")
    return proc


@contextmanager
def unwritable(folder: Path) -> Iterator[Path]:
    """``folder`` (made if missing), where nothing can be created while the block runs, for root too: immutable
    (``chattr +i``) under root, who passes every permission check; read-only (mode 0o555) otherwise."""
    import pytest

    folder.mkdir(parents=True, exist_ok=True)
    if os.geteuid() != 0:
        folder.chmod(0o555)
        try:
            yield folder
        finally:
            folder.chmod(0o755)
        return
    if subprocess.run(["chattr", "+i", str(folder)], capture_output=True).returncode != 0:
        pytest.skip(f"root, and no immutable folders on this filesystem ({folder}): nowhere root cannot write")
    try:
        yield folder
    finally:
        subprocess.run(["chattr", "-i", str(folder)], check=True)


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

CONFIGS = FIXTURES / "configs"


def assert_one_cache_note(stderr: str, root: Path, kind: str, name: str, reason: str = "Not a directory") -> None:
    """``stderr`` is exactly the one note of a cache (``nanoset.cache``) that could not write an entry of ``kind``
    under ``root``; ``name``: a regular expression of the entry's file name."""
    import re

    file = re.escape(str(root / kind)) + "/" + name
    note = (rf"note: cannot write the cache file {file} \({re.escape(reason)}\): what the cache {re.escape(str(root))}"
            rf" holds is computed again at every start until it can be written; make it writable, or set "
            rf"general\.cache_dir \(or \$NANOSET_CACHE_DIR\) to a writable folder\n")
    assert re.fullmatch(note, stderr), stderr
