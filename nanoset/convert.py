"""``nanoset convert``: Megatron or datatrove data into a Nanoset folder with a manifest, without re-tokenizing.

Why: a manifest brings checksums, the tokenizer record and the largest id, so the data is verified
and checked against a model like freshly tokenized data. Token ids are copied as they are, in
bounded chunks, cast to the narrowest Nanoset dtype (uint16 when the vocabulary, or else the
largest id, allows); document ends and a datatrove folder's loss masks (``NAME.ds.loss``) are copied;
checksums are computed while writing. The folder
is built under a temporary name beside OUT and renamed into place: OUT is never half written.
``--overwrite`` replaces only a dataset folder (one holding nothing but what ``tokenize`` and
``convert`` write), the folder a symbolic link OUT points to in place; what a killed conversion
left beside OUT (``.OUT.convert-HOST-PID``, ``.OUT.old-HOST-PID``) is removed by the next one.
"""

from __future__ import annotations

import glob
import os
import re
import shutil
import socket
from pathlib import Path

import numpy as np

from nanoset import storage
from nanoset.atomic import fresh_folder_beside
from nanoset.errors import NanosetError, print_note
from nanoset.format.maxid import check_token_ids
from nanoset.format.open import open_dataset
from nanoset.format.reader import NanosetReader, ShardReader, loss_mask_problem
from nanoset.format.spec import (
    INDEX_DTYPE,
    MANIFEST_NAME,
    Manifest,
    ShardInfo,
    TokenizerInfo,
    dtype_for_vocab,
    dtype_name,
    is_dataset_entry,
    metadata_text,
    shard_files,
)
from nanoset.format.writer import HashedFile, write_manifest
from nanoset.storage import is_url, location

HOST = re.sub(r"[^A-Za-z0-9.]", "_", socket.gethostname())
LEFTOVER = re.compile(r"(convert|old)-(?P<host>[A-Za-z0-9._]+)-(?P<pid>\d+)")  # after ".OUT."
CHUNK = 1 << 22  # tokens (or document ends) per copy step: bounded memory whatever the shard size
UINT32_LIMIT = 1 << 32


def _tokenizer_info(ds: NanosetReader, spec: str | None, eos_token: str | None, top: int, src: str) -> TokenizerInfo:
    """The manifest's tokenizer: the one given (checked against the largest id), else the recorded name."""
    if spec is None:
        if eos_token is not None:
            raise NanosetError("--eos-token needs --tokenizer (the tokenizer that made the data)")
        return TokenizerInfo(name=ds.tokenizer.name if ds.tokenizer else "unknown", vocab_size=None)
    from nanoset.tokenize.tokenizer import resolve_tokenizer

    resolved = resolve_tokenizer(spec, eos_token)
    for note in resolved.notes:  # an EOS taken by its name: recorded, so said
        print_note(note)
    info = resolved.info
    if top >= info.vocab_size:
        raise NanosetError(f"{src}: holds token id {top}, ≥ the vocab size {info.vocab_size} of tokenizer {spec!r}; "
                           f"pass the tokenizer the data was made with")
    return info


def _check_output(src: Path, out: Path, overwrite: bool) -> None:
    """OUT may be made, or replaced: it is missing or an empty folder, or with ``--overwrite`` a dataset
    folder (nothing in it but what tokenize and convert write: never a home folder or a thesis)."""
    real_src, real_out = Path(os.path.realpath(src)), Path(os.path.realpath(out))
    if real_out == real_src or real_out in real_src.parents:
        raise NanosetError(f"{out}: holds the data being converted ({src}); choose another output folder")
    if not out.exists():
        return
    if not out.is_dir():
        raise NanosetError(f"{out}: is a file, not a folder; choose another output folder")
    entries = sorted(p.name for p in out.iterdir())
    if not entries:
        return
    if not overwrite:
        raise NanosetError(f"{out}: exists; pass --overwrite to replace it, or choose another output folder")
    others = [name for name in entries if not is_dataset_entry(out / name)]
    if others:
        shown = ", ".join(others[:3]) + (f" and {len(others) - 3} more" if len(others) > 3 else "")
        raise NanosetError(f"{out}: holds files that are not a dataset's ({shown}); --overwrite replaces only a "
                           f"dataset folder: choose another output folder")


