"""Opening costs little per shard: a folder with a manifest is read as a table of columns (no reader
object, record or path per shard, the manifest streamed instead of parsed whole), and the caches of
scans (largest id, Megatron document ends) notice a file rewritten with its size and mtime kept.
The time and memory of 100,000 shards against 100 are measured by ``tools/bench_shards.py``."""

from __future__ import annotations

import hashlib
import json
import os
import tracemalloc

import numpy as np
import pytest

from nanoset import Manifest, ShardInfo, TokenizerInfo, open_dataset, write_manifest
from nanoset.format import jsonstream
from nanoset.format import reader as reader_module
from nanoset.format.spec import metadata_text, shard_files
from tests.support.datasets import write_datatrove
from tests.support.megatron_data import cache_dir, write_mmidx  # noqa: F401 (cache_dir: an autouse fixture)

SHARDS = 4000


def many_shards(folder, shards: int = SHARDS) -> list[ShardInfo]:
    """``shards`` one-document shards (document k is [k % 500 + 1, 7, 0]) and a manifest as tokenize writes
    it (checksums, sources)."""
    folder.mkdir()
    infos = []
    for k in range(shards):
        name = f"{k // 1000:05d}_{k % 1000:05d}"
        data = {"ds": np.array([k % 500 + 1, 7, 0], dtype="<u2").tobytes(),
                "index": np.array([3], dtype="<u8").tobytes(), "metadata": metadata_text("toy", 2, 3).encode()}
        for role, file in shard_files(name).items():
            (folder / file).write_bytes(data[role])
        infos.append(ShardInfo(name, 3, 1, {r: hashlib.sha256(b).hexdigest() for r, b in data.items()},
                               [{"path": "/data/corpus/part-000.jsonl", "split": None, "start": 64 * k,
                                 "stop": 64 * k + 64}], max_token_id=max(k % 500 + 1, 7)))
    write_manifest(folder, Manifest(TokenizerInfo("toy", 8192, eos_id=0), "uint16", infos))
    return infos


def old_fingerprint(infos: list[ShardInfo]) -> str:
    """The fingerprint's definition (checkpoints record it: it must never change)."""
    payload = [(s.name, s.num_tokens, s.num_documents, s.sha256.get("ds"), s.sha256.get("index")) for s in infos]
    return hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()[:16]


