"""The largest token id of a dataset folder, known before training starts.

Nanoset manifests record it per shard. A datatrove folder (or a manifest older than that field)
does not: its shards are scanned once and the result recorded, one record per folder, keyed by the
token files' names and stamps, in the user's cache (``nanoset.cache``: an unchanged folder is never
rescanned and a changed one always is; a cache that cannot be written costs a rescan at the next start).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from nanoset.cache import DerivedCache, file_stamp, key_digest
from nanoset.errors import NanosetError
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

    def scan() -> dict[str, Any]:
        return {"max_token_ids": [scan_max(shards[i].tokens, shards[i].tokens_path) for i in unknown]}

    def valid(record: dict[str, Any]) -> bool:
        ids = record.get("max_token_ids")
        return isinstance(ids, list) and len(ids) == len(unknown) and all(type(i) is int for i in ids)

    key = {"folder": str(folder), "files": files}
    record = DerivedCache("max-token-id").record(key, scan, key_digest(str(folder)), valid)
    return max(known + record["max_token_ids"], default=-1)