def _copy_loss(shard: ShardReader, f: HashedFile) -> int:
    """Copy a datatrove shard's loss mask (one 0/1 byte per token); returns the count of tokens trained on."""
    trained = 0
    for start in range(0, shard.num_tokens, CHUNK):
        chunk = np.asarray(shard.loss[start : start + CHUNK])
        if problem := loss_mask_problem(chunk, start):
            raise NanosetError(f"{shard.loss_path}: {problem}")
        trained += int(np.count_nonzero(chunk))
        f.write(chunk.tobytes())
    return trained


def _copy_shard(shard: ShardReader, folder: Path, dtype: np.dtype, tok: TokenizerInfo) -> tuple[ShardInfo, bool]:
    """Copy one shard's tokens, ends and loss mask (if any) into ``folder``; returns its record and whether its
    documents end with EOS."""
    files = shard_files(shard.name, loss=shard.has_loss)
    sha: dict[str, str] = {}
    top = -1
    with HashedFile(folder / files["ds"], resumable=False) as f:
        for start in range(0, shard.num_tokens, CHUNK):
            chunk = np.asarray(shard.tokens[start : start + CHUNK])
            check_token_ids(chunk, start, shard.tokens_path)
            top = max(top, int(chunk.max()))
            if top > np.iinfo(dtype).max:
                raise NanosetError(f"{shard.tokens_path}: token id {top} does not fit {dtype.name}; the file changed "
                                   f"during the conversion")
            f.write(chunk.astype(dtype).tobytes())
    sha["ds"] = f.hash.hexdigest()
    ends = shard.ends
    eos_ok = True
    with HashedFile(folder / files["index"], resumable=False) as f:
        for start in range(0, len(ends), CHUNK):
            part = np.asarray(ends[start : start + CHUNK], dtype=INDEX_DTYPE)
            if tok.eos_id is not None and eos_ok:
                eos_ok = bool((np.asarray(shard.tokens[part.astype(np.int64) - 1]) == tok.eos_id).all())
            f.write(part.tobytes())
    sha["index"] = f.hash.hexdigest()
    trained = None
    if shard.has_loss:
        with HashedFile(folder / files["loss"], resumable=False) as f:
            trained = _copy_loss(shard, f)
        sha["loss"] = f.hash.hexdigest()
    with HashedFile(folder / files["metadata"], resumable=False) as f:
        f.write(metadata_text(tok.name, dtype.itemsize, shard.num_tokens).encode("utf-8"))
    sha["metadata"] = f.hash.hexdigest()
    info = ShardInfo(name=shard.name, num_tokens=shard.num_tokens, num_documents=shard.num_documents,
                     sha256={role: sha[role] for role in files}, max_token_id=top, loss_tokens=trained)
    return info, eos_ok


def _publish(tmp: Path, out: Path, old: Path) -> None:
    """Rename the finished folder to ``out`` (a real folder: a link to it is resolved first); an old ``out``
    is moved aside to ``old`` first and removed after."""
    if not out.exists():
        os.rename(tmp, out)
        return
    os.rename(out, old)
    os.rename(tmp, out)
    shutil.rmtree(old)


def _leftovers(out: Path) -> list[Path]:
    """What conversions into ``out`` that were killed on this machine left beside it (their process is gone)."""
    found = []
    for p in out.parent.glob(f".{glob.escape(out.name)}.*-*"):
        m = LEFTOVER.fullmatch(p.name[len(out.name) + 2 :])
        if m and m["host"] == HOST and not _alive(int(m["pid"])):
            found.append(p)
    return found


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        return True
    return True


