"""Megatron-LM indexed datasets (PREFIX.bin + PREFIX.idx) read in place: token for token as megatron-core
writes them, folders of pairs, inspect and verify, broken inputs in one line."""

from __future__ import annotations

import json
import pickle
import struct

import numpy as np
import pytest

from nanoset import NanosetError, open_dataset
from nanoset.format.mapcache import set_max_open_shards, shared_cache
from tests.support import run_cli
from tests.support.datasets import write_datatrove
from tests.support.megatron_data import (
    DOCS,
    ENDS,
    STREAM,
    build_with_megatron,
    cache_dir,  # noqa: F401 (an autouse fixture: scan records per test)
    read,
    write_mmidx,
)

# ---------------------------------------------------------------- the real writer, token for token ------

@pytest.mark.parametrize("dtype", ["uint16", "int32", "uint8", "int64"])
def test_megatron_core_builder_data_is_read_token_for_token(tmp_path, dtype):
    prefix = build_with_megatron(tmp_path / "mg" / "corpus_text_document", DOCS, dtype)
    mine = write_mmidx(tmp_path / "hand" / "corpus_text_document", DOCS, dtype)
    assert read(mine, ".idx") == read(prefix, ".idx") and read(mine, ".bin") == read(prefix, ".bin")
    ds = open_dataset(prefix)
    assert (ds.format, ds.dtype.name, ds.tokenizer, ds.manifest) == ("megatron", dtype, None, None)
    assert (ds.num_tokens, ds.num_documents, ds.max_token_id) == (15, 5, 103)
    assert ds.tokens(0, ds.num_tokens).tolist() == STREAM
    assert ds.document_ends.tolist() == ENDS
    assert [ds.document(i).tolist() for i in range(5)] == [[5, 6, 7], [8, 9, 10, 11, 12], [13], [14, 15],
                                                           [100, 101, 102, 103]]
    assert isinstance(ds.shards[0].tokens, np.ndarray) and ds.shards[0].tokens.base is not None  # a map, no copy
    again = pickle.loads(pickle.dumps(ds))  # as a loader worker gets it: maps reopen there
    assert again.tokens(2, 9).tolist() == STREAM[2:9] and again.document_ends.tolist() == ENDS


def test_a_folder_of_pairs_is_one_stream_in_name_order(tmp_path):
    folder = tmp_path / "mg"
    write_mmidx(folder / "b", [[[1, 2]], [[3]]], "int32")
    write_mmidx(folder / "a", DOCS, "int32")
    ds = open_dataset(folder)
    assert [s.name for s in ds.shards] == ["a", "b"]
    assert ds.tokens(0, ds.num_tokens).tolist() == STREAM + [1, 2, 3]
    assert ds.document_ends.tolist() == ENDS + [17, 18]
    assert ds.tokens(13, 17).tolist() == [102, 103, 1, 2]  # across the two pairs
    write_mmidx(folder / "c", [[[4]]], "uint16")
    with pytest.raises(NanosetError, match=rf"^{folder}: Megatron files mix token dtypes \['int32', 'uint16'\]; "
                                           "one dataset needs one dtype$"):
        open_dataset(folder)


def test_many_pairs_are_read_under_the_open_maps_bound(tmp_path):
    folder = tmp_path / "mg"
    for k in range(6):
        write_mmidx(folder / f"part{k}", [[[k, 10 + k]], [[20 + k]]], "uint16")
    before = shared_cache().capacity
    set_max_open_shards(2)
    try:
        ds = open_dataset(folder)
        assert ds.tokens(0, ds.num_tokens).tolist() == [t for k in range(6) for t in (k, 10 + k, 20 + k)]
        assert [int(ds.document_bounds(i)[1]) for i in range(12)] == [2, 3, 5, 6, 8, 9, 11, 12, 14, 15, 17, 18]
        assert len(shared_cache()) <= 4
    finally:
        shared_cache().resize(before)


