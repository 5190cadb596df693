"""The one place that opens a dataset, whatever its format: a Nanoset folder (its manifest), a plain
datatrove folder, or Megatron data (a ``PREFIX`` or a folder of ``.bin``/``.idx`` pairs). The readers
know only their own format; a tokenize output whose tasks are not all done is refused here.
"""

from __future__ import annotations

from pathlib import Path

from nanoset import storage
from nanoset.errors import NanosetError
from nanoset.format.datatrove import open_datatrove
from nanoset.format.megatron import megatron_prefixes, open_megatron
from nanoset.format.reader import NanosetReader, ShardList
from nanoset.format.spec import MANIFEST_NAME, SHARD_TABLE_NAME, Manifest, dtype_from_name, work_progress
from nanoset.remote_cache import shard_cache
from nanoset.storage import Location


def open_dataset(path: str | Path) -> NanosetReader:
    """Open a Nanoset folder (with ``nanoset.json``), a plain datatrove folder of ``*.ds`` shards, or a
    Megatron dataset (a ``PREFIX`` of ``PREFIX.bin`` + ``PREFIX.idx``, or a folder of such pairs); a Nanoset folder
    may also be a URL (``s3://bucket/path``): its manifest is read at once, each shard when first needed."""
    if storage.is_url(path):
        return _open_remote(storage.location(path))
    folder = Path(path)
    if storage.is_file(folder / MANIFEST_NAME):  # what the manifest lists is the dataset: no listing of the folder
        manifest = Manifest.load(folder)
        shards = ShardList(folder, manifest.table, dtype_from_name(manifest.dtype), manifest.loss_masks)
        if not len(shards):
            raise NanosetError(f"{folder}: the dataset has no shards")
        return NanosetReader(folder, shards, manifest.tokenizer, manifest)  # sizes: checked as each file is mapped
    prefixes = megatron_prefixes(folder)
    if prefixes is not None:
        return open_megatron(folder, prefixes)
    if not storage.is_dir(folder):
        create = f"create it with `nanoset tokenize ... -o {folder}`"
        if folder.is_absolute():
            raise NanosetError(f"{folder}: no such dataset folder ({create})")
        raise NanosetError(f"{folder}: no such dataset folder in the working directory {Path.cwd()} (a relative path "
                           f"is read from there: run from the folder that holds it, give its absolute path, or "
                           f"{create})")
    _refuse_unfinished(folder)
    readers, tokenizer = open_datatrove(folder)
    if not readers:
        raise NanosetError(f"{folder}: the dataset has no shards")
    for shard in readers:
        shard.check_sizes()
    return NanosetReader(folder, readers, tokenizer, None)


def _open_remote(loc: Location) -> NanosetReader:
    """A Nanoset folder in an object store: its manifest and shard table are downloaded into the node's shard cache
    (``nanoset.remote_cache``) at each open, its shards when a sample first needs them, checked against the
    manifest's sha256."""
    cache = shard_cache()
    try:
        cache.refresh(loc / MANIFEST_NAME)
    except FileNotFoundError:
        raise NanosetError(f"{loc}: no Nanoset dataset there (no {MANIFEST_NAME}; from object storage only Nanoset "
                           f"folders are read, and a folder is one once its manifest is written): write it with "
                           f"`nanoset tokenize ... -o {loc}`") from None
    try:
        cache.refresh(loc / SHARD_TABLE_NAME)
    except FileNotFoundError:
        pass  # built from the manifest at its first open
    folder = cache.folder(loc)
    manifest = Manifest.load(folder)
    checksums = [record.sha256 for record in manifest.shards]  # every download is checked against its own
    shards = ShardList(folder, manifest.table, dtype_from_name(manifest.dtype), manifest.loss_masks, source=loc,
                       checksums=checksums.__getitem__)
    if not len(shards):
        raise NanosetError(f"{loc}: the dataset has no shards")
    return NanosetReader(folder, shards, manifest.tokenizer, manifest)


def _refuse_unfinished(folder: Path) -> None:
    """A tokenize output whose tasks are not all done holds shards but is no dataset yet."""
    progress = work_progress(folder)
    if progress is None:
        return
    done, total = progress
    raise NanosetError(
        f"{folder}: unfinished `nanoset tokenize` output ({done} of {total if total is not None else '?'} tasks done, "
        f"no {MANIFEST_NAME} yet); finish it by rerunning the same tokenize command without --num-tasks/--task-index "
        f"(finished tasks are kept), or run the missing --task-index values"
    )
