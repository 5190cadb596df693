"""Tokenize hardening on the input side: tokenizer settings, bad Unicode, line numbers, long lines, discovery."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
from conftest import CORPUS, TOKENIZER, run_cli

from nanoset import open_dataset
from nanoset import corpus as corpus_mod
from nanoset.corpus import Piece, Source, TextReader, discover


def all_docs(folder: Path) -> list[list[int]]:
    ds = open_dataset(folder)
    return [ds.document(i).tolist() for i in range(ds.num_documents)]


def one_line_error(proc, *fragments: str) -> str:
    assert proc.returncode == 1, proc.stdout + proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), proc.stderr
    for f in fragments:
        assert f in lines[0], lines[0]
    return lines[0]


# ---------------------------------------------------------------- item 1: tokenizer settings ---------------


@pytest.mark.parametrize("setting", ["truncation", "padding"])
def test_tokenizer_truncation_and_padding_are_ignored(tmp_path, tokenizer, eos_id, setting):
    """A tokenizer.json with truncation (max_length 16) or padding still encodes whole documents, no pad ids."""
    from tokenizers import Tokenizer

    texts = [json.loads(line)["text"] for line in (CORPUS / "web" / "web-000.jsonl").read_text().splitlines()[:12]]
    texts.append("short")  # padding to the batch's longest would fill this one
    corpus = tmp_path / "c.jsonl"
    corpus.write_text("".join(json.dumps({"text": t}) + "\n" for t in texts))
    tok_dir = tmp_path / f"tok-{setting}"
    tok_dir.mkdir()
    shutil.copy(TOKENIZER / "tokenizer_config.json", tok_dir)
    tok = Tokenizer.from_file(str(TOKENIZER / "tokenizer.json"))
    if setting == "truncation":
        tok.enable_truncation(max_length=16)
    else:
        tok.enable_padding(pad_id=0, pad_token="<pad>", length=512)
    tok.save(str(tok_dir / "tokenizer.json"))
    assert json.loads((tok_dir / "tokenizer.json").read_text())[setting] is not None

    run_cli("tokenize", corpus, "-o", tmp_path / "out", "--tokenizer", tok_dir, "--quiet")
    expected = [tokenizer.encode(t).ids + [eos_id] for t in texts]
    assert max(map(len, expected)) > 100 and len(expected[-1]) < 16
    assert all_docs(tmp_path / "out") == expected

    from nanoset.tokenizer import load_tokenizer  # inspect's decoder and the runtime's HF cache load it this way

    loaded = load_tokenizer(tok_dir / "tokenizer.json")
    assert loaded.truncation is None and loaded.padding is None
