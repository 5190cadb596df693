"""Tokenize hardening on the input side: tokenizer settings, bad Unicode, line numbers, long lines, discovery."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from nanoset import open_dataset
from nanoset.tokenize import rows as corpus_mod
from nanoset.tokenize.inputs import Piece, Source, discover, split_source
from nanoset.tokenize.rows import TextReader
from tests.support import CORPUS, TOKENIZER, one_line_error, run_cli


def all_docs(folder: Path) -> list[list[int]]:
    ds = open_dataset(folder)
    return [ds.document(i).tolist() for i in range(ds.num_documents)]


# ---------------------------------------------------------------- tokenizer settings ---------------


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

    from nanoset.tokenize.tokenizer import (
        load_tokenizer,  # inspect's decoder and the runtime's HF cache load it this way
    )

    loaded = load_tokenizer(tok_dir / "tokenizer.json")
    assert loaded.truncation is None and loaded.padding is None


# ---------------------------------------------------------------- lone surrogates ---------------


def tokenize(tmp_path: Path, *inputs, extra=(), out="out"):
    return run_cli("tokenize", *inputs, "-o", tmp_path / out, "--tokenizer", TOKENIZER, "--quiet", *extra,
                   check=False)


def test_lone_surrogate_is_bad_input(tmp_path, tokenizer, eos_id):
    lines = [b'{"text": "ok"}', b'{"text": "smile \\ud83d\\ude00 pair"}', b'{"text": "lone \\ud83d here"}',
             b'{"text": "\\uDC00 low"}', b'{"text": "last", "other": "\\ud800"}']
    f = tmp_path / "a.jsonl"
    f.write_bytes(b"\n".join(lines) + b"\n")
    one_line_error(tokenize(tmp_path, f), f"{f}:3: column 'text' holds a lone surrogate \\ud83d", "--skip-bad-lines")
    proc = tokenize(tmp_path, f, out="o1", extra=["--skip-bad-lines"])
    assert proc.returncode == 0 and "skipped 2 bad lines" in proc.stdout, proc.stderr
    assert all_docs(tmp_path / "o1") == [tokenizer.encode(t).ids + [eos_id] for t in ("ok", "smile 😀 pair", "last")]

    arr = tmp_path / "b.json"
    arr.write_bytes(b'[{"text": "ok"}, {"text": "x \\udfff"}]')
    one_line_error(tokenize(tmp_path, arr, out="o2"), f"{arr}: element 1: column 'text' holds a lone surrogate \\udfff")
    proc = tokenize(tmp_path, arr, out="o3", extra=["--skip-bad-lines"])
    assert proc.returncode == 0 and "skipped 1 bad lines" in proc.stdout
    assert all_docs(tmp_path / "o3") == [tokenizer.encode("ok").ids + [eos_id]]


def test_invalid_utf8_in_parquet_names_the_absolute_row(tmp_path, tokenizer, eos_id):
    """Arrow strings cannot hold surrogates, but a foreign writer can store invalid UTF-8 (e.g. CESU-8)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    values = [f"doc {i}".encode() for i in range(3000)]
    values[2500] = b"bad \xed\xa0\xbd"
    raw = pa.array(values, pa.binary())
    pq.write_table(pa.table({"text": pa.Array.from_buffers(pa.string(), len(raw), raw.buffers())}),
                   tmp_path / "a.parquet", row_group_size=1000)
    one_line_error(tokenize(tmp_path, tmp_path / "a.parquet"),
                   f"{tmp_path / 'a.parquet'}: row index 2500: column 'text' holds invalid UTF-8")
    proc = tokenize(tmp_path, tmp_path / "a.parquet", out="o1", extra=["--skip-bad-lines"])
    assert proc.returncode == 0 and "skipped 1 bad lines" in proc.stdout
    docs = all_docs(tmp_path / "o1")
    assert len(docs) == 2999 and docs[2500] == tokenizer.encode("doc 2501").ids + [eos_id]


