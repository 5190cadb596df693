"""Megatron-LM indexed datasets (PREFIX.bin + PREFIX.idx) read in place, and `nanoset convert`.

Data is written by megatron-core's own IndexedDatasetBuilder (the test extra) and by a small
hand-written MMIDIDX writer, checked byte-identical to it, that also makes the broken inputs.
"""

from __future__ import annotations

import json
import pickle
import struct
import warnings

import numpy as np
import pytest
import yaml
from conftest import TOKENIZER, run_cli
from datahelpers import make_config
from test_reader_foreign import write_datatrove
from trainhelpers import metrics, small_config, train_one

from nanoset import NanosetError, open_dataset
from nanoset.mapcache import set_max_open_shards, shared_cache
from runtime.data.plan import DataPlan
from runtime.data.windows import TokenWindows

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
    before = shared_cache().capacity // 2
    set_max_open_shards(2)
    try:
        ds = open_dataset(folder)
        assert ds.tokens(0, ds.num_tokens).tolist() == [t for k in range(6) for t in (k, 10 + k, 20 + k)]
        assert [int(ds.document_bounds(i)[1]) for i in range(12)] == [2, 3, 5, 6, 8, 9, 11, 12, 14, 15, 17, 18]
        assert len(shared_cache()) <= 4
    finally:
        set_max_open_shards(before)


def test_document_ends_are_cached_and_rebuilt(tmp_path, cache_dir):
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
    with pytest.raises(NanosetError, match=rf"^{prefix}.idx: cannot write its document index to the cache "
                                           rf"{tmp_path}/file/megatron-ends \(.*\); set NANOSET_CACHE_DIR to a "
                                           r"writable folder$"):
        open_dataset(prefix)


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


# ---------------------------------------------------------------- nanoset convert ------

def test_convert_megatron_to_nanoset_then_verify(tmp_path):
    prefix = build_with_megatron(tmp_path / "mg" / "corpus", DOCS, "int32")
    out = tmp_path / "converted"
    assert run_cli("convert", prefix, "-o", out).stdout == (
        f"converted {prefix} (megatron) to {out}: 1 shards, 5 documents, 15 tokens as uint16, tokenizer unknown\n")
    assert run_cli("verify", out).stdout == (f"OK: {out}: 1 shards, 5 documents, 15 tokens, largest id 103 verified "
                                             f"(checksums, index and token ids; no EOS check: the tokenizer is unknown)\n")
    ds = open_dataset(out)
    assert (ds.format, ds.dtype.name, ds.tokens(0, 15).tolist(), ds.document_ends.tolist()) == \
        ("nanoset", "uint16", STREAM, ENDS)
    manifest = json.loads((out / "nanoset.json").read_text())
    assert manifest["build"] == {"converted_from": "megatron", "source": str(prefix), "documents_end_with_eos": None}
    assert (manifest["tokenizer"]["name"], manifest["tokenizer"]["vocab_size"], manifest["max_token_id"]) == \
        ("unknown", None, 103)
    assert (out / "corpus.ds.metadata").read_text() == "unknown|2\n15\n15"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cache", "converted", "mg"]  # no temporary left


def test_convert_with_the_tokenizer_records_it_and_the_eos_state(tmp_path, eos_id):
    prefix = write_mmidx(tmp_path / "d", [[[5, 6, eos_id]], [[7, eos_id]]], "int32")
    out = tmp_path / "a"
    assert run_cli("convert", prefix, "-o", out, "--tokenizer", TOKENIZER).stdout.endswith("tokenizer tokenizer\n")
    manifest = json.loads((out / "nanoset.json").read_text())
    assert manifest["build"]["documents_end_with_eos"] is True and manifest["tokenizer"]["eos_id"] == eos_id
    assert manifest["tokenizer"]["sha256"] and manifest["dtype"] == "uint16"
    assert run_cli("verify", out).stdout.endswith("verified (checksums, index, token ids and EOS)\n")
    # Megatron data need not end its documents with EOS: recorded, and verify does not ask for it
    write_mmidx(prefix, DOCS, "int32")
    line = run_cli("convert", prefix, "-o", out, "--tokenizer", TOKENIZER, "--overwrite").stdout
    assert line.endswith(f"tokenizer tokenizer; not every document ends with EOS {eos_id} (recorded)\n")
    assert json.loads((out / "nanoset.json").read_text())["build"]["documents_end_with_eos"] is False
    assert run_cli("verify", out).stdout.endswith(
        "verified (checksums, index and token ids; converted data whose documents need not end with EOS)\n")


