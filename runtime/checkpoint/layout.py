"""Where checkpoints live and what they are called: the only code that knows ``step-N``, ``latest`` and
``metadata.json``.

A run's checkpoints folder holds ``step-000040`` folders (DCP files, one RNG file per rank and
``metadata.json``: the checkpoint record, see ``record``), the ``latest`` file
naming the newest, and ``.tmp-*`` folders of saves in progress. A checkpoint is complete when its
``metadata.json`` exists (it is written last). Every command that takes a checkpoint resolves and
reads it here, so a missing or damaged one is said the same way everywhere.
"""

from __future__ import annotations

import difflib
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from nanoset.atomic import atomic_write_text, fsync_dir, write_beside
from nanoset.errors import ConfigError, MissingPath
from nanoset.storage import Location, is_url, location
from runtime.config import Config
from runtime.config.schema import SHAPE_KEYS, ModelArgs

LATEST = "latest"
METADATA = "metadata.json"
TMP_PREFIX = ".tmp-"  # saves in progress (and checkpoints being discarded): stale after a crash


def rng_file(checkpoint: Path, rank: int) -> Path:
    """Each rank's RNG states (Python, numpy, torch, CUDA) in a checkpoint."""
    return checkpoint / f"rng-rank{rank}.pt"


@dataclass(frozen=True)
class NamedBy:
    """How the user named a checkpoint, for the error lines about it: the trainer's config key or a command's
    argument. Every such line starts with it and the path (``checkpoints.resume: PATH: ...``, ``--checkpoint PATH:
    ...``) and its advice is about what that user can change (a config key, a command-line argument)."""

    name: str  # what starts the line
    advice: str  # how to name another checkpoint, with {} for what

    def about(self, path: Path | str) -> str:
        return f"{self.name} {path}"

    def another(self, what: str) -> str:
        return self.advice.format(what)


RESUME = NamedBy("checkpoints.resume:", "set checkpoints.resume to {}")  # the trainer
CHECKPOINT_OPTION = NamedBy("--checkpoint", "pass {} as --checkpoint")  # explain, evaluate
CHECKPOINT_ARGUMENT = NamedBy("checkpoint", "give {} as the checkpoint")  # export's CHECKPOINT


def checkpoints_folder(config: Config) -> Path:
    """Where the run writes its checkpoints on this machine: ``checkpoints.checkpoints_path``, or the run folder's
    ``checkpoints`` (also the staging folder of a ``checkpoints_path`` URL, ``checkpoints_url``)."""
    path = config.checkpoints.checkpoints_path
    return Path(path) if path and not is_url(path) else config.general.run_path / "checkpoints"


def checkpoints_url(config: Config) -> Location | None:
    """``checkpoints.checkpoints_path`` where it is a URL: every checkpoint is uploaded there (``remote``)."""
    path = config.checkpoints.checkpoints_path
    return location(path) if path and is_url(path) else None


def checkpoint_name(step: int) -> str:
    return f"step-{step:06d}"


def checkpoint_step(name: str) -> int | None:
    """The step of a checkpoint folder name (``step-000040`` → 40), None for other names."""
    m = re.fullmatch(r"step-(\d+)", name)
    return int(m.group(1)) if m else None


def is_complete(path: Path) -> bool:
    return (path / METADATA).is_file()


def saved_checkpoints(folder: Path) -> list[Path]:
    """The complete checkpoints in ``folder``, oldest first by step number (not by name)."""
    if not folder.is_dir():
        return []
    found = [(step, p) for p in folder.iterdir() if (step := checkpoint_step(p.name)) is not None and is_complete(p)]
    return [p for _, p in sorted(found)]


def step_folders(folder: Path) -> list[tuple[int, Path]]:
    """Every ``step-N`` folder in ``folder`` (complete or not), by step number."""
    return sorted((step, p) for p in folder.iterdir() if p.is_dir() and (step := checkpoint_step(p.name)) is not None)


def latest_name(folder: Path) -> str | None:
    """The checkpoint name ``folder/latest`` holds, None without one."""
    pointer = folder / LATEST
    return pointer.read_text().strip() if pointer.is_file() else None


