"""ShardWriter: stream documents into one shard, then publish it atomically.

Tokens and document ends go straight to temporary files (no Python lists that grow with the
shard, the memory blow-up Megatron's builder has); checksums are computed while writing, so
finalize needs no second read. ``finalize`` fsyncs and renames; until then no file carries a
final name, so a crash never leaves a partial shard that looks complete. A writer made with
``loss_masks=True`` also writes ``NAME.ds.loss`` (one 0/1 byte per token) the same way.
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
from collections.abc import Sequence
from pathlib import Path
from types import TracebackType
from typing import BinaryIO

import numpy as np

from nanoset.atomic import atomic_write
from nanoset.errors import WRITE_ERRNOS, NanosetError, WriteFailed
from nanoset.format.shardtable import encode_table
from nanoset.format.spec import (
    INDEX_DTYPE,
    LOSS_DTYPE,
    MANIFEST_NAME,
    SHARD_TABLE_NAME,
    Manifest,
    ShardInfo,
    metadata_text,
    shard_files,
)


def write_error(path: Path, error: OSError, resumable: bool = True) -> WriteFailed:
    """The one line for a write that failed (a full disk): which file, and what to do."""
    return WriteFailed(path, error.strerror or str(error), resumable)


class HashedFile:
    """A binary file opened for writing that hashes what passes through it; a full disk is one line naming it
    (``resumable``: whether a rerun keeps finished work, as a tokenize job does). As a context manager it is
    closed with fsync when the block succeeds, dropped when it fails."""

    def __init__(self, path: Path, resumable: bool = True) -> None:
        self.path = path
        self.resumable = resumable
        self.file: BinaryIO = open(path, "wb")
        self.hash = hashlib.sha256()

    def __enter__(self) -> HashedFile:
        return self

    def __exit__(self, exc_type: type | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        self.close(sync=exc_type is None)

    def write(self, data: bytes | memoryview) -> None:
        self.hash.update(data)
        try:
            self.file.write(data)
        except OSError as e:
            if e.errno not in WRITE_ERRNOS:
                raise
            raise write_error(self.path, e, self.resumable) from None

    def close(self, sync: bool) -> None:
        if self.file.closed:
            return
        try:
            self.file.flush()
            if sync:
                os.fsync(self.file.fileno())
        except OSError as e:
            self._drop()
            if not sync:  # an abort: the file is discarded, whatever went wrong
                return
            if e.errno in WRITE_ERRNOS:
                raise write_error(self.path, e, self.resumable) from None
            raise
        self.file.close()

    def _drop(self) -> None:
        try:
            self.file.close()
        except OSError:
            pass


class ShardWriter:
    """Append documents (arrays of token ids) to shard ``name`` in ``folder``.

    >>> with ShardWriter(folder, "00000", dtype=np.uint16, tokenizer_name="gpt2") as w:
    ...     w.add_document([5, 6, 0])
    ...     info = w.finalize()
    """

    def __init__(self, folder: str | Path, name: str, dtype: np.dtype | type, tokenizer_name: str,
                 loss_masks: bool = False) -> None:
        self.folder = Path(folder)
        self.name = name
        self.dtype = np.dtype(dtype).newbyteorder("<")
        if self.dtype.kind != "u" or self.dtype.itemsize not in (2, 4):
            raise NanosetError(f"shard {name}: token dtype must be uint16 or uint32, not {dtype}")
        self.tokenizer_name = tokenizer_name
        self.num_tokens = 0
        self.num_documents = 0
        self.max_token_id = -1
        self.loss_tokens = 0
        self.loss_masks = loss_masks
        self.finalized = False
        self._final = {role: self.folder / f for role, f in shard_files(name, loss=loss_masks).items()}
        tag = f"partial-{os.getpid()}"
        self._tmp = {role: p.with_name(f".{p.name}.{tag}") for role, p in self._final.items()}
        self.folder.mkdir(parents=True, exist_ok=True)
        self._tokens = HashedFile(self._tmp["ds"])
        self._index = HashedFile(self._tmp["index"])
        self._loss = HashedFile(self._tmp["loss"]) if loss_masks else None

    def add_document(self, token_ids: Sequence[int] | np.ndarray,
                     loss: Sequence[int] | np.ndarray | None = None) -> None:
        """Append one document; its ids must already end with EOS if the dataset wants one."""
        ids = np.asarray(token_ids)
        self.add_documents(ids, np.array([len(ids)], dtype=np.int64), None if loss is None else np.asarray(loss))

    def add_documents(self, flat_ids: np.ndarray, lengths: np.ndarray, loss: np.ndarray | None = None) -> None:
        """Append several documents at once: ``flat_ids`` concatenated, ``lengths`` per document, and for a
        writer with loss masks ``loss``, one 0/1 value per id."""
        if self.finalized:
            raise NanosetError(f"shard {self.name} is already finalized")
        if (loss is not None) != self.loss_masks:
            raise NanosetError(f"shard {self.name}: loss masks " + ("required" if self.loss_masks else
                                                                   "given to a writer made without loss_masks=True"))
        lengths = np.asarray(lengths, dtype=np.int64)
        if len(lengths) == 0:
            return
        if (lengths <= 0).any():
            raise NanosetError(f"shard {self.name}: every document needs at least one token (e.g. EOS)")
        if int(lengths.sum()) != len(flat_ids):
            raise NanosetError(f"shard {self.name}: lengths sum to {int(lengths.sum())}, got {len(flat_ids)} ids")
        ids = np.asarray(flat_ids)
        if loss is not None:
            loss = np.asarray(loss)
            if len(loss) != len(ids) or (loss.size and (int(loss.min()) < 0 or int(loss.max()) > 1)):
                raise NanosetError(f"shard {self.name}: the loss mask needs one 0/1 value per token id")
        top = int(ids.max()) if ids.size else -1
        if ids.size and (int(ids.min()) < 0 or top > np.iinfo(self.dtype).max):
            raise NanosetError(f"shard {self.name}: token id out of range for {self.dtype.name}")
        self._tokens.write(ids.astype(self.dtype, copy=False).tobytes())
        ends = np.cumsum(lengths, dtype=np.int64) + self.num_tokens
        self._index.write(ends.astype(INDEX_DTYPE).tobytes())
        if self._loss is not None:
            self._loss.write(loss.astype(LOSS_DTYPE).tobytes())
            self.loss_tokens += int(np.count_nonzero(loss))
        self.num_tokens = int(ends[-1])
        self.num_documents += len(lengths)
        self.max_token_id = max(self.max_token_id, top)

    def finalize(self, sources: list[dict] | None = None) -> ShardInfo:
        """Flush, fsync and rename the three files to their final names; return the shard's record."""
        self._tokens.close(sync=True)
        self._index.close(sync=True)
        if self._loss is not None:
            self._loss.close(sync=True)
        meta = metadata_text(self.tokenizer_name, self.dtype.itemsize, self.num_tokens).encode("utf-8")
        meta_file = HashedFile(self._tmp["metadata"])
        meta_file.write(meta)
        meta_file.close(sync=True)
        for role in self._final:  # the loss mask (if any) before the metadata, which is renamed last
            if role != "metadata":
                os.replace(self._tmp[role], self._final[role])
        os.replace(self._tmp["metadata"], self._final["metadata"])
        self.finalized = True
        sha = {"ds": self._tokens.hash.hexdigest(), "index": self._index.hash.hexdigest(),
               "metadata": hashlib.sha256(meta).hexdigest()}
        if self._loss is not None:
            sha["loss"] = self._loss.hash.hexdigest()
        return ShardInfo(
            name=self.name,
            num_tokens=self.num_tokens,
            num_documents=self.num_documents,
            sha256=sha,
            sources=list(sources or []),
            max_token_id=self.max_token_id,
            loss_tokens=self.loss_tokens if self._loss is not None else None,
        )

    def abort(self) -> None:
        """Close and delete the temporary files; nothing with a final name is touched."""
        self._tokens.close(sync=False)
        self._index.close(sync=False)
        if self._loss is not None:
            self._loss.close(sync=False)
        for p in self._tmp.values():
            p.unlink(missing_ok=True)

    def __enter__(self) -> ShardWriter:
        return self

    def __exit__(self, exc_type: type | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        if not self.finalized:
            self.abort()


def write_manifest(folder: str | Path, manifest: Manifest) -> Path:
    """Publish ``nanoset.json`` (atomically, last): from now on the folder is a complete dataset. Its shard
    table follows it (atomically too): a crash between the two leaves a table of the previous manifest or
    none, which the manifest's stamp tells apart, and the next open builds the table again."""
    folder = Path(folder)
    for shard in manifest.shards:
        for f in shard_files(shard.name, loss=manifest.loss_masks).values():
            if not (folder / f).is_file():
                raise NanosetError(f"{folder / f}: missing; finalize every shard before writing the manifest")
    # the records as they are now: the table of a loaded manifest predates any edit made to its records since
    manifest = dataclasses.replace(manifest, shards=list(manifest.shards))
    path = folder / MANIFEST_NAME
    text = manifest.to_json().encode("utf-8")
    atomic_write(path, lambda f: f.write(text))
    table = encode_table(manifest, len(text), hashlib.sha256(text).digest())
    atomic_write(folder / SHARD_TABLE_NAME, lambda f: f.write(table))
    return path
