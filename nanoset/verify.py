"""``nanoset verify``: a full read of every shard against the manifest and the format's rules."""

from __future__ import annotations

import hashlib
from pathlib import Path

import numpy as np

from nanoset import storage
from nanoset.errors import NanosetError
from nanoset.format.maxid import check_token_ids
from nanoset.format.megatron import MegatronShardReader, verify_megatron_shard
from nanoset.format.open import open_dataset
from nanoset.format.reader import NanosetReader, ShardReader, index_problem, loss_mask_problem, missing_file
from nanoset.format.shardtable import check_shard_table
from nanoset.format.spec import ShardInfo
from nanoset.remote_cache import local_file

CHUNK_TOKENS = 1 << 24


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    try:
        f = storage.open_read(path)
    except (FileNotFoundError, NotADirectoryError):  # the metadata file: the one whose size is not checked first
        raise missing_file(path) from None
    with f:
        while block := f.read(8 << 20):
            h.update(block)
    return h.hexdigest()


def _fail(path: Path, what: str) -> NanosetError:
    return NanosetError(f"{path}: {what}; the shard is corrupt: re-create it with `nanoset tokenize ... --overwrite`")


def verify_shard(ds: NanosetReader, shard: ShardReader, expected: ShardInfo | None) -> int:
    """Raise on the first problem of ``shard``: checksum, index shape, token range, the recorded
    largest id or a missing EOS; returns the shard's largest token id (-1 when empty)."""
    expected_sha = expected.sha256 if expected else None
    shard.check_sizes()
    if isinstance(shard, MegatronShardReader):
        verify_megatron_shard(shard)
    if expected_sha:
        files = [("ds", shard.tokens_path), ("index", shard.index_path), ("metadata", shard.metadata_path)]
        for role, path in files + ([("loss", shard.loss_path)] if shard.has_loss else []):
            if shard.source is not None:  # a remote shard: its copy in the shard cache, named by its URL
                path = shard.source / path.name
                got = _sha256(local_file(path, sha256=expected_sha.get(role)))
            else:
                got = _sha256(path)
            if got != expected_sha.get(role):
                raise _fail(path, f"sha256 {got[:12]}… differs from the manifest's {str(expected_sha.get(role))[:12]}…")
    ends = np.asarray(shard.ends, dtype=np.int64)
    if len(ends):
        if problem := index_problem(np.diff(ends, prepend=0)):
            raise _fail(shard.index_path, problem)
        if int(ends[-1]) != shard.num_tokens:
            raise _fail(shard.index_path, f"last document ends at {int(ends[-1])}, but the shard has "
                                          f"{shard.num_tokens} tokens")
    elif shard.num_tokens:
        raise _fail(shard.index_path, "empty index for a shard with tokens")
    tok = ds.tokenizer
    largest = -1
    for start in range(0, shard.num_tokens, CHUNK_TOKENS):
        chunk = shard.tokens[start : start + CHUNK_TOKENS]
        top = int(chunk.max())
        check_token_ids(chunk, start, shard.tokens_path)
        if tok is not None and tok.vocab_size is not None and top >= tok.vocab_size:
            pos = start + int(np.argmax(chunk >= tok.vocab_size))
            raise _fail(shard.tokens_path, f"token id {top} at position {pos} is ≥ the vocab size {tok.vocab_size}")
        largest = max(largest, top)
    if expected is not None and expected.max_token_id is not None and expected.max_token_id != largest:
        raise _fail(shard.tokens_path, f"largest token id {largest} differs from the manifest's "
                                       f"{expected.max_token_id}")
    if shard.has_loss:
        _verify_loss(shard, expected)
    if _checks_eos(ds) and len(ends):
        last = np.asarray(shard.tokens[ends - 1])
        missing = np.flatnonzero(last != tok.eos_id)
        if len(missing):
            d = int(missing[0])
            raise _fail(shard.tokens_path, f"document {d} ends with token {int(last[d])}, not EOS {tok.eos_id}")
    return largest


def _verify_loss(shard: ShardReader, expected: ShardInfo | None) -> None:
    """Every loss-mask byte is 0 or 1, and the count of 1s is the manifest's ``loss_tokens``."""
    trained = 0
    for start in range(0, shard.num_tokens, CHUNK_TOKENS):
        chunk = shard.loss[start : start + CHUNK_TOKENS]
        if problem := loss_mask_problem(chunk, start):
            raise _fail(shard.loss_path, problem)
        trained += int(np.count_nonzero(chunk))
    if expected is not None and expected.loss_tokens is not None and expected.loss_tokens != trained:
        raise _fail(shard.loss_path, f"{trained} tokens with loss, the manifest says {expected.loss_tokens}")


def _checks_eos(ds: NanosetReader) -> bool:
    """Whether every document must end with EOS: the tokenizer's EOS is known, and the data is not converted
    foreign data whose documents do not (``nanoset convert`` records ``documents_end_with_eos: false``)."""
    tok = ds.tokenizer
    return (tok is not None and tok.eos_id is not None
            and (ds.manifest is None or ds.manifest.build.get("documents_end_with_eos") is not False))


def _checked(ds: NanosetReader) -> str:
    """What was verified, in words."""
    if ds.format == "megatron":
        return "sizes and offsets; Megatron data: no checksums, and its documents need not end with EOS"
    parts = ["checksums", "shard table", "index", "token ids"] if ds.format == "nanoset" else ["sizes", "index"]
    parts += ["EOS"] * _checks_eos(ds) + ["loss masks"] * ds.has_loss_masks
    words = ", ".join(parts[:-1]) + " and " + parts[-1]
    if ds.format == "datatrove":
        return words + " (datatrove folder: no checksums)"
    if ds.tokenizer.eos_id is None:
        return words + "; no EOS check: the tokenizer is unknown"
    return words if _checks_eos(ds) else words + "; converted data whose documents need not end with EOS"


def check_retokenize_count(count: int) -> None:
    """``--retokenize N`` re-encodes at least one document."""
    if count < 1:
        raise NanosetError(f"--retokenize must be ≥ 1, got {count}")


def verify_dataset(path: Path) -> str:
    """Verify every shard of the dataset at ``path``; returns a one-line report, raises on a problem."""
    ds = open_dataset(path)
    if ds.manifest is not None:
        check_shard_table(ds.manifest)
    largest = max(verify_shard(ds, shard, ds.manifest.shards[i] if ds.manifest else None)
                  for i, shard in enumerate(ds.shards))
    return (f"OK: {path}: {len(ds.shards)} shards, {ds.num_documents:,} documents, {ds.num_tokens:,} tokens, "
            f"largest id {largest} verified ({_checked(ds)})")
