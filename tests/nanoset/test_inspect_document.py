"""``nanoset inspect FOLDER --document N``: one whole document, verbatim, with its loss mask for chat data."""

from __future__ import annotations

import gzip
import json

import numpy as np
import pyarrow.parquet as pq
import pytest

from nanoset import open_dataset
from tests.support import CORPUS, TOKENIZER, run_cli

CHAT = CORPUS.parent / "chat"


def web_texts() -> list[str]:
    """The web corpus's documents in corpus order (its files sorted by name)."""
    texts = [json.loads(line)["text"] for line in (CORPUS / "web" / "web-000.jsonl").read_text().splitlines()]
    with gzip.open(CORPUS / "web" / "web-001.jsonl.gz", "rt") as f:
        texts += [json.loads(line)["text"] for line in f]
    return texts + pq.read_table(CORPUS / "web" / "web-002.parquet").column("text").to_pylist()


@pytest.fixture(scope="module")
def chat(tmp_path_factory):
    out = tmp_path_factory.mktemp("chat") / "chat"
    run_cli("tokenize", CHAT, "-o", out, "--tokenizer", TOKENIZER, "--chat", "--quiet")
    return out


@pytest.mark.parametrize("n", [0, 1234, 3499])  # in the first, second and third input file
def test_document_n_is_the_nth_input_document(shards, n):
    texts = web_texts()
    folder = shards / "shards" / "web"
    doc = json.loads(run_cli("inspect", folder, "--document", n, "--json").stdout)
    assert doc["text"] == texts[n] and doc["ends_with_eos"] and "loss_mask" not in doc
    assert doc["ids"] == np.asarray(open_dataset(folder).document(n)).tolist()
    out = run_cli("inspect", folder, "--document", n).stdout
    assert out == f"--- {folder} document {n:,} ({len(doc['ids'])} tokens + EOS) ---\n{texts[n]}\n"


def test_chat_document_with_its_loss_mask(chat):
    row = json.loads((CHAT / "chat-000.jsonl").read_text().splitlines()[3])
    ds = open_dataset(chat)
    doc = json.loads(run_cli("inspect", chat, "--document", 3, "--json").stdout)
    assert doc["loss_mask"] == np.asarray(ds.loss_mask(*ds.document_bounds(3)), dtype=np.int64).tolist()
    assert doc["loss_tokens"] == sum(doc["loss_mask"]) > 0
    for m in row["messages"]:  # every message verbatim in the text; the answers, and only they, marked trained
        assert m["content"] in doc["text"]
        assert (f"[[{m['content']}" in doc["marked"]) == (m["role"] == "assistant")
    out = run_cli("inspect", chat, "--document", 3).stdout
    header, _, rest = out.partition("\n")
    assert header == f"--- {chat} document 3 ({len(doc['ids'])} tokens + EOS, {doc['loss_tokens']} with loss) ---"
    assert rest == (f"{doc['text']}\n--- loss mask: the {doc['loss_tokens']} tokens trained on in [[...]] (EOS "
                    f"included) ---\n{doc['marked']}\n")


def test_document_out_of_range_is_one_line(shards):
    folder = shards / "shards" / "web"
    proc = run_cli("inspect", folder, "--document", 3500, check=False)
    assert (proc.returncode, proc.stderr) == (1, f"error: --document 3500: {folder} has documents 0-3499\n")
