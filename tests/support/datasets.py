"""Datasets and corpora the tests write by hand: datatrove shards, a large generated corpus, and the
byte-for-byte comparison of two output folders."""

from __future__ import annotations

import filecmp
import json
from pathlib import Path

import numpy as np


def write_datatrove(folder, docs_per_shard, tokenizer_name="toy"):
    """Shards as datatrove writes them: three files each, no manifest."""
    folder.mkdir(parents=True, exist_ok=True)
    for k, docs in enumerate(docs_per_shard):
        tokens = np.concatenate([np.asarray(d, dtype="<u2") for d in docs])
        (folder / f"{k:03d}.ds").write_bytes(tokens.tobytes())
        (folder / f"{k:03d}.ds.index").write_bytes(np.cumsum([len(d) for d in docs]).astype("<u8").tobytes())
        (folder / f"{k:03d}.ds.metadata").write_text(f"{tokenizer_name}|2\n{len(tokens)}\n{len(tokens)}")


def big_corpus(folder: Path, files: int = 24, docs: int = 700, seed: int = 7) -> Path:
    """``files`` JSON lines files of ``docs`` generated web documents each."""
    import random

    from make_fixtures import web_doc

    folder.mkdir()
    r = random.Random(seed)
    for i in range(files):
        with open(folder / f"part-{i:03d}.jsonl", "w") as f:
            for _ in range(docs):
                f.write(json.dumps({"text": web_doc(r)}) + "\n")
    return folder


def same_folder(a: Path, b: Path) -> bool:
    names_a, names_b = sorted(p.name for p in a.iterdir()), sorted(p.name for p in b.iterdir())
    assert names_a == names_b, (names_a, names_b)
    match, mismatch, errors = filecmp.cmpfiles(a, b, names_a, shallow=False)
    assert not mismatch and not errors, (mismatch, errors)
    return True