def test_parquet_and_hf_errors_name_the_absolute_row(tmp_path):
    """Row numbers count from the file's (split's) first row, not from the start of a 1024-row batch."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    texts: list = [f"doc {i}" for i in range(3000)]
    texts[2500] = None
    pq.write_table(pa.table({"text": texts}), tmp_path / "a.parquet", row_group_size=1000)
    one_line_error(tokenize(tmp_path, tmp_path / "a.parquet", extra=["--task-bytes", "1"]),
                   f"{tmp_path / 'a.parquet'}: row index 2500: column 'text' is NoneType, not text")
    datasets = pytest.importorskip("datasets")
    datasets.Dataset.from_dict({"text": texts}).save_to_disk(str(tmp_path / "hf"))
    one_line_error(tokenize(tmp_path, tmp_path / "hf", out="o2"),
                   f"{tmp_path / 'hf'}: row index 2500: column 'text' is NoneType, not text")


# ---------------------------------------------------------------- line numbers kept incrementally ----


def counting_open(monkeypatch) -> list[str]:
    """Record every file nanoset.tokenize.rows opens (the old reader re-read the file from byte 0 per bad line)."""
    opened: list[str] = []

    def _open(path, *args, **kwargs):
        opened.append(str(path))
        return open(path, *args, **kwargs)

    monkeypatch.setattr(corpus_mod, "open", _open, raising=False)
    return opened


def pieces_of(path: Path, target: int) -> list[Piece]:
    src = Source(str(path), "jsonl", path.stat().st_size, 0)
    return split_source(src, target)


def test_skip_bad_lines_reads_each_piece_once(tmp_path, monkeypatch):
    f = tmp_path / "a.jsonl"
    f.write_bytes(b"".join(b'{"text": broken}\n' if i % 10 == 3 else b'{"text": "line %d"}\n' % i
                           for i in range(3000)))
    pieces = pieces_of(f, 8_000)
    assert len(pieces) >= 5
    opened = counting_open(monkeypatch)
    texts, skipped = [], 0
    for piece in pieces:
        reader = TextReader(piece, "text", skip_bad=True)
        texts += [t for batch in reader.batches() for t in batch]
        skipped += reader.skipped
    assert skipped == 300 and texts == [f"line {i}" for i in range(3000) if i % 10 != 3]
    assert opened == [str(f)] * len(pieces)


@pytest.mark.parametrize("bad_line", [1, 2, 777, 1500, 2999, 3000])
def test_error_line_numbers_are_exact_in_every_piece(tmp_path, monkeypatch, bad_line):
    f = tmp_path / "a.jsonl"
    lines = [b'{"text": "line %d"}' % i for i in range(1, 3001)]
    lines[bad_line - 1] = b'{"text": oops}'
    f.write_bytes(b"\n".join(lines))  # no final newline
    monkeypatch.setattr(corpus_mod, "READ_BLOCK", 1000)  # counting the lines before a piece spans many blocks
    opened = counting_open(monkeypatch)
    errors = []
    for piece in pieces_of(f, 7_000):
        try:
            for _ in TextReader(piece, "text", skip_bad=False).batches():
                pass
        except corpus_mod.NanosetError as e:
            errors.append(str(e))
    assert errors == [f"{f}:{bad_line}: malformed JSON (Expecting value at column 10) "
                      f"(pass --skip-bad-lines to skip and count such lines)"]
    pieces = pieces_of(f, 7_000)
    in_first_piece = sum(len(line) + 1 for line in lines[: bad_line - 1]) < pieces[0].stop
    assert len(opened) == len(pieces) + (0 if in_first_piece else 1)  # plus one count of the lines before


# ---------------------------------------------------------------- long lines in linear time --------


class Block(bytes):
    """A block as read from a file; counts how often it is scanned and forbids re-copying it by ``+``."""

    scanned = 0

    def split(self, *args, **kwargs):
        Block.scanned += len(self)
        return super().split(*args, **kwargs)

    def __add__(self, other):
        raise AssertionError("a block was concatenated to the pending line: quadratic for long lines")

    __radd__ = __add__


def test_iter_lines_across_tiny_blocks():
    import random

    r = random.Random(3)
    pieces = [b"", b"x" * 500, b"a", b"\r", b"{}\r", b"\xc3\xa9" * 40, b" ", b"z" * 37]
    for trial in range(200):
        lines = [r.choice(pieces) for _ in range(r.randint(0, 12))]
        data = b"\n".join(lines) + (b"\n" if r.random() < 0.5 else b"")
        size = r.choice([1, 2, 3, 7, 64])
        blocks = [data[i : i + size] for i in range(0, len(data), size)]
        expected = data.split(b"\n")
        if expected and expected[-1] == b"":
            expected.pop()
        assert list(corpus_mod.iter_lines(blocks)) == expected, (trial, data, size)


def test_long_line_is_read_once_without_recopying(tmp_path, monkeypatch):
    f = tmp_path / "long.jsonl"
    long_text = "word " * 2000  # 10,000 characters: a line of 100+ blocks
    f.write_text(json.dumps({"text": "a"}) + "\n" + json.dumps({"text": long_text}) + "\n\n"
                 + json.dumps({"text": "b"}))
    monkeypatch.setattr(corpus_mod, "READ_BLOCK", 97)
    real = TextReader._open_blocks
    monkeypatch.setattr(TextReader, "_open_blocks",
                        lambda self: (lambda blocks, pos: ((Block(b) for b in blocks), pos))(*real(self)))
    Block.scanned = 0
    reader = TextReader(Piece(Source(str(f), "jsonl", f.stat().st_size, 0), 0, f.stat().st_size, 1), "text", False)
    assert [t for batch in reader.batches() for t in batch] == ["a", long_text, "b"]
    assert Block.scanned == f.stat().st_size  # every byte scanned once


# ---------------------------------------------------------------- discovery in linear time ---------


def test_discover_many_files_keeps_order_and_dedups(tmp_path, monkeypatch):
    folder = tmp_path / "many"
    folder.mkdir()
    for i in range(3000):
        (folder / f"{i:05d}.jsonl").write_text('{"text": "x"}\n')
    extra = tmp_path / "extra.jsonl"
    extra.write_text('{"text": "y"}\n')
    compared = []
    monkeypatch.setattr(Source, "__eq__", lambda a, b: compared.append(1) or a is b)
    found = discover([str(extra), str(folder), str(folder / "00007.jsonl"), f"{tmp_path}/./extra.jsonl",
                      str(folder / "0000*.jsonl")])
    assert [Path(s.path).name for s in found] == ["extra.jsonl"] + [f"{i:05d}.jsonl" for i in range(3000)]
    assert found[0].path == str(extra)
    assert len(compared) < 100  # no list membership: the old scan compared ~4.5 million pairs


def test_symbolic_link_loop_in_an_input_folder(tmp_path):
    """A link back up the tree (``sub/up -> ..``) made discovery descend until ELOOP: an error, no dataset."""
    (tmp_path / "data" / "sub").mkdir(parents=True)
    (tmp_path / "data" / "a.jsonl").write_text('{"text": "a"}\n')
    (tmp_path / "data" / "sub" / "b.jsonl").write_text('{"text": "b"}\n')
    (tmp_path / "data" / "sub" / "up").symlink_to("..")
    found = discover([str(tmp_path / "data")])
    assert [s.path for s in found] == [str(tmp_path / "data" / "a.jsonl"), str(tmp_path / "data" / "sub" / "b.jsonl")]