def test_document_ends_are_cached_and_rebuilt(tmp_path, cache_dir):  # noqa: F811 (the fixture imported above)
    prefix = write_mmidx(tmp_path / "d", DOCS)
    open_dataset(prefix)
    (record,) = (cache_dir / "megatron-ends").glob("*.ends")
    assert np.fromfile(record, dtype="<u8").tolist() == ENDS
    ds = open_dataset(prefix)
    record.unlink()  # a cleaned cache while the data is in use
    assert ds.document_ends.tolist() == ENDS
    write_mmidx(prefix, [[[1, 2, 3]], [[4]]])  # new data: a new record, never the old one
    assert open_dataset(prefix).document_ends.tolist() == [3, 4]


def test_an_unwritable_cache_is_one_line(tmp_path, monkeypatch):
    prefix = write_mmidx(tmp_path / "d", DOCS)
    (tmp_path / "file").write_text("")
    monkeypatch.setenv("NANOSET_CACHE_DIR", str(tmp_path / "file"))
    with pytest.raises(NanosetError) as e:
        open_dataset(prefix)
    assert str(e.value) == (f"{tmp_path}/file/megatron-ends: {tmp_path}/file is a file, not a folder; set "
                            f"NANOSET_CACHE_DIR to a writable folder (the cache keeps the document index of "
                            f"{prefix}.idx)")


# ---------------------------------------------------------------- inspect and verify ------

def test_inspect_and_verify_a_megatron_prefix(tmp_path):
    prefix = build_with_megatron(tmp_path / "corpus", DOCS, "int32")
    out = run_cli("inspect", prefix, "--samples", 1).stdout.splitlines()
    assert out[:3] == [
        f"{prefix}  (megatron)", "  shards 1   documents 5   tokens 15",
        "  dtype int32   tokenizer unknown   vocab unknown (Megatron data; largest id 103)   eos unknown"]
    assert "  ids [5, 6, 7] (tokenizer unknown: pass --tokenizer to decode)" in out
    stats = json.loads(run_cli("inspect", prefix, "--json", "--samples", 0).stdout)
    assert (stats["format"], stats["dtype"], stats["max_token_id"]) == ("megatron", "int32", 103)
    assert run_cli("verify", prefix).stdout == (
        f"OK: {prefix}: 1 shards, 5 documents, 15 tokens, largest id 103 verified (sizes and offsets; Megatron "
        f"data: no checksums, and its documents need not end with EOS)\n")


def test_verify_walks_every_pointer_and_token(tmp_path):
    prefix = write_mmidx(tmp_path / "d", DOCS, "int32")
    idx = tmp_path / "d.idx"
    raw = bytearray(idx.read_bytes())
    pointer_of_seq_2 = 34 + 4 * 7 + 8 * 2
    raw[pointer_of_seq_2 : pointer_of_seq_2 + 8] = struct.pack("<q", 24)
    idx.write_bytes(bytes(raw))
    proc = run_cli("verify", prefix, check=False)
    assert proc.returncode == 1 and proc.stderr == (
        f"error: {idx}: sequence 2 starts at byte 24, expected 20 (sequences must follow each other); "
        f"the index is corrupt\n")
    write_mmidx(prefix, [[[5, -3]]], "int32")
    proc = run_cli("verify", prefix, check=False)
    assert proc.stderr == f"error: {tmp_path}/d.bin: negative token id -3 at position 1; token ids must be ≥ 0\n"


