"""Megatron-LM indexed data for the tests: a hand-written MMIDIDX writer (byte-identical to megatron-core's,
and able to write broken inputs), megatron-core's own builder, and the documents both write."""

from __future__ import annotations

import struct
import warnings

import numpy as np
import pytest

CODES = {"uint8": 1, "int8": 2, "int16": 3, "int32": 4, "int64": 5, "float64": 6, "float32": 7, "uint16": 8}
# documents as lists of sequences; the fourth is empty, the fifth has an empty sequence
DOCS = [[[5, 6, 7]], [[8, 9], [10, 11, 12]], [[13]], [], [[14, 15], []], [[100, 101, 102, 103]]]
STREAM = [5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 100, 101, 102, 103]
ENDS = [3, 8, 9, 11, 15]  # the empty document adds nothing to the stream and is dropped


@pytest.fixture(autouse=True)
def cache_dir(tmp_path, monkeypatch):
    """Document-end and scan records go to a per-test cache."""
    monkeypatch.setenv("NANOSET_CACHE_DIR", str(tmp_path / "cache"))
    return tmp_path / "cache"


def write_mmidx(prefix, docs, dtype="uint16", version=1, code=None, modes=False):
    """PREFIX.bin and PREFIX.idx exactly as megatron-core's IndexedDatasetBuilder writes them."""
    seqs = [np.asarray(s, dtype=dtype) for doc in docs for s in doc]
    bounds = np.cumsum([0] + [len(doc) for doc in docs])
    lengths = np.array([len(s) for s in seqs], dtype="<i4")
    pointers = np.concatenate([[0], np.cumsum(lengths[:-1], dtype=np.int64)]) * np.dtype(dtype).itemsize
    prefix.parent.mkdir(parents=True, exist_ok=True)
    (prefix.parent / (prefix.name + ".bin")).write_bytes(b"".join(s.tobytes() for s in seqs))
    head = b"MMIDIDX\x00\x00" + struct.pack("<QBQQ", version, code or CODES[dtype], len(seqs), len(bounds))
    body = lengths.tobytes() + pointers.astype("<i8").tobytes() + bounds.astype("<i8").tobytes()
    (prefix.parent / (prefix.name + ".idx")).write_bytes(head + body + (bytes(len(seqs)) if modes else b""))
    return prefix


def megatron_builder():
    with warnings.catch_warnings():  # megatron.core warns that Transformer Engine and Apex are not installed
        warnings.simplefilter("ignore")
        indexed = pytest.importorskip("megatron.core.datasets.indexed_dataset",
                                      reason="megatron-core (the test extra) is not installed")
    return indexed.IndexedDatasetBuilder


def build_with_megatron(prefix, docs, dtype):
    """The same documents through megatron-core: add_document for one-sequence documents, else add_item
    per sequence and end_document (the sentence-split layout of preprocess_data.py)."""
    import torch

    prefix.parent.mkdir(parents=True, exist_ok=True)
    builder = megatron_builder()(str(prefix) + ".bin", dtype=getattr(np, dtype))
    for doc in docs:
        if len(doc) == 1:
            builder.add_document(np.asarray(doc[0]), [len(doc[0])])  # a tensor here warns in numpy.array
        else:
            for seq in doc:
                builder.add_item(torch.tensor(seq, dtype=torch.int64))
            builder.end_document()
    builder.finalize(str(prefix) + ".idx")
    return prefix


def read(path, name):
    return (path.parent / (path.name + name)).read_bytes()
