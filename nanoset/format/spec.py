"""The Nanoset on-disk format, version 1: file names, dtypes, metadata lines, the manifest.

A dataset is a folder. Each shard ``NAME`` is three files in the layout datatrove writes and Nanotron
reads (``NAME.ds``, ``NAME.ds.index``, ``NAME.ds.metadata``; the metadata's third line is our own
short count, not datatrove's, and no reader uses it); the folder also
holds ``nanoset.json``, written last, which makes it a complete Nanoset dataset, and beside it
``nanoset-shards.bin``, its shards as a binary table (``nanoset.format.shardtable``), a file of ours
that only speeds up opening.
"""

from __future__ import annotations

import hashlib
import io
import json
import re
from array import array
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path, PurePosixPath
from typing import IO, Any

import numpy as np

from nanoset import storage
from nanoset.errors import NanosetError
from nanoset.format.jsonstream import read_object

FORMAT_NAME = "nanoset"
FORMAT_VERSION = 1
MANIFEST_NAME = "nanoset.json"
SHARD_TABLE_NAME = "nanoset-shards.bin"  # the manifest's shards as columns, read instead of the manifest's JSON
TOKENS_SUFFIX = ".ds"
INDEX_SUFFIX = ".ds.index"
METADATA_SUFFIX = ".ds.metadata"
WORK_DIR = ".nanoset-work"  # an unfinished tokenize output: its plan and the markers of finished tasks
WORK_PLAN = "plan.json"
JOB_LOCK = WORK_DIR + ".lock"  # beside the work folder: the runs writing the folder lock it (tokenize.joblock)
SKIPPED_NAME = "nanoset-skipped.txt"  # every row --skip-bad-lines skipped, one "file:line: why" a line
SKIPPED_EXAMPLES = 5  # the first skipped rows the manifest keeps (inspect and tokenize show them)
TASK_MARKER_GLOB = "task-*.json"
LOSS_SUFFIX = ".ds.loss"  # one byte per token, 1 = trained on (datatrove's loss-mask side file)
LOSS_DTYPE = np.dtype("u1")
INDEX_DTYPE = np.dtype("<u8")
UINT16_MAX_VOCAB = 65536


def dtype_for_vocab(vocab_size: int) -> np.dtype:
    """uint16 when every id fits (vocab ≤ 65536), else uint32; always little-endian."""
    return np.dtype("<u2") if vocab_size <= UINT16_MAX_VOCAB else np.dtype("<u4")


TOKEN_DTYPES = {"uint16": np.dtype("<u2"), "uint32": np.dtype("<u4")}  # a manifest's dtype names


def dtype_name(dtype: np.dtype) -> str:
    return {d.itemsize: name for name, d in TOKEN_DTYPES.items()}[np.dtype(dtype).itemsize]


def dtype_from_name(name: str) -> np.dtype:
    if name not in TOKEN_DTYPES:
        raise NanosetError(f"unknown token dtype {name!r} (expected uint16 or uint32)")
    return TOKEN_DTYPES[name]


def human_count(n: int) -> str:
    """1234567 -> '1.23M': the third line of a metadata file, for people (datatrove writes humanize's
    '1.23 MT' there; no reader uses the line)."""
    for unit, scale in (("T", 10**12), ("B", 10**9), ("M", 10**6), ("K", 10**3)):
        if n >= scale:
            return f"{n / scale:.2f}{unit}"
    return str(n)


def metadata_text(tokenizer_name: str, token_size: int, num_tokens: int) -> str:
    return f"{tokenizer_name}|{token_size}\n{num_tokens}\n{human_count(num_tokens)}"


def parse_metadata(path: Path) -> tuple[str, int, int]:
    """Read a ``.ds.metadata`` file: (tokenizer name, token size in bytes, token count).

    Older datatrove versions write the tokenizer name alone on the first line: 2-byte tokens.
    """
    try:
        lines = storage.read_text(path).splitlines()
        name, _, size = lines[0].rpartition("|") if "|" in lines[0] else (lines[0], "", "2")
        return name, int(size), int(lines[1])
    except (IndexError, ValueError, UnicodeDecodeError) as e:
        raise NanosetError(f"{path}: malformed metadata file ({e}); expected 'TOKENIZER|TOKEN_SIZE', "
                           f"token count") from e