@pytest.mark.parametrize("damage, message", [
    ("no-idx", "{p}.idx: missing; a Megatron dataset needs both d.bin and d.idx"),
    ("no-bin", "{p}.bin: missing; a Megatron dataset needs both d.bin and d.idx"),
    ("magic", "{p}.idx: not a Megatron index (no MMIDIDX magic at the start)"),
    ("version", "{p}.idx: MMIDIDX version 2 is not supported (only version 1)"),
    ("code", "{p}.idx: unknown MMIDIDX dtype code 9 (known: 1-8)"),
    ("float", "{p}.idx: dtype float32 (code 7) holds floats, not token ids; only integer Megatron data can be read"),
    ("short-idx", "{p}.idx: 169 bytes, but its header (7 sequences, 7 document indices) implies 174; "
                  "the file is truncated or corrupt"),
    ("modes", "{p}.idx: has per-sequence modes (a multimodal Megatron dataset); only token data can be read"),
    ("short-bin", "{p}.bin: 28 bytes, but d.idx needs 30; the file is truncated"),
    ("long-bin", "{p}.bin: 32 bytes, but d.idx needs 30; the file is longer than its index says"),
    ("suffix", "{p}.bin: name the Megatron dataset by its prefix, without .bin ({p})"),
])
def test_bad_megatron_input_is_one_line_everywhere(tmp_path, damage, message):
    p = tmp_path / "d"
    write_mmidx(p, DOCS, code={"code": 9, "float": 7}.get(damage), version=2 if damage == "version" else 1,
                modes=damage == "modes")
    idx, data = tmp_path / "d.idx", tmp_path / "d.bin"
    if damage == "no-idx":
        idx.unlink()
    elif damage == "no-bin":
        data.unlink()
    elif damage == "magic":
        idx.write_bytes(b"TNTIDX\x00\x00" + idx.read_bytes()[8:])
    elif damage == "short-idx":
        idx.write_bytes(idx.read_bytes()[:-5])
    elif damage in ("short-bin", "long-bin"):
        data.write_bytes(data.read_bytes()[:-2] if damage == "short-bin" else data.read_bytes() + b"\x00\x00")
    target = data if damage == "suffix" else p
    expected = message.format(p=p)
    with pytest.raises(NanosetError) as e:
        open_dataset(target)
    assert str(e.value) == expected
    for command in (("inspect", target), ("verify", target), ("convert", target, "-o", tmp_path / "out")):
        proc = run_cli(*command, check=False)
        assert (proc.returncode, proc.stderr) == (1, f"error: {expected}\n"), command
    assert not (tmp_path / "out").exists()


def test_a_folder_of_datatrove_shards_and_megatron_pairs_is_refused(tmp_path):
    """Was read as the datatrove shards alone: the pairs' tokens silently left out of training and convert."""
    folder = tmp_path / "mixed"
    write_datatrove(folder, [[[1, 2, 3], [4, 5]]])
    write_mmidx(folder / "meg", DOCS)
    (folder / "notes.bin").write_bytes(b"x")  # a lone .bin is no pair: it alone would not be refused
    expected = (f"{folder}: holds both .ds shards and Megatron pairs (meg); one folder is one dataset: move the "
                f"pairs to a folder of their own")
    with pytest.raises(NanosetError) as e:
        open_dataset(folder)
    assert str(e.value) == expected
    proc = run_cli("convert", folder, "-o", tmp_path / "out", check=False)
    assert (proc.returncode, proc.stderr) == (1, f"error: {expected}\n") and not (tmp_path / "out").exists()
    (folder / "meg.idx").unlink()
    (folder / "meg.bin").unlink()
    assert open_dataset(folder).num_tokens == 5


def test_a_negative_last_pointer_is_a_corrupt_index(tmp_path):
    p = write_mmidx(tmp_path / "d", DOCS)
    idx = tmp_path / "d.idx"
    raw = bytearray(idx.read_bytes())
    n = struct.unpack("<Q", raw[18:26])[0]
    at = 34 + 4 * n + 8 * (n - 1)
    raw[at : at + 8] = struct.pack("<q", -(2**40))
    idx.write_bytes(bytes(raw))
    last = struct.unpack("<i", raw[34 + 4 * (n - 1) : 34 + 4 * n])[0]
    with pytest.raises(NanosetError) as e:
        open_dataset(p)
    assert str(e.value) == f"{idx}: its last sequence ends at byte {-(2**40) + 2 * last}; the index is corrupt"
