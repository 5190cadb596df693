"""The Nanoset on-disk format, version 1: file names, dtypes, metadata lines, the manifest.

A dataset is a folder. Each shard ``NAME`` is three files that datatrove writes and Nanotron
reads byte for byte (``NAME.ds``, ``NAME.ds.index``, ``NAME.ds.metadata``); the folder also
holds ``nanoset.json``, written last, which makes it a complete Nanoset dataset.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any

import numpy as np

from nanoset.errors import NanosetError

FORMAT_NAME = "nanoset"
FORMAT_VERSION = 1
MANIFEST_NAME = "nanoset.json"
TOKENS_SUFFIX = ".ds"
INDEX_SUFFIX = ".ds.index"
METADATA_SUFFIX = ".ds.metadata"
WORK_DIR = ".nanoset-work"  # an unfinished tokenize output: its plan and the markers of finished tasks
WORK_PLAN = "plan.json"
TASK_MARKER_GLOB = "task-*.json"
LOSS_SUFFIX = ".ds.loss"  # one byte per token, 1 = trained on (datatrove's loss-mask side file)
LOSS_DTYPE = np.dtype("u1")
INDEX_DTYPE = np.dtype("<u8")
UINT16_MAX_VOCAB = 65536


def dtype_for_vocab(vocab_size: int) -> np.dtype:
    """uint16 when every id fits (vocab ≤ 65536), else uint32; always little-endian."""
    return np.dtype("<u2") if vocab_size <= UINT16_MAX_VOCAB else np.dtype("<u4")


def dtype_name(dtype: np.dtype) -> str:
    return {2: "uint16", 4: "uint32"}[np.dtype(dtype).itemsize]


def dtype_from_name(name: str) -> np.dtype:
    table = {"uint16": np.dtype("<u2"), "uint32": np.dtype("<u4")}
    if name not in table:
        raise NanosetError(f"unknown token dtype {name!r} (expected uint16 or uint32)")
    return table[name]


def human_count(n: int) -> str:
    """1234567 -> '1.23M': the third line of a datatrove metadata file."""
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
        lines = path.read_text(encoding="utf-8").splitlines()
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


@dataclass
class Manifest:
    """``nanoset.json``: the dataset's table of contents; its presence means 'complete'."""

    tokenizer: TokenizerInfo
    dtype: str
    shards: list[ShardInfo]
    build: dict[str, Any] = field(default_factory=dict)
    skipped_lines: int = 0
    loss_masks: bool = False  # every shard has a NAME.ds.loss
    chat_template_sha256: str | None = None  # the chat template that rendered the conversations
    chat_template_file: str | None = None  # its file, when it was not the tokenizer's own (--chat-template)
    encoders: list[str] | None = None  # the backends that encoded the shards ("fastokens 0.3.5"): information
    # only, the bytes do not depend on it
    format: str = FORMAT_NAME
    version: int = FORMAT_VERSION

    @property
    def num_tokens(self) -> int:
        return sum(s.num_tokens for s in self.shards)

    @property
    def num_documents(self) -> int:
        return sum(s.num_documents for s in self.shards)

    @property
    def max_token_id(self) -> int | None:
        """The largest id of the dataset, None when a shard's is not recorded (an older manifest)."""
        ids = [s.max_token_id for s in self.shards]
        return None if None in ids else max(ids, default=-1)

    def to_json(self) -> str:
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
            "shards": [s.to_json() for s in self.shards],
        }
        if self.loss_masks:  # only in chat datasets: plain manifests keep their bytes
            d["loss_masks"] = True
            d["chat_template_sha256"] = self.chat_template_sha256
            if self.chat_template_file is not None:
                d["chat_template_file"] = self.chat_template_file
        if self.encoders is not None:
            d["encoders"] = self.encoders
        return json.dumps(d, indent=1, sort_keys=True) + "\n"

    @staticmethod
    def load(folder: Path) -> Manifest:
        path = Path(folder) / MANIFEST_NAME
        try:
            d = json.loads(path.read_text(encoding="utf-8"))
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
            manifest = Manifest(
                tokenizer=TokenizerInfo(**d["tokenizer"]),
                dtype=d["dtype"],
                shards=[ShardInfo.from_json(s) for s in d["shards"]],
                build=d.get("build", {}),
                skipped_lines=d.get("skipped_lines", 0),
                loss_masks=bool(d.get("loss_masks", False)),
                chat_template_sha256=d.get("chat_template_sha256"),
                chat_template_file=d.get("chat_template_file"),
                encoders=d.get("encoders"),
            )
            for s in manifest.shards:
                if not (isinstance(s.name, str) and _count(s.num_tokens) and _count(s.num_documents)):
                    raise TypeError(f"shard {s.name!r}: name, num_tokens or num_documents is not a name or a count")
            return manifest
        except (KeyError, TypeError) as e:  # a key missing, unknown or of the wrong type (edited by hand?)
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


def task_marker_name(task: int) -> str:
    return f"task-{task:06d}.json"


def work_progress(path: Path) -> tuple[int, int | None] | None:
    """(tasks done, tasks planned) of an unfinished tokenize output; None when ``path`` has no work folder."""
    work = Path(path) / WORK_DIR
    if not work.is_dir():
        return None
    done = sum(1 for _ in work.glob(TASK_MARKER_GLOB))
    try:
        total = json.loads((work / WORK_PLAN).read_text()).get("num_tasks")
    except (OSError, ValueError):
        total = None
    return done, total
