"""The on-disk format: ShardWriter/open_dataset round trips and datatrove compatibility."""

from __future__ import annotations

import numpy as np
import pytest

from nanoset import Manifest, NanosetError, ShardWriter, TokenizerInfo, open_dataset, write_manifest
from nanoset.format.spec import metadata_text
from tests.support import one_line_error, run_cli


def write_dataset(folder, docs_per_shard, dtype=np.uint16, vocab=1000):
    shards = []
    for i, docs in enumerate(docs_per_shard):
        with ShardWriter(folder, f"{i:03d}", dtype, "toy") as w:
            for d in docs:
                w.add_document(d)
            shards.append(w.finalize())
    manifest = Manifest(TokenizerInfo("toy", vocab, eos_id=0), "uint16" if dtype == np.uint16 else "uint32", shards)
    write_manifest(folder, manifest)
    return manifest


def test_round_trip_across_shards(tmp_path):
    docs = [[[5, 6, 0], [7, 0]], [[8, 9, 10, 0]], [[11, 0], [12, 13, 0]]]
    write_dataset(tmp_path, docs)
    ds = open_dataset(tmp_path)
    flat = [t for shard in docs for d in shard for t in d]
    assert ds.num_tokens == 14 and ds.num_documents == 5 and ds.dtype == np.dtype("<u2")
    assert ds.tokens(0, 14).tolist() == flat
    assert ds.tokens(3, 9).tolist() == [7, 0, 8, 9, 10, 0]  # crosses shards 0 -> 1 -> 2
    assert ds.tokens(9, 11).tolist() == [11, 0]
    view = ds.tokens(9, 11)
    assert not view.flags.owndata and not view.flags.writeable  # inside one shard: a view of the map, no copy
    assert [ds.document(i).tolist() for i in range(5)] == [d for shard in docs for d in shard]
    assert ds.document_ends.tolist() == [3, 5, 9, 11, 14]
    assert ds.document_starts(2, 12).tolist() == [3, 5, 9, 11]
    assert ds.document_ids(4, 10).tolist() == [1, 2, 3]
    assert ds.tokenizer.eos_id == 0


def test_files_are_datatrove_bytes(tmp_path):
    write_dataset(tmp_path, [[[1, 2, 0], [3, 0]]])
    assert (tmp_path / "000.ds").read_bytes() == np.array([1, 2, 0, 3, 0], "<u2").tobytes()
    assert (tmp_path / "000.ds.index").read_bytes() == np.array([3, 5], "<u8").tobytes()
    assert (tmp_path / "000.ds.metadata").read_text() == "toy|2\n5\n5"
    assert metadata_text("gpt2", 4, 1_234_567) == "gpt2|4\n1234567\n1.23M"


def test_uint32_tokens(tmp_path):
    write_dataset(tmp_path, [[[70000, 1, 0]]], dtype=np.uint32, vocab=100_000)
    ds = open_dataset(tmp_path)
    assert ds.dtype == np.dtype("<u4") and ds.tokens(0, 3).tolist() == [70000, 1, 0]


def test_unfinalized_writer_leaves_no_shard(tmp_path):
    with pytest.raises(RuntimeError):
        with ShardWriter(tmp_path, "x", np.uint16, "toy") as w:
            w.add_document([1, 2])
            raise RuntimeError("crash")
    assert list(tmp_path.iterdir()) == []


def test_writer_rejects_bad_ids(tmp_path):
    with ShardWriter(tmp_path, "x", np.uint16, "toy") as w:
        with pytest.raises(NanosetError, match="out of range"):
            w.add_document([70000])
        with pytest.raises(NanosetError, match="at least one token"):
            w.add_documents(np.array([], dtype=np.int64), np.array([0]))


def test_a_size_mismatch_is_caught_when_the_shard_is_first_read_and_by_inspect_and_verify(tmp_path):
    """Opening a folder with a manifest makes no stat per file (100,000 shards: 200,000 stats, 0.3-0.6 s): each
    file's size is checked by the fstat its map makes, with the same one line."""
    write_dataset(tmp_path, [[[1, 2, 0]], [[3, 0]]])
    with open(tmp_path / "001.ds", "ab") as f:
        f.write(b"\0\0")
    (tmp_path / "000.ds.index").unlink()
    ds = open_dataset(tmp_path)
    assert ds.num_tokens == 5
    line = (f"{tmp_path / '001.ds'}: 6 bytes, expected 4; the file is truncated or replaced (run `nanoset verify "
            f"{tmp_path}`)")
    with pytest.raises(NanosetError) as e:
        ds.tokens(3, 5)
    assert str(e.value) == line
    with pytest.raises(NanosetError) as e:
        ds.document(0)
    assert str(e.value) == (f"{tmp_path / '000.ds.index'}: missing: the file was removed or moved since the dataset "
                            f"was written; restore it (run `nanoset verify {tmp_path}`) and rerun")
    missing = f"error: {tmp_path / '000.ds.index'}: missing; the dataset is incomplete (re-run `nanoset tokenize`)"
    for command in ("inspect", "verify"):  # every shard checked first
        one_line_error(run_cli(command, tmp_path, check=False), missing)
    (tmp_path / "000.ds.index").write_bytes(np.array([3], dtype="<u8").tobytes())
    for command in ("inspect", "verify"):
        one_line_error(run_cli(command, tmp_path, check=False), f"error: {line}")


def test_datatrove_folder_matches_independent_numpy_reader(tmp_path):
    """A folder as datatrove writes it (no manifest, metadata 'name|size') reads back exactly."""
    rng = np.random.default_rng(0)
    all_docs = []
    for name in ("000_shard.ds", "001_shard.ds"):
        docs = [np.append(rng.integers(1, 50000, rng.integers(1, 40)), 0).astype("<u2") for _ in range(30)]
        all_docs += docs
        (tmp_path / name).write_bytes(b"".join(d.tobytes() for d in docs))
        ends = np.cumsum([len(d) for d in docs]).astype("<u8")
        (tmp_path / (name + ".index")).write_bytes(ends.tobytes())
        (tmp_path / (name + ".metadata")).write_text(f"gpt2|2\n{int(ends[-1])}\n1K")
    ds = open_dataset(tmp_path)
    # the independent reader: plain numpy over the files, in name order
    stream = np.concatenate([np.fromfile(tmp_path / n, dtype="<u2") for n in ("000_shard.ds", "001_shard.ds")])
    assert ds.format == "datatrove" and ds.tokenizer.name == "gpt2"
    assert ds.num_tokens == len(stream) and ds.num_documents == 60
    np.testing.assert_array_equal(ds.tokens(0, ds.num_tokens), stream)
    for i in (0, 29, 30, 59):
        np.testing.assert_array_equal(ds.document(i), all_docs[i])


def test_open_errors(tmp_path):
    with pytest.raises(NanosetError, match="no such dataset folder"):
        open_dataset(tmp_path / "missing")
    with pytest.raises(NanosetError, match="neither nanoset.json nor"):
        open_dataset(tmp_path)
