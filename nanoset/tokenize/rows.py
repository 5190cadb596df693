"""Input readers: the texts of one piece of the corpus (``nanoset.tokenize.inputs`` finds the inputs and cuts
them into pieces), streamed in batches, bad rows raised as one-line errors or skipped and counted."""

from __future__ import annotations

import gzip
import json
import re
import zlib
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import TypeVar

from nanoset.errors import BadRowError, MissingColumnError, NanosetError
from nanoset.tokenize.chat_columns import holds_conversations
from nanoset.tokenize.inputs import Piece, first_byte, load_hf, one_line, parquet_file

try:  # a faster JSON decoder; rows it refuses or reads differently go through json (below)
    import orjson
except ImportError:  # pragma: no cover - a platform without its wheel: json alone gives the same rows
    orjson = None

BATCH_CHARS = 1 << 20  # texts are yielded in batches of about this many characters
READ_BLOCK = 4 << 20
ZSTD_FEED = 4 << 10  # compressed bytes per decompress call: zstd can expand 4 bytes into 128 KiB, so this
# bounds one call's output (128 MiB at worst; 50 MB seen at a ratio of 12,000) at no cost in speed
T = TypeVar("T")
_SURROGATE = re.compile("[\ud800-\udfff]")  # json.loads keeps a lone "\\ud83d" escape: not encodable text


def _decode_json_text(data: bytes, first: bool) -> str:
    """Strict UTF-8 (``json.loads`` of bytes would let UTF-8-encoded lone surrogates through, which the
    tokenizer then rejects with a TypeError); a byte order mark is allowed at the start of the file."""
    text = data.decode("utf-8")
    return text.removeprefix("\ufeff") if first else text


def _blocks(f) -> Iterator[bytes]:
    """The rest of an open binary file in blocks; closes it."""
    with f:
        while block := f.read(READ_BLOCK):
            yield block


def _zstd_blocks(path: str) -> Iterator[bytes]:
    """The decompressed data of every frame. Frame by frame, because zstandard's stream reader ends
    quietly where a truncated file ends: here a last frame left incomplete is an error."""
    import zstandard

    dctx = zstandard.ZstdDecompressor()
    frame = None
    with open(path, "rb") as f:
        while data := f.read(ZSTD_FEED):
            while data:
                if frame is None:
                    frame = dctx.decompressobj()
                if out := frame.decompress(data):
                    yield out
                data = b""
                if frame.eof:
                    data, frame = frame.unused_data, None
    if frame is not None:
        raise EOFError("the file ends inside a frame")


def _read_or_fail(items: Iterator[T], path: str, fmt: str, errors: tuple) -> Iterator[T]:
    """``items`` read from a file, with a corrupt or truncated file (one of ``errors``) reported as one
    error naming it (a bare EOFError would even read as 'aborted' on the command line)."""
    try:
        yield from items
    except errors as e:
        raise NanosetError(f"{path}: not a valid {fmt} file, or truncated ({one_line(e)}); "
                           f"download or write it again") from None


def iter_lines(blocks: Iterable[bytes]) -> Iterator[bytes]:
    """Split a stream of blocks into lines (without their ``\\n``; a last line without one too).

    Each block is split once and a line spanning many blocks is joined once at its end, so reading is
    linear in the input and a line costs about twice its own size in memory, however long it is."""
    pending: list[bytes] = []  # the start of a line that has not ended yet
    for block in blocks:
        parts = block.split(b"\n")
        if len(parts) == 1:
            pending.append(block)
            continue
        if pending:
            pending.append(parts[0])
            parts[0] = b"".join(pending)
            pending = []
        last = parts.pop()
        yield from parts
        if last:
            pending.append(last)
    if pending:
        yield b"".join(pending)