@dataclass
class TokenizerInfo:
    """What a reader needs to know of the tokenizer that produced the ids."""

    name: str
    vocab_size: int | None  # None for a datatrove folder whose tokenizer is not at hand
    eos_id: int | None = None
    eos_token: str | None = None
    bos_id: int | None = None
    sha256: str | None = None
    path: str | None = None  # where the tokenizer was found when the dataset was made (for decoding)

    def same_as(self, other: TokenizerInfo) -> bool:
        """One tokenizer? By sha256 when both know it (Nanoset manifests), else by name: datatrove
        metadata holds only the name or path the tokenizer was given by."""
        if self.sha256 and other.sha256:
            return self.sha256 == other.sha256
        return comparable_name(self.name) == comparable_name(other.name)

    def describe(self) -> str:
        return f"{self.name!r}" + (f" sha256 {self.sha256[:12]}" if self.sha256 else "")

    def matches_file(self, path: str | Path) -> bool:
        """Whether the tokenizer file at ``path`` is still this one: its sha256 is the recorded one (True when
        none is recorded, as for a datatrove folder: nothing to compare)."""
        return not self.sha256 or hashlib.sha256(Path(path).read_bytes()).hexdigest() == self.sha256


def comparable_name(name: str) -> str:
    """A tokenizer name as ``nanoset tokenize`` records it (a hub name as given, a local tokenizer by its
    folder's name, see ``nanoset.tokenize.tokenizer.canonical_name``), also for a path that datatrove recorded."""
    if not (name.startswith(("/", "./", "../", "~")) or name.endswith((".json", "/"))):
        return name  # a hub name such as 'gpt2' or 'meta-llama/Llama-3.1-8B'
    p = PurePosixPath(name.rstrip("/"))
    if p.name == "tokenizer.json":
        return p.parent.name
    return p.stem if p.suffix == ".json" else p.name


@dataclass
class ShardInfo:
    """One shard as the manifest records it; sources say which input rows it came from.

    ``max_token_id`` (-1 for a shard without tokens) lets training check ids against the model's
    vocabulary without reading the data; manifests written before it existed read as None.
    ``loss_tokens`` (shards with a ``.ds.loss`` file only) counts the tokens trained on.
    """

    name: str
    num_tokens: int
    num_documents: int
    sha256: dict[str, str] = field(default_factory=dict)
    sources: list[dict[str, Any]] = field(default_factory=list)
    max_token_id: int | None = None
    loss_tokens: int | None = None

    @staticmethod
    def from_json(d: dict[str, Any]) -> ShardInfo:
        return ShardInfo(**d)

    def to_json(self) -> dict[str, Any]:
        """The record; ``loss_tokens`` only for a shard with a loss mask, so plain manifests keep their bytes."""
        d = asdict(self)
        if d["loss_tokens"] is None:
            del d["loss_tokens"]
        return d


# How ``nanoset tokenize --chat`` made a dataset's ids and loss masks (the manifest's ``loss_mask_rule``; chat
# manifests written before it was recorded were made with rule 1).
LOSS_MASK_RULES = {
    1: "a token is trained when its first character lies in an assistant span",
    2: "a token is trained when any of its characters lies in an assistant span (transformers ≥ 5), with the "
       "special tokens declared beside tokenizer.json registered as transformers registers them",
}
UNRECORDED = -2  # a ShardTable column's value for a shard whose manifest entry does not record it


class FingerprintHasher:
    """The content fingerprint of a folder with a manifest, fed shards in batches: a short sha256 of the JSON
    list of (name, tokens, documents, sha256 of the tokens and of the index), computed both without and with
    the loss mask's sha256 last (``NanosetReader.fingerprint`` says which applies). Each batch is one
    ``json.dumps`` (C speed), its brackets off: the same text as the whole list's."""

    def __init__(self) -> None:
        self._hashes = (hashlib.sha256(b"["), hashlib.sha256(b"["))
        self._count = 0

    def add(self, rows: list[list[Any]]) -> None:
        """``rows``: [name, tokens, documents, ds sha256, index sha256, loss sha256] per shard."""
        if not rows:
            return
        sep = b", " if self._count else b""
        self._hashes[0].update(sep + json.dumps([r[:5] for r in rows], sort_keys=True)[1:-1].encode())
        self._hashes[1].update(sep + json.dumps(rows, sort_keys=True)[1:-1].encode())
        self._count += len(rows)

    def digests(self) -> tuple[str, str]:
        """(without loss masks, with them)."""
        out = []
        for h in self._hashes:
            h = h.copy()
            h.update(b"]")
            out.append(h.hexdigest()[:16])
        return out[0], out[1]


