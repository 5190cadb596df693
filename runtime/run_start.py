"""Where a run starts, decided on every rank before any process group exists.

The checkpoint to resume from is resolved and its ``metadata.json`` read here, the model it was
saved with compared to the config, and a fresh start in a folder that already holds a run refused
(unless ``checkpoints.replace_run`` moves the old run aside): every such mistake is one line,
printed once, instead of a traceback from every rank after start-up. Two runs are never mixed in
one folder.
"""

from __future__ import annotations

import difflib
import errno
import fcntl
import os
import re
import socket
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

from runtime.config import Config, ConfigError
from runtime.data.order.record import read_metadata_json

LATEST = "latest"
# the model keys that shape the parameters; rope_theta, rms_norm_eps, max_position_embeddings,
# init_std and dtype may change on resume (e.g. to extend the context)
SHAPE_KEYS = ("hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads",
              "intermediate_size", "vocab_size", "tie_word_embeddings", "head_dim")


@dataclass
class RunStart:
    checkpoint: Path | None  # the checkpoint to resume from; None: step 0
    metadata: dict | None  # its metadata.json
    replace_old_run: bool = False  # a fresh start where a run exists: global rank 0 moves the old one aside
    lock: IO | None = field(default=None, repr=False)  # global rank 0: held while the run lives (see run_lock)


def checkpoints_folder(config: Config) -> Path:
    return Path(config.checkpoints.checkpoints_path or config.general.run_path / "checkpoints")


def checkpoint_step(name: str) -> int | None:
    """The step of a checkpoint folder name (``step-000040`` → 40), None for other names."""
    m = re.fullmatch(r"step-(\d+)", name)
    return int(m.group(1)) if m else None


def saved_checkpoints(folder: Path) -> list[Path]:
    """The complete checkpoints in ``folder``, oldest first by step number (not by name)."""
    if not folder.is_dir():
        return []
    found = [(step, p) for p in folder.iterdir()
             if (step := checkpoint_step(p.name)) is not None and (p / "metadata.json").is_file()]
    return [p for _, p in sorted(found)]


def resolve_checkpoint(folder: Path, resume: str | None) -> Path | None:
    """``checkpoints.resume``: ``latest`` (None when nothing was saved yet), a path, or None."""
    if resume is None:
        return None
    if resume == LATEST:
        pointer = folder / LATEST
        if not pointer.is_file():
            orphans = saved_checkpoints(folder)
            if orphans:
                raise FileNotFoundError(f"{folder}: checkpoints {', '.join(p.name for p in orphans)} but no `latest` "
                                        f"pointer; set checkpoints.resume to one of them")
            return None
        path = folder / pointer.read_text().strip()
        if not (path / "metadata.json").is_file():
            there = ", ".join(p.name for p in saved_checkpoints(folder)) or "none"
            raise FileNotFoundError(f"{pointer} names {path.name}, which is missing or incomplete (checkpoints there: "
                                    f"{there}); set checkpoints.resume to one of them")
        return path
    path = Path(resume)
    if not (path / "metadata.json").is_file():
        what = "no such folder" if not path.exists() else "no metadata.json; it is not a complete checkpoint"
        typo = "; did you mean 'latest'?" if not path.exists() and difflib.get_close_matches(resume, [LATEST]) else ""
        raise FileNotFoundError(f"checkpoints.resume: {path}: {what} (latest | PATH of a step-N folder | null){typo}")
    return path


def read_metadata(path: Path) -> dict:
    """A checkpoint's ``metadata.json``, checked to hold a training record and the model it was saved with."""
    try:
        metadata = read_metadata_json(path)
    except OSError as e:
        raise FileNotFoundError(f"{path / 'metadata.json'}: unreadable ({e}); choose another "
                                f"checkpoints.resume") from None
    if not isinstance(metadata.get("config"), dict) or not isinstance(metadata["config"].get("model"), dict):
        raise ConfigError(f"{path / 'metadata.json'}: records no model section (config.model); give a step-N "
                          f"folder that a run saved as checkpoints.resume")
    return metadata


def check_same_model(config: Config, metadata: dict, path: Path) -> None:
    """Refuse a checkpoint saved with another model shape (it would load partly, or crash on every rank)."""
    saved = dict(metadata.get("config", {}).get("model", {}))
    now = config.to_dict()["model"]
    for d in (saved, now):  # compare the effective number of key/value heads
        if d.get("num_key_value_heads") is None:
            d["num_key_value_heads"] = d.get("num_attention_heads")
        if d.get("head_dim") is None and d.get("hidden_size") and d.get("num_attention_heads"):
            d["head_dim"] = d["hidden_size"] // d["num_attention_heads"]
    diff = [f"{k} {saved.get(k)} → {now[k]}" for k in SHAPE_KEYS if saved.get(k) != now[k]]
    if diff:
        raise ConfigError(f"checkpoint {path} was saved with another model: model.{', model.'.join(diff)}; "
                          f"use the checkpoint's model section, or another checkpoints.resume")