class TextReader:
    """Yields the texts of one piece in batches, raising (or counting, with ``skip_bad``) bad rows.

    The row-level hooks (``_value``, ``_table_columns``, ``_table_values``, ``_weight``) are what a reader of
    other values overrides (``nanoset.tokenize.chat.ChatReader``: conversations); the file handling stays here."""

    def __init__(self, piece: Piece, text_column: str, skip_bad: bool,
                 on_skip: Callable[[str], None] | None = None) -> None:
        self.piece = piece
        self.column = text_column
        self.skip_bad = skip_bad
        self.on_skip = on_skip  # told each skipped row's "file:line: why" (the task's list of skipped rows)
        self.skipped = 0
        self._start = 0  # byte offset of the piece's first line
        self._lines_before: int | None = None  # lines of the file before it: counted when an error needs it

    def batches(self) -> Iterator[list[str]]:
        kind = self.piece.source.kind
        if kind == "txt":
            yield [self._decode_whole()]
        elif kind == "parquet":
            yield from self._parquet()
        elif kind == "hf":
            yield from self._hf()
        elif kind == "json" and first_byte(self.piece.source.path) == b"[":
            yield from self._json_array()
        else:
            yield from self._batched(self._jsonl_texts())

    # --- helpers -------------------------------------------------------------------------------

    def _bad(self, message: Callable[[], str]) -> None:
        """Raise the error ``message()`` names, or count it (and hand the message to ``on_skip``)."""
        if not self.skip_bad:
            raise BadRowError(message())
        self.skipped += 1
        if self.on_skip is not None:
            self.on_skip(message())

    @staticmethod
    def _weight(value: str) -> int:
        """The size of a value in characters, for batching."""
        return len(value)

    def _batched(self, texts: Iterator[str]) -> Iterator[list[str]]:
        batch: list[str] = []
        chars = 0
        for t in texts:
            batch.append(t)
            chars += self._weight(t)
            if chars >= BATCH_CHARS:
                yield batch
                batch, chars = [], 0
        if batch:
            yield batch

    def _missing_column(self, where: str, columns: list[str]) -> NanosetError:
        return MissingColumnError(where, self.column, columns, conversations=holds_conversations(columns))

    def _surrogate(self, text: str) -> str | None:
        """The first lone UTF-16 surrogate in ``text`` as an escape (``\\ud83d``), if any."""
        m = _SURROGATE.search(text)
        return f"\\u{ord(m.group()):04x}" if m else None

    def _decode_whole(self) -> str:
        path = self.piece.source.path
        data = Path(path).read_bytes()
        try:
            return data.decode("utf-8")
        except UnicodeDecodeError as e:
            raise NanosetError(f"{path}: invalid UTF-8 at byte offset {e.start}; convert the file to UTF-8") from e

    def _open_blocks(self) -> tuple[Iterator[bytes], int]:
        """The blocks of the piece (decompressed if needed) and the offset of its first line."""
        src = self.piece.source
        if src.kind == "jsonl.gz":
            return _read_or_fail(_blocks(gzip.open(src.path, "rb")), src.path, "gzip",
                                 (gzip.BadGzipFile, EOFError, zlib.error)), 0
        if src.kind == "jsonl.zst":
            import zstandard

            return _read_or_fail(_zstd_blocks(src.path), src.path, "zstd", (EOFError, zstandard.ZstdError)), 0
        f = open(src.path, "rb")
        start = self.piece.start
        if start > 0:
            f.seek(start - 1)
            if f.read(1) != b"\n":
                start += len(f.readline())  # the partial line belongs to the previous piece
        return _blocks(f), start

    def _lines(self) -> Iterator[tuple[bytes, int]]:
        """(line, byte offset) for every line that starts inside the piece."""
        blocks, pos = self._open_blocks()
        self._start = pos
        stop = self.piece.stop if self.piece.source.kind in ("jsonl", "json") else float("inf")
        for line in iter_lines(blocks):
            if pos >= stop:
                return
            yield line, pos
            pos += len(line) + 1

    def _line_number(self, index: int) -> int:
        """1-based file line number of the piece's line ``index``; the lines before the piece (a plain
        file cut into ranges) are counted once per reader, the first time an error names a line."""
        if self._lines_before is None:
            self._lines_before = 0
            if self._start > 0:
                with open(self.piece.source.path, "rb") as f:
                    for block in iter(lambda: f.read(min(READ_BLOCK, self._start - f.tell())), b""):
                        self._lines_before += block.count(b"\n")
        return self._lines_before + index + 1

    def _exact(self, row: object) -> bool:
        """Whether ``row``, as orjson decoded it, is what json would make of it in every value read: orjson
        turns integers beyond 64 bits into floats (which json keeps as int), so only a text string is sure."""
        return type(row) is dict and type(row.get(self.column)) is str

    def _value(self, row: dict, where: Callable[[], str], escapes: bool) -> str | None:
        """The value of one JSON row, or None for a bad row (counted, or raised without --skip-bad-lines);
        ``escapes``: the row's JSON had ``\\u`` escapes, so a lone surrogate is possible."""
        column = self.column
        if column not in row:
            raise self._missing_column(where(), list(row))
        text = row[column]
        if not isinstance(text, str):
            self._bad(lambda: f"{where()}: column {column!r} is {type(text).__name__}, not text")
            return None
        if escapes and (bad := self._surrogate(text)):
            self._bad(lambda: f"{where()}: column {column!r} holds a lone surrogate {bad}, which is not valid Unicode")
            return None
        return text

    def _jsonl_texts(self) -> Iterator[str]:
        """The values of the piece's JSON lines: decoded by orjson where it gives json's strings (it refuses
        lone surrogates, NaN, a byte order mark, invalid UTF-8 and bad JSON, as strict json does, or more),
        else by json, whose errors name the line and column."""
        path = self.piece.source.path
        fast = orjson.loads if orjson is not None else None
        for n, (line, offset) in enumerate(self._lines()):
            if not line or line.isspace():
                continue
            if fast is not None:
                try:
                    row = fast(line)
                except ValueError:  # orjson.JSONDecodeError
                    row = None
                if self._exact(row):  # no lone surrogate either: orjson refuses them
                    value = self._value(row, lambda: f"{path}:{self._line_number(n)}", False)
                    if value is not None:
                        yield value
                    continue
            try:
                row = json.loads(_decode_json_text(line, offset == 0))
            except UnicodeDecodeError as e:
                self._bad(lambda e=e: f"{path}: invalid UTF-8 at byte offset {offset + e.start} "
                                  f"(line {self._line_number(n)})")
                continue
            except json.JSONDecodeError as e:
                self._bad(lambda e=e: f"{path}:{self._line_number(n)}: malformed JSON ({e.msg} at column {e.colno})")
                continue
            except RecursionError:
                self._bad(lambda: f"{path}:{self._line_number(n)}: malformed JSON (nested too deeply to read)")
                continue
            if not isinstance(row, dict):
                self._bad(lambda: f"{path}:{self._line_number(n)}: expected a JSON object, got {type(row).__name__}")
                continue
            value = self._value(row, lambda: f"{path}:{self._line_number(n)}", b"\\u" in line)
            if value is not None:
                yield value

    def _json_array(self) -> Iterator[list[str]]:
        path = self.piece.source.path
        data = Path(path).read_bytes()
        escapes = b"\\u" in data
        try:
            rows = json.loads(_decode_json_text(data, True))
        except UnicodeDecodeError as e:
            raise NanosetError(f"{path}: invalid UTF-8 at byte offset {e.start}; convert the file to UTF-8") from e
        except json.JSONDecodeError as e:
            raise NanosetError(f"{path}:{e.lineno}: malformed JSON ({e.msg} at column {e.colno})") from e
        except RecursionError:
            raise NanosetError(f"{path}: malformed JSON (nested too deeply to read)") from None
        del data

        def texts() -> Iterator[str]:
            for i, row in enumerate(rows):
                if not isinstance(row, dict):
                    self._bad(lambda: f"{path}: element {i} is {type(row).__name__}, expected a JSON object")
                    continue
                value = self._value(row, lambda: f"{path}: element {i}", escapes)
                if value is not None:
                    yield value

        yield from self._batched(texts())

    def _checked_column(self, column, first_row: int, where: str) -> list[str]:
        """The texts of an Arrow column whose first value is row ``first_row`` of ``where`` (0-based)."""
        try:
            values = column.to_pylist()
        except UnicodeDecodeError:  # a string column holding invalid UTF-8: find the rows, value by value
            values = []
            for i in range(len(column)):
                try:
                    values.append(column[i].as_py())
                except UnicodeDecodeError as e:
                    values.append(e)
        out = []
        for i, v in enumerate(values):
            if isinstance(v, str):
                out.append(v)
            elif isinstance(v, UnicodeDecodeError):
                self._bad(lambda: f"{where}: row index {first_row + i}: column {self.column!r} holds invalid UTF-8")
            else:
                self._bad(lambda: f"{where}: row index {first_row + i}: column {self.column!r} is "
                                  f"{type(v).__name__}, not text")
        return out

    def _table_columns(self, names: list[str], where: str) -> list[str]:
        """The columns to read from a table with columns ``names`` (a parquet file, a saved dataset)."""
        if self.column not in names:
            raise self._missing_column(where, names)
        return [self.column]

    def _table_values(self, table, first_row: int, where: str) -> list[str]:
        """The values of an Arrow table or record batch of the ``_table_columns``, bad rows left out."""
        return self._checked_column(table.column(0), first_row, where)

    def _parquet(self) -> Iterator[list[str]]:
        import pyarrow as pa

        path = self.piece.source.path
        pf = parquet_file(path)
        columns = self._table_columns(pf.schema_arrow.names, path)
        meta = pf.metadata
        groups, row, first = [], 0, None
        for g in range(meta.num_row_groups):
            if self.piece.start <= row < self.piece.stop:
                groups.append(g)
                first = row if first is None else first
            row += meta.row_group(g).num_rows
        row = first or 0
        batches = pf.iter_batches(batch_size=1024, row_groups=groups, columns=columns)
        for batch in _read_or_fail(batches, path, "parquet", (pa.ArrowException, OSError)):
            yield self._table_values(batch, row, path)
            row += batch.num_rows

    def _hf(self) -> Iterator[list[str]]:
        ds = load_hf(self.piece.source)
        where = self.piece.source.path + (f"[{self.piece.source.split}]" if self.piece.source.split else "")
        columns = self._table_columns(ds.column_names, where)
        ds = ds.select_columns(columns).with_format("arrow")  # Arrow values: bad UTF-8 is found per row
        for a in range(self.piece.start, self.piece.stop, 1024):
            yield self._table_values(ds[a : min(a + 1024, self.piece.stop)], a, where)
