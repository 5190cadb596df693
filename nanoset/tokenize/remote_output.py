"""``nanoset tokenize ... -o s3://...``: a tokenize job whose output is a folder in an object store.

The job runs as any other into a local staging folder (in the node's storage cache, kept between runs, so a
rerun resumes there and an interrupted upload is finished), then every file of the finished dataset is uploaded
and the manifest last: a folder without a manifest is no dataset, so its upload is the commit point. A rerun
uploads only the objects the store lacks or holds with other bytes (size and md5 against the ETag). The bytes
are those of a local tokenize of the same inputs: the job does not know where its output goes.

One machine writes one object-store output (the store has no folder lock the machines of a Slurm array could
share): ``--num-tasks`` with a URL is refused in one line; its ``--workers`` run in parallel as ever.
"""

from __future__ import annotations

import dataclasses
import shutil
from collections.abc import Callable
from pathlib import Path

from nanoset import storage
from nanoset.cache import key_digest
from nanoset.errors import NanosetError
from nanoset.format.spec import MANIFEST_NAME, is_dataset_file
from nanoset.remote_cache import shard_cache
from nanoset.storage import Location
from nanoset.tokenize.job import TokenizeOptions, TokenizeSummary, tokenize

STAGING = "staging"


def staging_folder(url: Location) -> Path:
    """The local folder a job writing ``url`` runs in (the same for every run of it on this node)."""
    return shard_cache().root / STAGING / key_digest(url.url, 24)


def tokenize_to_store(opts: TokenizeOptions, url: Location,
                      on_start: Callable[[], None] | None = None) -> TokenizeSummary:
    """Run (or resume) the job in its staging folder, then publish the finished dataset to ``url``."""
    if opts.num_tasks != 1:
        raise NanosetError(f"{url}: --num-tasks {opts.num_tasks} needs a folder all the machines share; an "
                           f"object-store output is written by one machine (use --workers there), or tokenize "
                           f"into a shared folder and upload it")
    stage = staging_folder(url)
    if opts.overwrite:
        shutil.rmtree(stage, ignore_errors=True)
    summary = tokenize(dataclasses.replace(opts, output=stage), on_start)
    if summary.complete:
        publish(stage, url, opts.overwrite)
    return dataclasses.replace(summary, output=url)  # type: ignore[arg-type]


def publish(stage: Path, url: Location, overwrite: bool) -> None:
    """Upload the dataset in ``stage`` to ``url``, the manifest last; refuse to replace another dataset there
    unless ``overwrite``. Objects already there with the same bytes are kept as they are."""
    manifest = stage / MANIFEST_NAME
    remote_manifest = url / MANIFEST_NAME
    if storage.is_file(remote_manifest) and not storage.holds_copy(remote_manifest, manifest) and not overwrite:
        raise NanosetError(f"{url}: holds another dataset (its {MANIFEST_NAME} differs); --overwrite replaces it, "
                           f"or choose another output")
    files = sorted(p.name for p in stage.iterdir() if p.is_file() and not p.name.startswith(".")
                   and is_dataset_file(p.name) and p.name != MANIFEST_NAME)
    for name in files:
        if not storage.holds_copy(url / name, stage / name):
            storage.upload(stage / name, url / name)
    if not storage.holds_copy(remote_manifest, manifest):
        storage.upload(manifest, remote_manifest)
    if overwrite:  # the replaced dataset's files that the new one does not have
        for name in storage.list_names(url):
            if is_dataset_file(name) and name != MANIFEST_NAME and name not in files:
                storage.remove(url / name)