@dataclass(frozen=True)
class ShardTable:
    """The shards of a manifest as columns: all that opening and reading a dataset need, for any number of
    shards (records and paths cost ~5 KB a shard; 100,000 shards are a few MB here). ``max_token_id`` and
    ``loss_tokens`` hold ``UNRECORDED`` where the manifest has no value."""

    names: list[str]
    num_tokens: np.ndarray  # int64
    num_documents: np.ndarray
    max_token_id: np.ndarray
    loss_tokens: np.ndarray
    fingerprints: tuple[str, str]  # FingerprintHasher.digests()

    def __len__(self) -> int:
        return len(self.names)

    @staticmethod
    def of(shards: Sequence[ShardInfo]) -> ShardTable:
        builder = _TableBuilder()
        builder.add([(s.name, s.num_tokens, s.num_documents, s.max_token_id, s.loss_tokens, s.sha256) for s in shards])
        return builder.table()


class _TableBuilder:
    def __init__(self) -> None:
        self.names: list[str] = []
        self.columns = [array("q") for _ in range(4)]
        self.hasher = FingerprintHasher()

    def add(self, shards: list[tuple[str, int, int, int | None, int | None, dict[str, Any]]]) -> None:
        """(name, tokens, documents, largest id, loss tokens, sha256 dict) per shard."""
        self.names.extend(s[0] for s in shards)
        for k, column in enumerate(self.columns, 1):
            column.extend(UNRECORDED if s[k] is None else s[k] for s in shards)
        self.hasher.add([[s[0], s[1], s[2], s[5].get("ds"), s[5].get("index"), s[5].get("loss")] for s in shards])

    def table(self) -> ShardTable:
        cols = [np.frombuffer(c, dtype=np.int64) if len(c) else np.empty(0, np.int64) for c in self.columns]
        return ShardTable(self.names, *cols, self.hasher.digests())


_SHARD_KEYS = frozenset(f.name for f in fields(ShardInfo))


class ManifestShards(Sequence[ShardInfo]):
    """The shard records of a loaded manifest: its ShardTable at once; the full records (checksums,
    sources: ``verify`` and ``convert`` need them) are read from the file on first use. ``table_file``: the
    shard table file the columns were read from (None: read from the manifest itself)."""

    def __init__(self, path: Path, table: ShardTable, records: list[ShardInfo] | None = None,
                 table_file: Path | None = None) -> None:
        self.path = path
        self.table = table
        self._records = records
        self.table_file = table_file
        self._whole: Manifest | None = None

    def __len__(self) -> int:
        return len(self.table)

    def __getitem__(self, i):  # type: ignore[override]
        if self._records is None:
            records = list(self.whole().shards)
            if [s.name for s in records] != self.table.names:
                raise NanosetError(f"{self.path}: changed while in use; rerun")
            self._records = records
        return self._records[i]

    def whole(self) -> Manifest:
        """The manifest read again the plain way (one ``json.loads``, every record), once."""
        if self._whole is None:
            self._whole = read_whole_manifest(self.path)
        return self._whole


