"""Input discovery and readers: which files make the corpus, in which order, and their texts.

Order is part of the output's identity: inputs in the order given, each folder walked
recursively in sorted order. Large splittable files are cut into byte or row ranges
(``Piece``) so that tasks are of similar size whatever the number of workers.
"""

from __future__ import annotations

import glob
import gzip
import io
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

from nanoset.errors import NanosetError

KINDS = {".jsonl": "jsonl", ".jsonl.gz": "jsonl.gz", ".jsonl.zst": "jsonl.zst", ".json": "json",
         ".parquet": "parquet", ".txt": "txt"}
BATCH_CHARS = 1 << 20  # texts are yielded in batches of about this many characters
READ_BLOCK = 4 << 20


@dataclass(frozen=True)
class Source:
    """One input: a file, or one split of a folder saved with ``datasets.save_to_disk``."""

    path: str
    kind: str
    bytes: int
    mtime_ns: int
    split: str | None = None

    def describe(self) -> dict:
        d = {"path": self.path, "kind": self.kind, "bytes": self.bytes}
        if self.split is not None:
            d["split"] = self.split
        return d


@dataclass(frozen=True)
class Piece:
    """A range of one source: bytes ``[start, stop)`` for JSON lines, rows for parquet/HF, all else whole."""

    source: Source
    start: int
    stop: int
    weight: int  # estimated input bytes, for grouping pieces into tasks

    def to_json(self) -> dict:
        return {"path": self.source.path, "split": self.source.split, "start": self.start, "stop": self.stop}


def kind_of(path: str) -> str | None:
    name = path.lower()
    for suffix in sorted(KINDS, key=len, reverse=True):
        if name.endswith(suffix):
            return KINDS[suffix]
    return None


def _hf_saved(folder: Path) -> bool:
    return (folder / "dataset_dict.json").is_file() or (
        (folder / "state.json").is_file() and (folder / "dataset_info.json").is_file()
    )


def _hf_sources(folder: Path) -> list[Source]:
    size = sum(p.stat().st_size for p in folder.rglob("*.arrow"))
    mtime = max((p.stat().st_mtime_ns for p in folder.rglob("*") if p.is_file()), default=0)
    if (folder / "dataset_dict.json").is_file():
        splits = json.loads((folder / "dataset_dict.json").read_text())["splits"]
        return [Source(str(folder), "hf", size, mtime, split) for split in splits]
    return [Source(str(folder), "hf", size, mtime)]


def _walk(folder: Path) -> Iterator[Source]:
    if _hf_saved(folder):
        yield from _hf_sources(folder)
        return
    for entry in sorted(os.scandir(folder), key=lambda e: e.name):
        if entry.name.startswith("."):
            continue
        if entry.is_dir():
            yield from _walk(Path(entry.path))
        elif kind_of(entry.name):
            st = entry.stat()
            yield Source(entry.path, kind_of(entry.name), st.st_size, st.st_mtime_ns)


def _expand(path: Path) -> list[Source]:
    if path.is_dir():
        return list(_walk(path))
    st = path.stat()
    return [Source(str(path), kind_of(str(path)), st.st_size, st.st_mtime_ns)]


def discover(inputs: list[str]) -> list[Source]:
    """Expand files, folders and globs into the ordered list of sources; unknown files are errors."""
    sources: list[Source] = []
    for spec in inputs:
        p = Path(spec)
        if p.is_file() and not kind_of(spec):
            raise NanosetError(f"{spec}: unsupported input type; use one of {', '.join(KINDS)}")
        if p.exists():
            found = _expand(p)
        else:
            matches = sorted(glob.glob(spec, recursive=True))
            if not matches:
                raise NanosetError(f"{spec}: no such file or folder, and no file matches it as a glob")
            found = [s for m in matches if Path(m).is_dir() or kind_of(m) for s in _expand(Path(m))]
        if not found:
            raise NanosetError(f"{spec}: holds no input files ({', '.join(KINDS)})")
        sources.extend(s for s in found if s not in sources)
    return sources


def _first_byte(path: str) -> bytes:
    with open(path, "rb") as f:
        return f.read(4096).lstrip()[:1]