def convert(src: str | Path, out: str | Path, tokenizer: str | None = None, eos_token: str | None = None,
            overwrite: bool = False) -> str:
    """Convert the dataset at ``src`` into the Nanoset folder ``out``; returns a one-line summary. Either may be a
    URL: a source is copied into the storage cache first (a Megatron PREFIX as its ``.bin`` and ``.idx``, a folder
    whole); an output is converted into its staging folder and uploaded from there, the manifest last."""
    if not is_url(str(out)):
        return _convert(src, Path(out), tokenizer, eos_token, overwrite)
    from nanoset.tokenize.remote_output import publish, staging_folder

    url = location(out)
    if not overwrite and storage.is_file(url / MANIFEST_NAME):
        raise NanosetError(f"{url}: holds a dataset; pass --overwrite to replace it, or choose another output")
    stage = staging_folder(url)
    line = _convert(src, stage, tokenizer, eos_token, overwrite=True, shown=url.url)
    publish(stage, url, overwrite)
    return line


def _local_source(src: str) -> Path:
    """The local copy of a source URL: a Megatron PREFIX (its ``.bin`` and ``.idx``), else a folder or file."""
    from nanoset.tokenize.remote_inputs import local_files, local_inputs

    where = location(src)
    pair = [where.name + ".bin", where.name + ".idx"]
    if all(storage.is_file(where.parent / name) for name in pair):
        return local_files(where.parent, pair) / where.name
    return Path(local_inputs([src])[0][0])


def _convert(src: str | Path, out: Path, tokenizer: str | None, eos_token: str | None, overwrite: bool,
             shown: str | None = None) -> str:
    """Convert into the local folder ``out``, named ``shown`` (its URL) in the summary."""
    if is_url(str(src)):
        src_name, src = location(src).url, _local_source(str(src))
    else:
        src = Path(src)
        src_name = str(src)
    ds = open_dataset(src)
    if ds.format == "nanoset":
        raise NanosetError(f"{src_name}: already a Nanoset dataset (it has {MANIFEST_NAME}); nothing to convert")
    _check_output(src, out, overwrite)
    top = ds.max_token_id
    tok = _tokenizer_info(ds, tokenizer, eos_token, top, src_name)
    vocab = tok.vocab_size if tok.vocab_size is not None else top + 1
    if vocab > UINT32_LIMIT:
        raise NanosetError(f"{src_name}: token id {top} does not fit uint32, the widest Nanoset dtype")
    dtype = dtype_for_vocab(vocab)
    shards = [s for s in ds.shards if s.num_documents]
    if not shards:
        raise NanosetError(f"{src_name}: holds no documents; nothing to convert")
    out = Path(os.path.realpath(out)) if out.is_symlink() else out  # replace the folder the link points to
    for left in _leftovers(out):
        shutil.rmtree(left, ignore_errors=True)
    tag = f"{HOST}-{os.getpid()}"
    tmp = fresh_folder_beside(out, f".{out.name}.convert-{tag}")
    try:
        copied = [_copy_shard(s, tmp, dtype, tok) for s in shards]
        eos_ok = all(ok for _, ok in copied) if tok.eos_id is not None else None
        build = {"converted_from": ds.format, "source": src_name, "documents_end_with_eos": eos_ok}
        write_manifest(tmp, Manifest(tokenizer=tok, dtype=dtype_name(dtype), shards=[s for s, _ in copied],
                                     build=build, loss_masks=ds.has_loss_masks))
        _publish(tmp, out, out.with_name(f".{out.name}.old-{tag}"))
    except OSError as e:  # e.g. the disk filled up: nothing of OUT is left half written
        shutil.rmtree(tmp, ignore_errors=True)
        raise NanosetError(f"{out}: writing the converted dataset failed ({e})") from None
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    note = "" if eos_ok is not False else f"; not every document ends with EOS {tok.eos_id} (recorded)"
    return (f"converted {src_name} ({ds.format}) to {shown or out}: {len(shards)} shards, "
            f"{ds.num_documents:,} documents, {ds.num_tokens:,} tokens as {dtype_name(dtype)}, "
            f"tokenizer {tok.name}{note}")
