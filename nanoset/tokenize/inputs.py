"""Input discovery: which files make the corpus, in which order, and how they are cut into pieces.

Order is part of the output's identity: inputs in the order given, each folder walked
recursively in sorted order. Large splittable files are cut into byte or row ranges
(``Piece``) so that tasks are of similar size whatever the number of workers.
"""

from __future__ import annotations

import codecs
import glob
import json
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from nanoset.errors import NanosetError

KINDS = {".jsonl": "jsonl", ".jsonl.gz": "jsonl.gz", ".jsonl.zst": "jsonl.zst", ".json": "json",
         ".parquet": "parquet", ".txt": "txt"}


@dataclass(frozen=True)
class Source:
    """One input: a file, or one split of a folder saved with ``datasets.save_to_disk``."""

    path: str
    kind: str
    bytes: int
    mtime_ns: int
    split: str | None = None
    origin: str | None = None  # the URL ``path`` was copied from (``remote_inputs``): what the output records

    @property
    def recorded(self) -> str:
        """Where the output says the input came from: its URL, or its path."""
        return self.origin or self.path

    def describe(self) -> dict:
        d = {"path": self.recorded, "kind": self.kind, "bytes": self.bytes}
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
        return {"path": self.source.recorded, "split": self.source.split, "start": self.start, "stop": self.stop}


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
        try:
            splits = json.loads((folder / "dataset_dict.json").read_text())["splits"]
        except (ValueError, KeyError, TypeError) as e:
            raise NanosetError(f"{folder / 'dataset_dict.json'}: malformed ({type(e).__name__}: {one_line(e)}); "
                               f"save the dataset again with save_to_disk") from None
        return [Source(str(folder), "hf", size, mtime, split) for split in splits]
    return [Source(str(folder), "hf", size, mtime)]


def _walk(folder: Path, seen: set[str]) -> Iterator[Source]:
    real = os.path.realpath(folder)
    if real in seen:  # a symbolic link back up the tree: each folder is walked once (a loop ended in ELOOP)
        return
    seen.add(real)
    if _hf_saved(folder):
        yield from _hf_sources(folder)
        return
    for entry in sorted(os.scandir(folder), key=lambda e: e.name):
        if entry.name.startswith("."):
            continue
        if entry.is_dir():
            yield from _walk(Path(entry.path), seen)
        elif kind_of(entry.name):
            st = entry.stat()
            yield Source(entry.path, kind_of(entry.name), st.st_size, st.st_mtime_ns)


def _expand(path: Path) -> list[Source]:
    if path.is_dir():
        return list(_walk(path, set()))
    st = path.stat()
    return [Source(str(path), kind_of(str(path)), st.st_size, st.st_mtime_ns)]


def discover(inputs: list[str], exclude: str | Path | None = None) -> list[Source]:
    """Expand files, folders and globs into the ordered list of sources; unknown files are errors.

    A source reached twice (the same file under two spellings, or inside two given folders) is read once,
    at its first place; the lookup is a dict so that 100k files cost a 100k steps. Files directly in the
    folder ``exclude`` (the output, where tokenize writes) are left out: an output folder inside an input
    folder must not read its own ``nanoset.json`` as input when the job is run again."""
    sources: dict[tuple[str, str | None], Source] = {}
    excluded = os.path.realpath(exclude) if exclude is not None else None
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
        kept = 0
        for s in found:
            real = os.path.realpath(s.path)
            if os.path.dirname(real) != excluded:
                sources.setdefault((real, s.split), s)
                kept += 1
        if not kept:
            raise NanosetError(f"{spec}: its input files are all in the output folder {exclude}, where "
                               f"tokenize writes; choose another output folder")
    return list(sources.values())


def first_byte(path: str) -> bytes:
    """The first byte after a UTF-8 byte order mark and white space (``[`` for a JSON array)."""
    with open(path, "rb") as f:
        return f.read(4096).removeprefix(codecs.BOM_UTF8).lstrip()[:1]


def one_line(error: BaseException) -> str:
    return " ".join(str(error).split())


def _cuts(size: int, target: int, room: int) -> list[int]:
    """Offsets cutting ``[0, size)`` into a first piece of ``room``, then pieces of ``target`` (the rest last)."""
    cuts = [0]
    at = room
    while at < size:
        cuts.append(at)
        at += target
    return cuts + [size]


def split_source(source: Source, target_bytes: int, room: int | None = None) -> list[Piece]:
    """Cut a source into pieces that fill tasks of ``target_bytes``: the first one the ``room`` left in the
    task being filled, the next ones whole tasks. Compressed files and JSON arrays stay whole; parquet
    files are cut at row groups (weighed in file bytes, as the task size is)."""
    room = target_bytes if room is None else room
    if source.kind in ("jsonl", "json") and not (source.kind == "json" and first_byte(source.path) == b"["):
        cuts = _cuts(source.bytes, target_bytes, room)
        return [Piece(source, a, b, b - a) for a, b in zip(cuts, cuts[1:])]
    if source.kind == "parquet":
        meta = parquet_file(source.path).metadata
        groups = [meta.row_group(g) for g in range(meta.num_row_groups)]
        unpacked = max(1, sum(rg.total_byte_size for rg in groups))
        pieces, row, start, weight, filled = [], 0, 0, 0, target_bytes - room
        for g, rg in enumerate(groups):
            row += rg.num_rows
            w = rg.total_byte_size * source.bytes // unpacked
            weight, filled = weight + w, filled + w
            if filled >= target_bytes or g == len(groups) - 1:
                pieces.append(Piece(source, start, row, weight))
                start, weight, filled = row, 0, 0
        return pieces
    if source.kind == "hf":
        rows = len(load_hf(source))
        cuts = _cuts(source.bytes, target_bytes, room)
        bounds = [c * rows // max(1, source.bytes) for c in cuts[:-1]] + [rows]
        return [Piece(source, a, b, y - x) for a, b, x, y in zip(bounds, bounds[1:], cuts, cuts[1:])]
    return [Piece(source, 0, source.bytes, source.bytes)]


def parquet_file(path: str):  # -> pyarrow.parquet.ParquetFile
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        return pq.ParquetFile(path)
    except (pa.ArrowException, OSError) as e:
        raise NanosetError(f"{path}: not a valid parquet file, or truncated ({one_line(e)}); "
                           f"download or write it again") from None


def load_hf(source: Source):
    import datasets
    import pyarrow as pa

    try:
        ds = datasets.load_from_disk(source.path)
        return ds[source.split] if source.split is not None else ds
    except (pa.ArrowException, ValueError, KeyError) as e:  # damaged files (OSError is one line already)
        raise NanosetError(f"{source.path}: cannot load the saved dataset ({type(e).__name__}: {one_line(e)}); "
                           f"save it again with save_to_disk") from None