def test_convert_a_datatrove_folder_keeps_its_tokenizer_name_and_picks_the_dtype(tmp_path):
    src = tmp_path / "dt"
    write_datatrove(src, [[[5, 6, 0], [4464, 0]], [[9, 0]]], tokenizer_name="gpt2")
    out = tmp_path / "out"
    assert run_cli("convert", src, "-o", out).stdout == (
        f"converted {src} (datatrove) to {out}: 2 shards, 3 documents, 7 tokens as uint16, tokenizer gpt2\n")
    ds = open_dataset(out)
    assert ds.tokens(0, 7).tolist() == [5, 6, 0, 4464, 0, 9, 0] and ds.document_ends.tolist() == [3, 5, 7]
    big = write_mmidx(tmp_path / "big", [[[1, 70000]], [[2]]], "int32")  # an id past uint16: uint32 tokens
    run_cli("convert", big, "-o", tmp_path / "big-out")
    assert open_dataset(tmp_path / "big-out").dtype.name == "uint32"


def test_convert_refuses_bad_requests_in_one_line(tmp_path, fixture_dataset):
    prefix = write_mmidx(tmp_path / "d", DOCS, "int32")
    (tmp_path / "taken").mkdir()
    (tmp_path / "taken" / "x").write_text("")
    neg = write_mmidx(tmp_path / "neg", [[[5, -3]]], "int32")
    cases = [
        (("convert", prefix, "-o", tmp_path / "taken"),
         f"{tmp_path}/taken: exists; pass --overwrite to replace it, or choose another output folder"),
        (("convert", fixture_dataset, "-o", tmp_path / "o"),
         f"{fixture_dataset}: already a Nanoset dataset (it has nanoset.json); nothing to convert"),
        (("convert", neg, "-o", tmp_path / "o"),
         f"{tmp_path}/neg.bin: negative token id -3 at position 1; token ids must be ≥ 0"),
        (("convert", prefix, "-o", tmp_path, "--overwrite"),
         f"{tmp_path}: holds the data being converted ({prefix}); choose another output folder"),
        (("convert", prefix, "-o", tmp_path / "o", "--eos-token", "<|endoftext|>"),
         "--eos-token needs --tokenizer (the tokenizer that made the data)"),
    ]
    big = write_mmidx(tmp_path / "big", [[[1, 70000]]], "int32")
    cases.append((("convert", big, "-o", tmp_path / "o", "--tokenizer", TOKENIZER),
                  f"{big}: holds token id 70000, ≥ the vocab size {open_vocab()} of tokenizer {str(TOKENIZER)!r}; "
                  f"pass the tokenizer the data was made with"))
    (tmp_path / "file").write_text("")  # an output under a file: was a bare "[Errno 17] File exists" line
    cases.append((("convert", prefix, "-o", tmp_path / "file" / "o"),
                  f"{tmp_path}/file/o: cannot create the output folder there (File exists); choose another output "
                  f"folder"))
    for args, message in cases:
        proc = run_cli(*args, check=False)
        assert (proc.returncode, proc.stderr) == (1, f"error: {message}\n"), args
    assert not (tmp_path / "o").exists() and [p.name for p in (tmp_path / "taken").iterdir()] == ["x"]
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]


def open_vocab() -> int:
    from tokenizers import Tokenizer

    return Tokenizer.from_file(str(TOKENIZER / "tokenizer.json")).get_vocab_size(with_added_tokens=True)


# ---------------------------------------------------------------- the runtime ------