@dataclass
class Manifest:
    """``nanoset.json``: the dataset's table of contents; its presence means 'complete'."""

    tokenizer: TokenizerInfo
    dtype: str
    shards: Sequence[ShardInfo]
    build: dict[str, Any] = field(default_factory=dict)
    skipped_lines: int = 0
    skipped_examples: list[str] = field(default_factory=list)  # the first rows skipped ("file:line: why")
    loss_masks: bool = False  # every shard has a NAME.ds.loss
    chat_template_sha256: str | None = None  # the chat template that rendered the conversations
    loss_mask_rule: int | None = None  # LOSS_MASK_RULES: how tokenize --chat made the masks (None: not by it)
    chat_template_file: str | None = None  # its file, when it was not the tokenizer's own (--chat-template)
    encoders: list[str] | None = None  # the backends that encoded the shards ("fastokens 0.3.5"): information
    # only, the bytes do not depend on it
    format: str = FORMAT_NAME
    version: int = FORMAT_VERSION

    @property
    def table(self) -> ShardTable:
        """The shards as columns (read with the manifest, or computed from the records given)."""
        return self.shards.table if isinstance(self.shards, ManifestShards) else ShardTable.of(self.shards)

    def _column(self, name: str) -> np.ndarray:
        if isinstance(self.shards, ManifestShards):
            return getattr(self.shards.table, name)
        values = (getattr(s, name) for s in self.shards)
        return np.fromiter((UNRECORDED if v is None else v for v in values), np.int64, len(self.shards))

    @property
    def num_tokens(self) -> int:
        return int(self._column("num_tokens").sum())

    @property
    def num_documents(self) -> int:
        return int(self._column("num_documents").sum())

    @property
    def max_token_id(self) -> int | None:
        """The largest id of the dataset, None when a shard's is not recorded (an older manifest)."""
        ids = self._column("max_token_id")
        return None if (ids == UNRECORDED).any() else int(ids.max(initial=-1))

    def to_json(self) -> str:
        d = {**self.head(), "shards": [s.to_json() for s in self.shards]}
        return json.dumps(d, indent=1, sort_keys=True) + "\n"

    def head(self) -> dict[str, Any]:
        """The manifest's JSON object less its shard records (what the shard table keeps of it)."""
        d = {
            "format": self.format,
            "version": self.version,
            "dtype": self.dtype,
            "num_tokens": self.num_tokens,
            "num_documents": self.num_documents,
            "max_token_id": self.max_token_id,
            "tokenizer": asdict(self.tokenizer),
            "build": self.build,
            "skipped_lines": self.skipped_lines,
        }
        if self.skipped_examples:  # only where rows were skipped: other manifests keep their bytes
            d["skipped_examples"] = list(self.skipped_examples)
        if self.loss_masks:  # only in chat datasets: plain manifests keep their bytes
            d["loss_masks"] = True
            d["chat_template_sha256"] = self.chat_template_sha256
            if self.loss_mask_rule is not None:
                d["loss_mask_rule"] = self.loss_mask_rule
            if self.chat_template_file is not None:
                d["chat_template_file"] = self.chat_template_file
        if self.encoders is not None:
            d["encoders"] = self.encoders
        return d


def read_manifest(path: Path, f: IO[bytes]) -> Manifest:
    """The manifest ``path``, read from ``f`` (the file open on it, at its start): streamed, or where it is not a
    well-formed manifest, read again the plain way, whose checks name the problem."""
    text = io.TextIOWrapper(f, encoding="utf-8")
    try:
        return _load_streamed(path, text)
    except (OSError, ValueError, KeyError, TypeError):
        pass
    finally:
        text.detach()  # ``f`` stays open: the caller's
    f.seek(0)
    return read_whole_manifest(path, f)


def _load_streamed(path: Path, text: IO[str]) -> Manifest:
    """The manifest with its shard records turned into columns as they are read (bounded memory);
    ValueError/KeyError/TypeError for anything unusual (the plain read then says what)."""
    builder = _TableBuilder()

    def shards(batch: list[Any]) -> None:
        rows = [(d["name"], d["num_tokens"], d["num_documents"], d.get("max_token_id"), d.get("loss_tokens"),
                 d.get("sha256", {})) for d in batch]
        if not (all(type(d) is dict and d.keys() <= _SHARD_KEYS for d in batch)
                and all(type(r[0]) is str and "\0" not in r[0]
                        and type(r[1]) is int and type(r[2]) is int and r[1] >= 0 and r[2] >= 0
                        and (r[3] is None or type(r[3]) is int and r[3] >= -1)
                        and (r[4] is None or type(r[4]) is int and r[4] >= 0) and type(r[5]) is dict
                        for r in rows)):
            raise ValueError("not a shard record")
        builder.add(rows)

    d = read_object(text, "shards", shards)
    if d.get("format") != FORMAT_NAME or d.get("version") != FORMAT_VERSION:
        raise ValueError("another format or version")
    return manifest_from_json(d, ManifestShards(path, builder.table()))


def manifest_from_json(d: dict[str, Any], shards: ManifestShards) -> Manifest:
    """The manifest of the JSON object ``d`` (its shards read already, as ``shards``)."""
    return Manifest(
        tokenizer=TokenizerInfo(**d["tokenizer"]),
        dtype=d["dtype"],
        shards=shards,
        build=d.get("build", {}),
        skipped_lines=d.get("skipped_lines", 0),
        skipped_examples=d.get("skipped_examples", []),
        loss_masks=bool(d.get("loss_masks", False)),
        chat_template_sha256=d.get("chat_template_sha256"),
        loss_mask_rule=_loss_mask_rule(d),
        chat_template_file=d.get("chat_template_file"),
        encoders=d.get("encoders"),
    )