def existing_run(config: Config) -> list[str]:
    """What of a run the run folder (and checkpoints folder) already holds; empty when none."""
    found = []
    metrics = config.general.run_path / "metrics.jsonl"
    if metrics.is_file() and metrics.stat().st_size > 0:
        found.append(str(metrics))
    folder = checkpoints_folder(config)
    if folder.is_dir() and any(p.name == LATEST or checkpoint_step(p.name) is not None for p in folder.iterdir()):
        found.append(str(folder))
    return found


def run_lock(config: Config) -> IO | None:
    """An exclusive lock, held by global rank 0 while the run lives, on ``.<run_dir>.lock`` next to the run
    folder (so it survives ``replace_run`` renaming the folder): a second launch of the same run (submitted
    twice, or requeued while the first still runs) is refused instead of writing into the same folder."""
    check_writable(config.general.run_path, "general.run_dir", moving=False)
    run = Path(os.path.realpath(config.general.run_path))
    run.parent.mkdir(parents=True, exist_ok=True)
    f = open(run.parent / f".{run.name}.lock", "a+")
    try:
        fcntl.lockf(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as e:
        if e.errno not in (errno.EAGAIN, errno.EACCES):  # a filesystem without locks (Lustre -o noflock)
            f.close()
            return None
        f.seek(0)
        holder = f.read().strip() or "another process"
        f.close()
        raise ConfigError(f"{config.general.run_path}: another run is training in this folder ({holder}); wait "
                          f"for it to end or stop it, or choose another general.run_dir") from None
    f.seek(0)
    f.truncate()
    f.write(f"{socket.gethostname()} pid {os.getpid()}\n")
    f.flush()
    return f


def plan_start(config: Config) -> RunStart:
    """Resolve the checkpoint, check it fits the model, and refuse to mix two runs in one folder."""
    lock = run_lock(config) if int(os.environ.get("RANK", "0")) == 0 else None
    folder = checkpoints_folder(config)
    path = resolve_checkpoint(folder, config.checkpoints.resume)
    metadata = read_metadata(path) if path is not None else None
    if path is not None:
        check_same_model(config, metadata, path)
        last = metadata["training"]["last_train_step"]
        if last > config.tokens.train_steps:  # it would train nothing and report "done: step 12/10"
            raise ConfigError(f"checkpoint {path} is at step {last}, past tokens.train_steps "
                              f"{config.tokens.train_steps}; raise tokens.train_steps or resume from an earlier "
                              f"checkpoint")
    continues = config.checkpoints.resume == LATEST or (
        path is not None and path.resolve().parent == folder.resolve())
    found = [] if continues else existing_run(config)
    if found and not config.checkpoints.replace_run:
        how = "starts fresh" if path is None else f"starts from {path}"
        raise ConfigError(f"{config.general.run_path}: holds a run ({', '.join(found)}) and this config {how}; "
                          f"set checkpoints.resume: latest to continue it, checkpoints.replace_run: true to move it "
                          f"aside, or another general.run_dir")
    check_writable(config.general.run_path, "general.run_dir", moving=bool(found))
    check_writable(folder, "checkpoints.checkpoints_path", moving=bool(found))
    return RunStart(path, metadata, replace_old_run=bool(found), lock=lock)


def check_writable(folder: Path, key: str, moving: bool) -> None:
    """Refuse a run or checkpoints folder that cannot be created (or, ``moving`` an old run aside, renamed)
    here, before any process group, instead of a traceback from rank 0 after start-up."""
    target = Path(os.path.realpath(folder))
    existing = target
    while not existing.exists():
        existing = existing.parent
    if not existing.is_dir():
        raise ConfigError(f"{key}: {folder}: {existing} is not a folder; choose another {key}")
    for d in [existing] + ([target.parent] if moving and target.exists() else []):
        if not os.access(d, os.W_OK | os.X_OK):
            raise ConfigError(f"{key}: {folder}: cannot write in {d}; choose another {key} or make it writable")
        try:  # os.access says yes to root everywhere, even where nothing can be made (/proc, /sys)
            os.rmdir(tempfile.mkdtemp(prefix=".nanoset-probe-", dir=d))
        except OSError as e:
            raise ConfigError(f"{key}: {folder}: cannot create a folder in {d} ({e.strerror}); choose another "
                              f"{key}") from None


def move_aside(config: Config) -> list[Path]:
    """Rename the old run folder (and its checkpoints folder when that is elsewhere) to ``NAME.old-<UTC time>``."""
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    run = config.general.run_path.resolve()
    moved = []
    for src in (run, checkpoints_folder(config).resolve()):
        if src.exists() and (src == run or run not in src.parents):
            dst = src.with_name(f"{src.name}.old-{stamp}")
            n = 1
            while dst.exists():
                dst, n = src.with_name(f"{src.name}.old-{stamp}-{n}"), n + 1
            src.rename(dst)
            src.mkdir()  # a run folder given as a link keeps pointing at a folder
            moved.append(dst)
    return moved
