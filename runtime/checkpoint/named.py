"""The checkpoint a user named — ``checkpoints.resume``, ``--checkpoint``, export's CHECKPOINT: a ``step-N`` folder,
a checkpoints folder (its ``latest``), or a URL of either (downloaded into the node's cache first). Every command
resolves a named checkpoint here, so a missing or incomplete one is said the same way everywhere."""

from __future__ import annotations

import difflib
from pathlib import Path

from nanoset.errors import MissingPath
from nanoset.storage import is_url, location
from runtime.checkpoint.layout import (
    CHECKPOINT_ARGUMENT,
    LATEST,
    METADATA,
    RESUME,
    NamedBy,
    interrupted_save,
    is_complete,
    latest_name,
    saved_checkpoints,
)
from runtime.checkpoint.remote import cached_checkpoint


def _latest(folder: Path, named: NamedBy, given: Path | str) -> Path | None:
    """The checkpoint ``folder/latest`` names (None when nothing was saved yet), or the newer one of a save
    interrupted before its pointer's rename. Without a ``latest`` file, the newest complete checkpoint: a
    checkpoint is complete once its metadata.json is written."""
    interrupted = interrupted_save(folder) if folder.is_dir() else None
    if interrupted is not None:
        return interrupted
    name = latest_name(folder)
    if name is None:
        complete = saved_checkpoints(folder)
        return complete[-1] if complete else None
    path = folder / name
    if not is_complete(path):
        there = ", ".join(p.name for p in saved_checkpoints(folder)) or "none"
        raise MissingPath(f"{named.about(given)}: {folder / LATEST} names {path.name}, which is missing or incomplete "
                          f"(checkpoints there: {there}); {named.another('the path of one of them')}")
    return path


def find_checkpoint(given: str | Path, named: NamedBy = CHECKPOINT_ARGUMENT, choices: str = "") -> Path:
    """The checkpoint a user named: a ``step-N`` folder, or a checkpoints folder (its ``latest``).

    ``named``: how (the error lines start with it and advise in its terms); ``choices`` follows a missing folder's
    "no such folder" (what the option takes). A URL is downloaded into the node's cache first."""
    if is_url(str(given)):
        return cached_checkpoint(location(given), named)
    path = Path(given)
    if is_complete(path):
        return path
    if (path / LATEST).is_file():
        return _latest(path, named, path)
    if not path.exists():
        typo = "; did you mean 'latest'?" if choices and difflib.get_close_matches(str(given), [LATEST]) else ""
        raise MissingPath(f"{named.about(path)}: no such folder{f' ({choices})' if choices else ''}{typo}")
    if not path.is_dir():
        raise MissingPath(f"{named.about(path)}: not a folder; "
                          f"{named.another('a step-N checkpoint folder (or a checkpoints folder, for its latest)')}")
    raise MissingPath(f"{named.about(path)}: no {METADATA}; it is not a complete checkpoint "
                      f"({named.another('a step-N folder')})")


def resolve_resume(folder: Path, resume: str | None) -> Path | None:
    """``checkpoints.resume``: ``latest`` (None when nothing was saved yet), a path, or None (a fresh start)."""
    if resume is None:
        return None
    if resume == LATEST:
        return _latest(folder, RESUME, LATEST)
    return find_checkpoint(resume, RESUME, "latest | PATH of a step-N folder | null")