def write_latest(folder: Path, checkpoint: Path) -> None:
    atomic_write_text(folder / LATEST, checkpoint.name + "\n")


def stage_latest(folder: Path, checkpoint: Path) -> Path:
    """``latest`` naming ``checkpoint``, written beside it under a temporary name while the checkpoint is written
    (where a full disk is handled like any of its files); ``commit_latest`` renames it into place, which needs no
    space."""
    return write_beside(folder / LATEST, lambda f: f.write((checkpoint.name + "\n").encode()))


def commit_latest(folder: Path, staged: Path) -> None:
    os.replace(staged, folder / LATEST)
    fsync_dir(folder)


def stale_temporaries(folder: Path) -> list[Path]:
    """What saves that a crash interrupted leave in a checkpoints folder: ``.tmp-*`` folders and a staged
    ``latest`` (``.latest.tmp-*``)."""
    return sorted([*folder.glob(TMP_PREFIX + "*"), *folder.glob(f".{LATEST}.tmp-*")])


def interrupted_save(folder: Path) -> Path | None:
    """A complete checkpoint that a staged ``latest`` names, newer than the one ``latest`` names: a save killed
    between the checkpoint's rename and the pointer's. It is the newest checkpoint of the run (resuming the
    older one would take it for a later branch and rewind)."""
    current = checkpoint_step(latest_name(folder) or "")
    newest = None
    for staged in folder.glob(f".{LATEST}.tmp-*"):
        try:
            path = folder / staged.read_text().strip()
        except OSError:
            continue
        step = checkpoint_step(path.name)
        if step is not None and is_complete(path) and (current is None or step > current) and (
                newest is None or step > checkpoint_step(newest.name)):
            newest = path
    return newest


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
        from runtime.checkpoint.remote import cached_checkpoint  # it builds on this module

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


class SavedModel(Protocol):
    """What ``check_same_model`` reads of a checkpoint's record (``runtime.checkpoint.record``, which builds on
    this module): its model section."""

    model: dict


def check_same_model(config: Config, record: SavedModel, path: Path, named: NamedBy = RESUME) -> None:
    """Refuse a checkpoint saved with another model shape (it would load partly, or crash on every rank)."""
    saved = dict(record.model)
    now = config.to_dict()["model"]
    for d in (saved, now):  # compare the family (a record without one is Llama's), key/value heads and head size
        if d.get("family") is None:
            d["family"] = ModelArgs.family
        if d.get("num_key_value_heads") is None:
            d["num_key_value_heads"] = d.get("num_attention_heads")
        if d.get("head_dim") is None and d.get("hidden_size") and d.get("num_attention_heads"):
            d["head_dim"] = d["hidden_size"] // d["num_attention_heads"]
    diff = [f"{k} {saved.get(k)} → {now[k]}" for k in SHAPE_KEYS if saved.get(k) != now[k]]
    if diff:
        raise ConfigError(f"{named.about(path)}: saved with another model: model.{', model.'.join(diff)}; use the "
                          f"checkpoint's model section in the config, or {named.another('another checkpoint')}")


def earlier_checkpoints_hint(checkpoint: Path, named: NamedBy = RESUME) -> str:
    """What to use instead of a damaged ``checkpoint``: the newest complete checkpoint before it, if any (in the
    terms of ``named``: the trainer resumes it, a command is given it)."""
    step = checkpoint_step(checkpoint.name)
    earlier = [p for p in saved_checkpoints(checkpoint.parent) if (checkpoint_step(p.name) or 0) < step] \
        if step is not None else []
    if named is RESUME:
        if step is None:  # a folder not named step-N: nothing to say what came before it
            return "set checkpoints.resume to another checkpoint and rerun"
        if earlier:
            return f"set checkpoints.resume: {earlier[-1]} (an earlier checkpoint) and rerun"
        return "no earlier checkpoint is there: start over (checkpoints.resume: null, checkpoints.replace_run: true)"
    if earlier:
        return f"{named.another(str(earlier[-1]))} (the newest complete checkpoint before it)"
    return "choose another checkpoint"  # none before it (or a folder not named step-N)