def split_source(source: Source, target_bytes: int) -> list[Piece]:
    """Cut a source into pieces of about ``target_bytes``; compressed files and JSON arrays stay whole."""
    if source.kind in ("jsonl", "json") and not (source.kind == "json" and _first_byte(source.path) == b"["):
        n = max(1, -(-source.bytes // target_bytes))
        bounds = [i * source.bytes // n for i in range(n + 1)]
        return [Piece(source, a, b, b - a) for a, b in zip(bounds, bounds[1:])]
    if source.kind == "parquet":
        import pyarrow.parquet as pq

        meta = pq.ParquetFile(source.path).metadata
        pieces, row, start, acc = [], 0, 0, 0
        for g in range(meta.num_row_groups):
            rg = meta.row_group(g)
            row += rg.num_rows
            acc += rg.total_byte_size
            if acc >= target_bytes or g == meta.num_row_groups - 1:
                pieces.append(Piece(source, start, row, acc))
                start, acc = row, 0
        return pieces
    if source.kind == "hf":
        rows = len(_load_hf(source))
        n = max(1, -(-source.bytes // target_bytes))
        bounds = [i * rows // n for i in range(n + 1)]
        return [Piece(source, a, b, max(1, source.bytes // n)) for a, b in zip(bounds, bounds[1:])]
    return [Piece(source, 0, source.bytes, source.bytes)]


def _load_hf(source: Source):
    import datasets

    ds = datasets.load_from_disk(source.path)
    return ds[source.split] if source.split is not None else ds


class TextReader:
    """Yields the texts of one piece in batches, raising (or counting, with ``skip_bad``) bad rows."""

    def __init__(self, piece: Piece, text_column: str, skip_bad: bool) -> None:
        self.piece = piece
        self.column = text_column
        self.skip_bad = skip_bad
        self.skipped = 0

    def batches(self) -> Iterator[list[str]]:
        kind = self.piece.source.kind
        if kind == "txt":
            yield [self._decode_whole()]
        elif kind == "parquet":
            yield from self._parquet()
        elif kind == "hf":
            yield from self._hf()
        elif kind == "json" and _first_byte(self.piece.source.path) == b"[":
            yield from self._json_array()
        else:
            yield from self._batched(self._jsonl_texts())

    # --- helpers -------------------------------------------------------------------------------

    def _bad(self, message: str) -> None:
        if not self.skip_bad:
            raise NanosetError(message + " (pass --skip-bad-lines to skip and count such lines)")
        self.skipped += 1

    @staticmethod
    def _batched(texts: Iterator[str]) -> Iterator[list[str]]:
        batch: list[str] = []
        chars = 0
        for t in texts:
            batch.append(t)
            chars += len(t)
            if chars >= BATCH_CHARS:
                yield batch
                batch, chars = [], 0
        if batch:
            yield batch

    def _missing_column(self, where: str, columns: list[str]) -> NanosetError:
        return NanosetError(
            f"{where}: no column {self.column!r}; the columns there are: {', '.join(map(str, columns)) or 'none'} "
            f"(choose one with --text-column)"
        )

    def _decode_whole(self) -> str:
        path = self.piece.source.path
        data = Path(path).read_bytes()
        try:
            return data.decode("utf-8")
        except UnicodeDecodeError as e:
            raise NanosetError(f"{path}: invalid UTF-8 at byte offset {e.start}; convert the file to UTF-8") from e

    def _open_lines(self) -> tuple[io.BufferedIOBase, int]:
        """The line stream of the piece (decompressed if needed) and the offset of its first line."""
        src = self.piece.source
        if src.kind == "jsonl.gz":
            return gzip.open(src.path, "rb"), 0  # type: ignore[return-value]
        if src.kind == "jsonl.zst":
            import zstandard

            raw = open(src.path, "rb")
            return io.BufferedReader(zstandard.ZstdDecompressor().stream_reader(raw, closefd=True)), 0
        f = open(src.path, "rb")
        start = self.piece.start
        if start > 0:
            f.seek(start - 1)
            if f.read(1) != b"\n":
                start += len(f.readline())  # the partial line belongs to the previous piece
        return f, start

    def _lines(self) -> Iterator[tuple[bytes, int]]:
        """(line, byte offset) for every line that starts inside the piece."""
        f, pos = self._open_lines()
        stop = self.piece.stop if self.piece.source.kind in ("jsonl", "json") else float("inf")
        with f:
            rest = b""
            while pos < stop:
                block = f.read(READ_BLOCK)
                if not block:
                    if rest:
                        yield rest, pos
                    return
                lines = (rest + block).split(b"\n")
                rest = lines.pop()
                for line in lines:
                    if pos >= stop:
                        return
                    yield line, pos
                    pos += len(line) + 1

    def _line_number(self, offset: int) -> int:
        """1-based line number of the line at ``offset``: counted only when an error needs it."""
        src = self.piece.source
        if src.kind != "jsonl" and src.kind != "json":
            f, _ = self._open_lines()
        else:
            f = open(src.path, "rb")
        count, done = 0, 0
        with f:
            while done < offset:
                block = f.read(min(READ_BLOCK, offset - done))
                if not block:
                    break
                count += block.count(b"\n")
                done += len(block)
        return count + 1

    def _jsonl_texts(self) -> Iterator[str]:
        path = self.piece.source.path
        for line, offset in self._lines():
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except UnicodeDecodeError as e:
                self._bad(f"{path}: invalid UTF-8 at byte offset {offset + e.start} (line {self._line_number(offset)})")
                continue
            except json.JSONDecodeError as e:
                self._bad(f"{path}:{self._line_number(offset)}: malformed JSON ({e.msg} at column {e.colno})")
                continue
            if not isinstance(row, dict):
                self._bad(f"{path}:{self._line_number(offset)}: expected a JSON object, got {type(row).__name__}")
                continue
            text = row.get(self.column)
            if self.column not in row:
                raise self._missing_column(f"{path}:{self._line_number(offset)}", list(row))
            if not isinstance(text, str):
                self._bad(f"{path}:{self._line_number(offset)}: column {self.column!r} is {type(text).__name__}, not text")
                continue
            yield text

    def _json_array(self) -> Iterator[list[str]]:
        path = self.piece.source.path
        try:
            rows = json.loads(Path(path).read_bytes())
        except UnicodeDecodeError as e:
            raise NanosetError(f"{path}: invalid UTF-8 at byte offset {e.start}; convert the file to UTF-8") from e
        except json.JSONDecodeError as e:
            raise NanosetError(f"{path}:{e.lineno}: malformed JSON ({e.msg} at column {e.colno})") from e

        def texts() -> Iterator[str]:
            for i, row in enumerate(rows):
                if not isinstance(row, dict):
                    self._bad(f"{path}: element {i} is {type(row).__name__}, expected a JSON object")
                    continue
                if self.column not in row:
                    raise self._missing_column(f"{path}: element {i}", list(row))
                if not isinstance(row[self.column], str):
                    self._bad(f"{path}: element {i}: column {self.column!r} is not text")
                    continue
                yield row[self.column]

        yield from self._batched(texts())

    def _checked_column(self, values: list, where: str) -> list[str]:
        out = []
        for i, v in enumerate(values):
            if isinstance(v, str):
                out.append(v)
            else:
                self._bad(f"{where}: row {i}: column {self.column!r} is {type(v).__name__}, not text")
        return out

    def _parquet(self) -> Iterator[list[str]]:
        import pyarrow.parquet as pq

        path = self.piece.source.path
        pf = pq.ParquetFile(path)
        if self.column not in pf.schema_arrow.names:
            raise self._missing_column(path, pf.schema_arrow.names)
        meta = pf.metadata
        groups, row = [], 0
        for g in range(meta.num_row_groups):
            if self.piece.start <= row < self.piece.stop:
                groups.append(g)
            row += meta.row_group(g).num_rows
        for batch in pf.iter_batches(batch_size=1024, row_groups=groups, columns=[self.column]):
            yield self._checked_column(batch.column(0).to_pylist(), path)

    def _hf(self) -> Iterator[list[str]]:
        ds = _load_hf(self.piece.source)
        where = self.piece.source.path + (f"[{self.piece.source.split}]" if self.piece.source.split else "")
        if self.column not in ds.column_names:
            raise self._missing_column(where, ds.column_names)
        ds = ds.select_columns([self.column])
        for a in range(self.piece.start, self.piece.stop, 1024):
            rows = ds[a : min(a + 1024, self.piece.stop)][self.column]
            yield self._checked_column(rows, f"{where} rows {a}+")
