"""Plain datatrove folders (``*.ds`` shards with ``.ds.index`` and ``.ds.metadata``, no manifest), read in place.

Their metadata names the tokenizer (a name or path, no vocabulary) and the token size; the
document count comes from the index size, checked against the metadata's token count at open.
Optional ``.ds.loss`` files (datatrove's loss masks) must be there for every shard or none.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from nanoset import storage
from nanoset.errors import NanosetError
from nanoset.format.reader import ShardReader
from nanoset.format.spec import (
    INDEX_DTYPE,
    INDEX_SUFFIX,
    LOSS_SUFFIX,
    MANIFEST_NAME,
    METADATA_SUFFIX,
    TOKENS_SUFFIX,
    TokenizerInfo,
    parse_metadata,
)


def open_datatrove(folder: Path) -> tuple[list[ShardReader], TokenizerInfo | None]:
    names = sorted(n[: -len(TOKENS_SUFFIX)] for n in storage.list_names(folder, "*" + TOKENS_SUFFIX)
                   if storage.is_file(folder / n))
    if not names:
        partial = any(n.startswith(".") for n in storage.list_names(folder))
        hint = " (a tokenize run is unfinished: re-run it)" if partial else ""
        raise NanosetError(f"{folder}: neither {MANIFEST_NAME} nor *.ds shards found{hint}; is this a dataset folder?")
    shards = []
    tokenizer_names = set()
    for name in names:
        meta = folder / (name + METADATA_SUFFIX)
        index = folder / (name + INDEX_SUFFIX)
        if not storage.is_file(meta) or not storage.is_file(index):
            raise NanosetError(f"{folder / name}.ds: missing {meta.name} or {index.name}; the shard is incomplete")
        tok_name, token_size, num_tokens = parse_metadata(meta)
        if token_size not in (2, 4):
            raise NanosetError(f"{meta}: token size {token_size} bytes is not supported (2 or 4)")
        tokenizer_names.add(tok_name)
        num_documents = storage.size(index) // INDEX_DTYPE.itemsize
        dtype = np.dtype(f"<u{token_size}")
        shard = ShardReader(folder, name, dtype, num_tokens, num_documents,
                            has_loss=storage.is_file(folder / (name + LOSS_SUFFIX)))
        shard.check_sizes()
        last = _last_end(index, num_documents)
        if num_documents and last != num_tokens:
            raise NanosetError(f"{index}: last document end {last} != {num_tokens} tokens in {meta.name}")
        shards.append(shard)
    if len({s.dtype for s in shards}) > 1:
        raise NanosetError(f"{folder}: shards mix 2- and 4-byte tokens; one dataset needs one token size")
    if len({s.has_loss for s in shards}) > 1:
        missing = next(s for s in shards if not s.has_loss)
        raise NanosetError(f"{missing.loss_path}: missing, while other shards of {folder} have a loss mask "
                           f"({LOSS_SUFFIX}); every shard needs one, or none")
    if len(tokenizer_names) > 1:
        raise NanosetError(f"{folder}: shards come from different tokenizers {sorted(tokenizer_names)}")
    info = TokenizerInfo(name=tokenizer_names.pop(), vocab_size=None)  # type: ignore[arg-type]
    return shards, info


def _last_end(index: Path, num_documents: int) -> int:
    """The index's last entry, read without mapping the file (open checks touch every shard)."""
    if not num_documents:
        return 0
    at = (num_documents - 1) * INDEX_DTYPE.itemsize
    return int(np.frombuffer(storage.read_range(index, at, at + INDEX_DTYPE.itemsize), dtype=INDEX_DTYPE)[0])
