"""The largest token id of a dataset folder, known before training starts.

Nanoset manifests record it per shard. A datatrove folder (or a manifest older than that field)
does not: its shards are scanned once and the result recorded in a small JSON file keyed by the
token files' names and stamps (``nanoset.format.cache.file_stamp``), so an unchanged folder is never
rescanned and a changed one always is. The record lives in the user's cache (``nanoset.format.cache``)
because dataset folders are often read-only; when that is not writable either, the scan is simply not
recorded.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import numpy as np

from nanoset.atomic import atomic_write_text
from nanoset.errors import NanosetError
from nanoset.format.cache import cache_dir, file_stamp
from nanoset.format.spec import UNRECORDED

SCAN_CHUNK = 1 << 24  # tokens per max() call: bounded memory whatever the shard size


def check_token_ids(chunk: np.ndarray, start: int, path: Path) -> None:
    """No negative id in ``chunk`` (tokens from position ``start`` of the file at ``path``): signed tokens
    (Megatron's int dtypes) can hold one, and no embedding table can look it up."""
    if chunk.dtype.kind == "i" and int(chunk.min()) < 0:
        pos = start + int(np.argmax(chunk < 0))
        raise NanosetError(f"{path}: negative token id {int(chunk[pos - start])} at position {pos}; "
                           f"token ids must be ≥ 0")


def scan_max(tokens: np.ndarray, path: Path) -> int:
    """The largest id of a shard's tokens (at ``path``), -1 when it has none, checking for negative ids."""
    top = -1
    for i in range(0, len(tokens), SCAN_CHUNK):
        chunk = tokens[i : i + SCAN_CHUNK]
        check_token_ids(chunk, i, path)
        top = max(top, int(chunk.max()))
    return top


def _record_path(folder: Path) -> Path:
    return cache_dir() / "max-token-id" / (hashlib.sha256(str(folder).encode()).hexdigest()[:32] + ".json")


def _load(path: Path) -> dict[str, Any] | None:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


def dataset_max_token_id(reader: Any) -> int:
    """The largest id of a ``NanosetReader``'s data: from the manifest, else a recorded or new scan."""
    shards = reader.shards
    if reader.manifest is not None:
        recorded = reader.manifest.table.max_token_id
        unknown = np.flatnonzero(recorded == UNRECORDED).tolist()
        known = recorded[recorded != UNRECORDED].tolist()
    else:
        unknown, known = list(range(len(shards))), []
    if not unknown:
        return max(known, default=-1)
    folder = Path(reader.folder).resolve()
    files = [[shards[i].name, *file_stamp(shards[i].tokens_path)] for i in unknown]
    path = _record_path(folder)
    saved = _load(path)
    if saved and saved.get("folder") == str(folder) and saved.get("files") == files:
        found = saved["max_token_ids"]
    else:
        found = [scan_max(shards[i].tokens, shards[i].tokens_path) for i in unknown]
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            atomic_write_text(path, json.dumps({"folder": str(folder), "files": files, "max_token_ids": found}))
        except (OSError, NanosetError):  # nowhere writable, or a full disk (WriteFailed)
            pass  # correct all the same, only rescanned next time
    return max(known + found, default=-1)