def opened(folder):
    """The folder opened and fingerprinted, and the peak of memory allocated meanwhile."""
    tracemalloc.start()
    try:
        ds = open_dataset(folder)
        ds.fingerprint  # noqa: B018
        return ds, tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def test_opening_many_shards_makes_no_reader_per_shard_and_holds_less_than_the_manifest(tmp_path, monkeypatch):
    few, many = tmp_path / "few", tmp_path / "many"
    many_shards(few, SHARDS // 10)
    infos = many_shards(many)
    made = []
    real_init = reader_module.ShardReader.__init__

    def counting_init(self, *args, **kwargs):
        made.append(args[1])
        real_init(self, *args, **kwargs)

    monkeypatch.setattr(reader_module.ShardReader, "__init__", counting_init)
    monkeypatch.setattr(jsonstream, "BLOCK", 1 << 14)  # the text read at a time and ...
    monkeypatch.setattr(jsonstream, "BATCH", 64)  # ... the records handed over at once: constants, kept small here
    (_, peak_few), (ds, peak_many) = opened(few), opened(many)
    more_manifest = (many / "nanoset.json").stat().st_size - (few / "nanoset.json").stat().st_size
    # json.loads held the whole text and a record, a sha256 dict, a sources list and 4 paths per shard
    assert made == [] and peak_many - peak_few < more_manifest / 2, (len(made), peak_many - peak_few, more_manifest)
    assert (len(ds.shards), ds.num_tokens, ds.num_documents, ds.max_token_id) == (SHARDS, 3 * SHARDS, SHARDS, 500)
    assert ds.fingerprint == old_fingerprint(infos)
    assert ds.document(2345).tolist() == [2345 % 500 + 1, 7, 0] and made == ["00002_00345"]
    assert [s.name for s in ds.shards[10:12]] == ["00000_00010", "00000_00011"] and ds.shards[-1].name == "00003_00999"
    # the full records (verify, convert) are read when asked for
    assert ds.manifest.shards[7] == infos[7] and len(ds.manifest.shards) == SHARDS


@pytest.mark.parametrize("edit", ["compact", "unusual"])
def test_manifests_written_by_hand_read_the_same(tmp_path, edit):
    """A manifest in another layout (no indentation, keys in another order) or with values the streamed
    read does not expect (a float count, an unknown shard key) reads as before, or fails as before."""
    folder = tmp_path / "d"
    infos = many_shards(folder, 30)
    path = folder / "nanoset.json"
    d = json.loads(path.read_text())
    if edit == "compact":
        path.write_text(json.dumps(dict(reversed(list(d.items()))), separators=(",", ":")))
        ds = open_dataset(folder)
        assert ds.num_documents == 30 and ds.fingerprint == old_fingerprint(infos) and ds.max_token_id == 30
        return
    d["shards"][3]["max_token_id"] = None  # an older manifest: the id is scanned
    path.write_text(json.dumps(d))
    assert open_dataset(folder).max_token_id == 30
    d["shards"][4]["num_tokens"] = 3.0
    path.write_text(json.dumps(d))
    with pytest.raises(Exception, match="malformed manifest .*TypeError: shard '00000_00004': name, num_tokens"):
        open_dataset(folder)


def test_the_largest_id_is_rescanned_when_a_file_is_rewritten_keeping_size_and_mtime(tmp_path):
    """The scan record was keyed by size and mtime only: ``cp -p`` / ``rsync -a`` of other data (same size,
    same mtime) kept the old largest id, so a too-large id passed the vocabulary check."""
    folder = tmp_path / "dt"
    write_datatrove(folder, [[[5, 6, 0]], [[7, 0]]])
    assert open_dataset(folder).max_token_id == 7
    shard = folder / "001.ds"
    st = shard.stat()
    with open(shard, "r+b") as f:  # in place: the same inode
        f.write(np.array([9000, 0], dtype="<u2").tobytes())
    os.utime(shard, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert shard.stat().st_size == st.st_size and shard.stat().st_mtime_ns == st.st_mtime_ns
    assert open_dataset(folder).max_token_id == 9000


def test_a_full_cache_disk_leaves_the_largest_id_unrecorded_not_the_folder_unreadable(tmp_path, monkeypatch):
    """The scan record is a cache: a full disk there (atomic_write's one-line WriteFailed) stopped reading."""
    from nanoset import cache
    from nanoset.errors import WriteFailed

    def full_disk(path, _text):
        raise WriteFailed(path, "No space left on device")

    monkeypatch.setattr(cache, "atomic_write_text", full_disk)  # the one writer of cache records
    folder = tmp_path / "dt"
    write_datatrove(folder, [[[5, 6, 0]], [[7, 0]]])
    assert open_dataset(folder).max_token_id == 7


def test_megatron_ends_are_derived_again_when_the_index_is_rewritten_keeping_size_and_mtime(tmp_path):
    prefix = write_mmidx(tmp_path / "d", [[[1, 2, 3]], [[4, 5]]], "int32")
    assert open_dataset(prefix).document_ends.tolist() == [3, 5]
    other = write_mmidx(tmp_path / "e", [[[1, 2]], [[3, 4, 5]]], "int32")  # same sizes, other document ends
    idx = prefix.with_name("d.idx")
    st = idx.stat()
    with open(idx, "r+b") as f:
        f.write(other.with_name("e.idx").read_bytes())
    os.utime(idx, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert open_dataset(prefix).document_ends.tolist() == [2, 5]


@pytest.mark.parametrize("block", [1, 2, 3, 7, 64])
def test_streamed_object_equals_json_loads_at_any_block_size(tmp_path, monkeypatch, block):
    """Elements, numbers and separators cut by the end of a block read the same as json.loads reads them."""
    monkeypatch.setattr(jsonstream, "BLOCK", block)
    monkeypatch.setattr(jsonstream, "BATCH", 2)
    value = {"a": 12345, "shards": [1234567, {"x": [1, 2.5, None]}, "s\u00e9\"q", [], 0, True, -7e3],
             "z": {"shards": [9]}, "b": "end"}
    for text in (json.dumps(value), json.dumps(value, indent=3), json.dumps({"shards": []}), '{"shards":[1] }\n'):
        path = tmp_path / "m.json"
        path.write_text(text)
        got = []
        with open(path, encoding="utf-8") as f:
            rest = jsonstream.read_object(f, "shards", got.extend)
        expected = json.loads(text)
        assert got == expected.pop("shards") and rest == expected
    for bad in ('{"shards": [1,]}', '{"shards": [1] "x": 2}', '[1]', '{"shards": 1}', '{"a": 1}', '{"shards": []} x',
                '{"shards": [], "shards": []}'):
        path.write_text(bad)
        with open(path, encoding="utf-8") as f, pytest.raises(ValueError):
            jsonstream.read_object(f, "shards", got.extend)