def test_a_stage_on_a_megatron_prefix_plans_and_reads_windows(tmp_path):
    rng = np.random.default_rng(3)
    docs = [[rng.integers(0, 8192, size=int(rng.integers(1, 40))).tolist()] for _ in range(60)]
    prefix = build_with_megatron(tmp_path / "mg" / "web_text_document", docs, "int32")
    stream = np.concatenate([d[0] for d in docs])
    ends = np.cumsum([len(d[0]) for d in docs])
    stages = [{"name": "s", "start_training_step": 1,
               "data": {"use_position_ids": True, "dataset": {"dataset_folder": str(prefix)}}}]
    plan = DataPlan(make_config(seq=16, train_steps=4, stages=stages))
    windows = plan.datasets[0]
    assert (windows.reader.format, windows.num_samples) == ("megatron", (len(stream) - 1) // 16)
    _, loc = plan.global_batch(3)
    rows = windows.tokens(np.asarray(loc.sample))
    for row, i in zip(rows, loc.sample.tolist()):
        assert row.tolist() == stream[i * 16 : i * 16 + 17].tolist()
    same, starts, restarts = TokenWindows(prefix, 16), set(ends.tolist()), 0
    for i in loc.sample.tolist():
        expected, start = [], 0
        for p in range(17):  # the position within the document, restarting where a document begins
            start = p if i * 16 + p in starts else start
            expected.append(p - start)
        assert same.position_ids(i).tolist() == windows.position_ids(i).tolist() == expected
        restarts += expected[1:].count(0)
    assert restarts > 0


def test_training_on_a_megatron_prefix_equals_training_on_the_same_datatrove_shard(tmp_path, shards):
    """The fixture web shards rewritten by megatron-core (int32) and as one datatrove shard (uint16) of the
    same name: one data fingerprint, so one sample order, and bit-identical losses."""
    web = open_dataset(shards / "shards" / "web")
    docs = [web.document(i).tolist() for i in range(web.num_documents)]
    prefix = build_with_megatron(tmp_path / "mg" / "web", [[d] for d in docs], "int32")
    write_datatrove(tmp_path / "dt", [docs], tokenizer_name="tokenizer")
    (tmp_path / "dt" / "000.ds").rename(tmp_path / "dt" / "web.ds")
    (tmp_path / "dt" / "000.ds.index").rename(tmp_path / "dt" / "web.ds.index")
    (tmp_path / "dt" / "000.ds.metadata").rename(tmp_path / "dt" / "web.ds.metadata")
    losses = []
    for name, data in (("megatron", prefix), ("datatrove", tmp_path / "dt")):
        cfg = small_config(tmp_path, tmp_path / f"run-{name}", dp=1, steps=3, interval=100, single_stage=True,
                           name=f"{name}.yaml")
        d = yaml.safe_load(cfg.read_text())
        d["data_stages"][0]["data"]["dataset"] = {"dataset_folder": str(data)}
        cfg.write_text(yaml.safe_dump(d))
        train_one(cfg, tmp_path)
        losses.append([m["loss"] for m in metrics(tmp_path / f"run-{name}") if "loss" in m])
    assert len(losses[0]) == 3 and losses[0] == losses[1]


def test_convert_keeps_a_datatrove_folders_loss_masks(tmp_path):
    src = tmp_path / "dt"
    write_datatrove(src, [[[5, 6, 0], [7, 0]], [[9, 0]]])
    (src / "000.ds.loss").write_bytes(bytes([0, 1, 1, 0, 1]))
    (src / "001.ds.loss").write_bytes(bytes([1, 1]))
    out = tmp_path / "out"
    run_cli("convert", src, "-o", out)
    ds = open_dataset(out)
    assert ds.has_loss_masks and ds.loss_mask(0, 7).tolist() == [0, 1, 1, 0, 1, 1, 1]
    manifest = json.loads((out / "nanoset.json").read_text())
    assert manifest["loss_masks"] is True and [s["loss_tokens"] for s in manifest["shards"]] == [3, 2]
    assert run_cli("verify", out).stdout.endswith(
        "verified (checksums, index, token ids and loss masks; no EOS check: the tokenizer is unknown)\n")
    (src / "001.ds.loss").write_bytes(bytes([1, 2]))
    proc = run_cli("convert", src, "-o", tmp_path / "bad", check=False)
    assert proc.stderr == f"error: {src}/001.ds.loss: loss mask value 2 at token 1; only 0 and 1 are valid\n"


def test_negative_ids_are_refused_before_training(tmp_path):
    prefix = write_mmidx(tmp_path / "neg", [[[5, 6]], [[7, -1, 8]]], "int32")
    stages = [{"name": "s", "start_training_step": 1, "data": {"dataset": {"dataset_folder": str(prefix)}}}]
    with pytest.raises(NanosetError) as e:
        DataPlan(make_config(seq=2, stages=stages))
    assert str(e.value) == f"{tmp_path}/neg.bin: negative token id -1 at position 3; token ids must be ≥ 0"