def _loss_mask_rule(d: dict[str, Any]) -> int | None:
    """The recorded rule; a chat dataset made before rules were recorded was made with rule 1."""
    if "loss_mask_rule" in d or not d.get("loss_masks"):
        return d.get("loss_mask_rule")
    build = d.get("build")
    return 1 if isinstance(build, dict) and "chat" in build else None


def read_whole_manifest(path: Path, f: IO[bytes] | None = None) -> Manifest:
    """The manifest read in one ``json.loads`` (from ``f``, the file open on it, if given), every record built;
    each problem in one line."""
    try:
        d = json.loads((f.read() if f is not None else storage.read_bytes(path)).decode("utf-8"))
    except (OSError, ValueError) as e:  # ValueError: not JSON, or not UTF-8
        raise NanosetError(f"{path}: cannot read the manifest ({e}); re-run `nanoset tokenize`") from e
    if not isinstance(d, dict):
        raise NanosetError(f"{path}: malformed manifest (a JSON {type(d).__name__}, not an object); "
                           f"re-run `nanoset tokenize`")
    if d.get("format") != FORMAT_NAME or d.get("version") != FORMAT_VERSION:
        raise NanosetError(
            f"{path}: format {d.get('format')!r} version {d.get('version')!r} is not supported "
            f"(this nanoset reads {FORMAT_NAME} version {FORMAT_VERSION})"
        )
    try:
        records = [ShardInfo.from_json(s) for s in d["shards"]]
        for s in records:
            if not (isinstance(s.name, str) and "\0" not in s.name and _count(s.num_tokens)
                    and _count(s.num_documents)):
                raise TypeError(f"shard {s.name!r}: name, num_tokens or num_documents is not a name or a count")
        return manifest_from_json(d, ManifestShards(path, ShardTable.of(records), records))
    except (KeyError, TypeError, AttributeError, OverflowError) as e:  # a key missing, unknown or of the wrong
        # type (edited by hand?)
        raise NanosetError(f"{path}: malformed manifest ({type(e).__name__}: {e}); "
                           f"re-run `nanoset tokenize`") from None


def _count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def shard_files(name: str, loss: bool = False) -> dict[str, str]:
    """The three file names of shard ``name``, keyed by role; with ``loss``, its loss mask too."""
    files = {"ds": name + TOKENS_SUFFIX, "index": name + INDEX_SUFFIX, "metadata": name + METADATA_SUFFIX}
    if loss:
        files["loss"] = name + LOSS_SUFFIX
    return files


def is_dataset_entry(path: Path) -> bool:
    """Whether ``path``, inside a dataset folder, is what tokenize or convert writes there (a file of its
    dataset, or the work folder of an unfinished job): what ``--overwrite`` may replace."""
    if path.is_dir() and not path.is_symlink():
        return path.name == WORK_DIR or path.name.startswith(WORK_DIR + ".tmp-")
    return is_dataset_file(path.name) or path.name == JOB_LOCK


def is_dataset_file(name: str) -> bool:
    """A shard file or the manifest, or the temporary name of one (``.NAME.partial-PID``,
    ``.NAME.tmp-PID-HEX``): matched by suffix, never by substring, so that ``--overwrite`` spares ``notes.dsv``
    or ``a.ds.txt``."""
    if name.startswith("."):
        name = re.sub(r"\.(partial|tmp)-\d+(-[0-9a-f]+)?$", "", name[1:])
    return name in (MANIFEST_NAME, SHARD_TABLE_NAME, SKIPPED_NAME) or name.endswith(
        (TOKENS_SUFFIX, INDEX_SUFFIX, METADATA_SUFFIX, LOSS_SUFFIX))


def task_marker_name(task: int) -> str:
    return f"task-{task:06d}.json"


def work_progress(path: Path) -> tuple[int, int | None] | None:
    """(tasks done, tasks planned) of an unfinished tokenize output; None when ``path`` has no work folder."""
    work = storage.location(path) / WORK_DIR
    if not storage.is_dir(work):
        return None
    done = len(storage.list_names(work, TASK_MARKER_GLOB))
    try:
        total = json.loads(storage.read_text(work / WORK_PLAN)).get("num_tasks")
    except (OSError, ValueError):
        total = None
    return done, total
