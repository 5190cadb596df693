"""Damaged inputs as they come from the web or an interrupted download: one error line naming the file,
never a traceback, a bare 'aborted' or a silently shortened corpus."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest
import zstandard

import nanoset.tokenize.rows as corpus_mod
from nanoset import open_dataset
from nanoset.errors import NanosetError
from nanoset.tokenize.inputs import Piece, Source
from nanoset.tokenize.rows import TextReader
from tests.support import TOKENIZER, one_line_error, run_cli

LINES = [json.dumps({"text": f"document {i} " + "word " * (i % 40)}).encode() for i in range(3000)]
DATA = b"\n".join(LINES) + b"\n"


def tokenize(tmp_path: Path, *inputs, extra=()):
    return run_cli("tokenize", *inputs, "-o", tmp_path / "out", "--tokenizer", TOKENIZER, "--quiet", "--overwrite",
                   *extra, check=False)


def texts_of(path: Path, kind: str, skip_bad: bool = False) -> list[str]:
    size = path.stat().st_size
    reader = TextReader(Piece(Source(str(path), kind, size, 0), 0, size, size), "text", skip_bad)
    return [t for batch in reader.batches() for t in batch]


def test_utf8_encoded_lone_surrogate_is_bad_input(tmp_path, tokenizer, eos_id):
    # ED A0 BD: a surrogate written as UTF-8 bytes (not an escape); json.loads(bytes) let it through
    # and the tokenizer died with a TypeError traceback, even with --skip-bad-lines
    bad = b'{"text": "a\xed\xa0\xbdb"}'
    at = bad.index(b"\xed")
    path = tmp_path / "in.jsonl"
    path.write_bytes(b'{"text": "ok"}\n' + bad + b"\n")
    one_line_error(tokenize(tmp_path, path), f"{path}: invalid UTF-8 at byte offset {15 + at} (line 2)")
    assert tokenize(tmp_path, path, extra=["--skip-bad-lines"]).returncode == 0
    ds = open_dataset(tmp_path / "out")
    assert ds.manifest.skipped_lines == 1 and ds.document(0).tolist() == tokenizer.encode("ok").ids + [eos_id]
    array = tmp_path / "in.json"
    array.write_bytes(b'[{"text": "ok"}, ' + bad + b"]")
    with pytest.raises(NanosetError, match=f"{array}: invalid UTF-8 at byte offset {17 + at}"):
        texts_of(array, "json")


def test_truncated_gzip_is_named_not_aborted(tmp_path):
    path = tmp_path / "in.jsonl.gz"
    path.write_bytes(gzip.compress(DATA)[:-2000])
    one_line_error(tokenize(tmp_path, path), f"{path}: not a valid gzip file, or truncated (Compressed file ended")
    path.write_bytes(b"plain text, not gzip\n")
    one_line_error(tokenize(tmp_path, path), f"{path}: not a valid gzip file, or truncated (Not a gzipped file")


def test_truncated_zstd_is_an_error_not_a_shorter_corpus(tmp_path, monkeypatch):
    path = tmp_path / "in.jsonl.zst"
    whole = zstandard.ZstdCompressor().compress(DATA)
    # zstandard's stream reader ended quietly at the cut: the lines after it were lost without a word
    # (with --skip-bad-lines even the cut line was only counted)
    path.write_bytes(whole[: len(whole) * 2 // 3])
    for skip in (False, True):
        with pytest.raises(NanosetError, match=f"{path}: not a valid zstd file, or truncated \\(the file ends inside"):
            texts_of(path, "jsonl.zst", skip)
    path.write_bytes(b"not zstd")
    with pytest.raises(NanosetError, match=f"{path}: not a valid zstd file, or truncated \\(zstd decompress"):
        texts_of(path, "jsonl.zst")
    # several frames (and a skippable one) are still read whole
    c = zstandard.ZstdCompressor()
    skippable = (0x184D2A50).to_bytes(4, "little") + (3).to_bytes(4, "little") + b"abc"
    frames = [c.compress(b"\n".join(LINES[:10]) + b"\n"), skippable, c.compress(b"\n".join(LINES[10:]) + b"\n")]
    path.write_bytes(b"".join(frames))
    for feed in (7, corpus_mod.ZSTD_FEED):  # frames and headers cut across decompress calls
        monkeypatch.setattr(corpus_mod, "ZSTD_FEED", feed)
        assert texts_of(path, "jsonl.zst") == [json.loads(line)["text"] for line in LINES]


def test_corrupt_parquet_is_one_line(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    path = tmp_path / "in.parquet"
    pq.write_table(pa.table({"text": [f"row {i} " * 20 for i in range(3000)]}), path, row_group_size=500)
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    one_line_error(tokenize(tmp_path, path), f"{path}: not a valid parquet file, or truncated (Parquet magic bytes")
    path.write_bytes(data[:4] + b"\xff" * 3000 + data[3004:])  # footer intact, pages garbage
    one_line_error(tokenize(tmp_path, path), f"{path}: not a valid parquet file, or truncated (")


def test_json_array_with_a_byte_order_mark(tmp_path):
    path = tmp_path / "in.json"
    path.write_bytes(b'\xef\xbb\xbf[\n{"text": "one"},\n{"text": "two"}\n]\n')
    assert texts_of(path, "json") == ["one", "two"]
    path.write_bytes(b'\xef\xbb\xbf{"text": "one"}\n{"text": "two"}\n')  # JSON lines after a BOM
    assert texts_of(path, "json") == ["one", "two"]


def test_json_nested_too_deeply_is_bad_input(tmp_path):
    # json.loads raised RecursionError: a traceback, even with --skip-bad-lines
    deep = "[" * 100_000 + "]" * 100_000
    path = tmp_path / "in.jsonl"
    path.write_text('{"text": "ok"}\n{"text": "a", "x": ' + deep + "}\n")
    with pytest.raises(NanosetError, match=f"^{path}:2: malformed JSON \\(nested too deeply to read\\)"):
        texts_of(path, "jsonl")
    assert texts_of(path, "jsonl", skip_bad=True) == ["ok"]
    array = tmp_path / "in.json"
    array.write_text('[{"text": "a", "x": ' + deep + "}]")
    with pytest.raises(NanosetError, match=f"^{array}: malformed JSON \\(nested too deeply to read\\)$"):
        texts_of(array, "json")


def test_damaged_saved_hf_dataset_is_one_line(tmp_path):
    import datasets

    folder = tmp_path / "hf"
    datasets.DatasetDict({"train": datasets.Dataset.from_dict({"text": ["a b c"] * 100})}).save_to_disk(str(folder))
    arrow = next((folder / "train").glob("*.arrow"))
    arrow.write_bytes(arrow.read_bytes()[:300])
    one_line_error(tokenize(tmp_path, folder), f"{folder}: cannot load the saved dataset (ArrowInvalid: ")
    (folder / "dataset_dict.json").write_text("{}")  # a traceback (KeyError) while listing the inputs
    one_line_error(tokenize(tmp_path, folder), f"{folder / 'dataset_dict.json'}: malformed (KeyError: 'splits'); "
                                               f"save the dataset again with save_to_disk")
