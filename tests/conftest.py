"""Shared fixtures: the committed corpus and tokenizer, reference encodings, tokenized shards."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import numpy as np
import pytest

from tests.support import CORPUS, TOKENIZER, read_texts_in_corpus_order, run_cli

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tools"))  # tools/make_fixtures.py


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



@pytest.fixture(scope="session")
def shards(tmp_path_factory) -> Path:
    """A folder holding shards/web, shards/code and shards/sft from the fixture corpora (cwd for configs)."""
    from nanoset.tokenize.job import TokenizeOptions, tokenize

    root = tmp_path_factory.mktemp("work")
    for name in ("web", "code", "sft"):
        tokenize(TokenizeOptions(inputs=[str(CORPUS / name)], output=root / "shards" / name, tokenizer=str(TOKENIZER),
                                 task_bytes=100_000, progress=False))
    return root
