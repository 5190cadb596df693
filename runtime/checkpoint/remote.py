"""Checkpoints in object storage (``checkpoints.checkpoints_path: s3://...``, a checkpoint named by a URL).

A checkpoint is written as on a disk, into the local staging folder ``<run_dir>/checkpoints`` (DCP, renamed into
place, ``latest`` updated), then uploaded through the storage seam: its files, its ``metadata.json`` after them, the
bucket's ``latest`` last. So a checkpoint there counts only once whole: one whose upload was cut short has no
``metadata.json`` or is not named by ``latest``. Resuming downloads the checkpoint ``latest`` names there into the
staging folder (where that holds no newer one); a checkpoint named by a URL is downloaded once into the node's cache.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from nanoset import storage
from nanoset.cache import key_digest
from nanoset.errors import MissingPath
from nanoset.remote_cache import shard_cache
from nanoset.storage import Location
from runtime.checkpoint.layout import (
    LATEST,
    METADATA,
    TMP_PREFIX,
    NamedBy,
    checkpoint_step,
    is_complete,
    latest_name,
    write_latest,
)

CHECKPOINTS = "checkpoints"  # the cache's folder of checkpoints named by a URL


def upload_checkpoint(checkpoint: Path, url: Location) -> None:
    """Copy the local, complete ``checkpoint`` to ``url/<its name>``, its ``metadata.json`` last, then name it in
    ``url/latest``. A folder of that name there already (a step saved again after a rewind) is made incomplete
    first and loses the files this one lacks: an upload cut short never mixes two checkpoints under one that
    counts."""
    files = [f for f in storage.files_under(checkpoint) if f != METADATA]
    there = url / checkpoint.name
    for name in [METADATA, *sorted(set(storage.files_under(there)) - set(files) - {METADATA})]:
        storage.remove(there / name)
    for name in [*files, METADATA]:
        storage.upload(checkpoint / name, there / name)
    storage.upload(checkpoint.parent / LATEST, url / LATEST)


def prune(url: Location, keep_last: int, protected: set[str]) -> None:
    """Delete the checkpoints at ``url`` older than its ``keep_last`` newest by step number, except ``protected``
    and the one its ``latest`` names; a folder a cut-short upload left among them goes as well."""
    protected = protected | {remote_latest(url) or ""}
    steps = sorted((step, name) for name in storage.list_names(url, "step-*")
                   if (step := checkpoint_step(name)) is not None)
    for _, name in steps[:-keep_last]:
        if name not in protected:  # its metadata.json first: a prune cut short never leaves one that counts
            for f in sorted(storage.files_under(url / name), key=lambda f: f != METADATA):
                storage.remove(url / name / f)


def remote_latest(url: Location) -> str | None:
    """The checkpoint name ``url/latest`` holds, None without one."""
    pointer = url / LATEST
    return storage.read_text(pointer).strip() if storage.is_file(pointer) else None


def fetch_latest(url: Location, folder: Path) -> None:
    """Make the staging ``folder`` hold the checkpoint ``url/latest`` names, downloaded where ``folder`` has no
    checkpoint as new (a local one newer than the bucket's is one whose upload failed: the run resumes from it)."""
    name = remote_latest(url)
    if name is None:
        return
    step = checkpoint_step(name)
    if step is None:
        raise MissingPath(f"{url / LATEST}: names {name!r}, which is no step-N checkpoint; write the name of the "
                          f"newest complete step-N folder there, or set checkpoints.resume to one")
    local = latest_name(folder) if folder.is_dir() else None
    if local is not None and is_complete(folder / local) and (checkpoint_step(local) or -1) >= step:
        return
    download_checkpoint(url / name, folder / name, NamedBy("checkpoints.checkpoints_path:", "{}"))
    write_latest(folder, folder / name)


def download_checkpoint(src: Location, dest: Path, named: NamedBy) -> Path:
    """The remote checkpoint ``src`` copied to ``dest`` (kept where complete already): downloaded under a temporary
    name, renamed once whole, so a killed download leaves nothing that counts."""
    if is_complete(dest):
        return dest
    if not storage.is_file(src / METADATA):
        raise MissingPath(f"{named.about(src)}: no {METADATA}; it is not a complete checkpoint (its upload was cut "
                          f"short, or it is no step-N folder); {named.another('a complete checkpoint')}")
    tmp = dest.with_name(f"{TMP_PREFIX}{dest.name}-download-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        for name in storage.files_under(src):
            storage.download(src / name, tmp / name)
        try:
            os.replace(tmp, dest)
        except OSError:  # another process of this node put it there first
            if not is_complete(dest):
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return dest


def cached_checkpoint(url: Location, named: NamedBy) -> Path:
    """The local copy of the checkpoint a URL names: a ``step-N`` folder, or a checkpoints folder (its
    ``latest``), downloaded once into the node's cache."""
    if not storage.is_file(url / METADATA) and (name := remote_latest(url)) is not None:
        url = url / name
    dest = shard_cache().root / CHECKPOINTS / key_digest(url.parent.url, 24) / url.name
    dest.parent.mkdir(parents=True, exist_ok=True)
    return download_checkpoint(url, dest, named)
