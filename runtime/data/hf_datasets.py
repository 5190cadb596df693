"""Hugging Face datasets (not models: those are ``runtime.hf``) as Nanoset folders. A stage that names one
(a local path or a ``save_to_disk`` folder) is tokenized once, by the tokenize job, into a Nanoset folder
in the cache, keyed by the inputs (their paths and stamps, the splits) and the job's own key of its options
(``nanoset.tokenize.plan_key``: the tokenizer, EOS, the text column, or for an ``sft`` stage of
conversations the chat template, its special tokens, the mask rule and the columns — it is tokenized as
``nanoset tokenize --chat``, with loss masks); later runs (and every other rank) read it.

Every process of a run may find the cache missing, on one node or on many sharing the cache
folder. An exclusive lock file next to the cache (``fcntl`` record locks: across processes and,
on NFS, across nodes) makes exactly one of them tokenize; the others wait for the lock, find the
finished folder and read it. A process that dies releases its lock and the next one resumes the
tokenize job. The fingerprint of the input files holds their stamps (size, mtime, ctime, inode), so an
input rewritten in place (even with its size and mtime restored) gets a new cache folder.
"""

from __future__ import annotations

import errno
import fcntl
import hashlib
import json
import os
import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING

from nanoset.atomic import writable_folder
from nanoset.cache import file_stamp
from nanoset.errors import BadRowError, MissingColumnError, NanosetError, OptionError, WaitTimeout
from nanoset.format.spec import MANIFEST_NAME
from runtime.config import Config, ConfigError, HFDatasetArgs

if TYPE_CHECKING:
    from nanoset.tokenize import TokenizeOptions

HEARTBEAT_SECONDS = 30  # the lock holder touches the lock file this often while it tokenizes
STALE_SECONDS = 900  # a holder silent for this long (hung, e.g. on a dead NFS mount) is given up on


def _files_fingerprint(path: Path) -> list:
    files = [path] if path.is_file() else sorted(p for p in path.rglob("*") if p.is_file())
    out = []
    for p in files:
        out.append((str(p.relative_to(path) if p != path else p.name), *file_stamp(p)))
    return out


def tokenize_options(config: Config, ds: HFDatasetArgs, output: Path) -> TokenizeOptions:
    """The options of the tokenize job that makes the stage's dataset ``ds`` into ``output``."""
    from nanoset.tokenize import TokenizeOptions

    return TokenizeOptions(inputs=[ds.hf_dataset_or_datasets], output=output,
                           tokenizer=config.tokenizer.tokenizer_name_or_path, eos_token=config.tokenizer.eos_token,
                           text_column=ds.text_column_name, splits=_splits(ds), progress=True, chat=ds.sft,
                           chat_template=ds.chat_template, messages_column=ds.messages_column_name,
                           prompt_column=ds.prompt_column_name, completion_column=ds.completion_column_name)


def cache_folder(config: Config, ds: HFDatasetArgs, where: str = "data.dataset") -> Path:
    """Where the tokenized copy of ``ds`` lives: named by the inputs and the job's key of its options, so it
    changes when anything that changes the bytes does."""
    from nanoset.tokenize import plan_key

    src = Path(ds.hf_dataset_or_datasets)
    if not src.exists():
        cwd = "" if src.is_absolute() else f" in the working directory {Path.cwd()}"
        raise ConfigError(f"{where}.hf_dataset_or_datasets: {str(src)!r}: no such local file or folder{cwd} (nothing "
                          f"is downloaded at run time; save the dataset locally first)")
    root = config.general.cache_path
    try:
        options = plan_key(tokenize_options(config, ds, root))  # the output does not change the key
    except OptionError as e:  # named by its config key, not the command's flag
        if e.option == "tokenizer":
            raise ConfigError(f"tokenizer.tokenizer_name_or_path (the tokenizer of {where}): "
                              f"{_in_config_terms(str(e))}") from None
        raise ConfigError(f"{where}.{e.option}: {e}") from None
    key = json.dumps([str(src.resolve()), _files_fingerprint(src), ds.hf_dataset_splits, options])
    return root / f"{src.name}-{hashlib.sha256(key.encode()).hexdigest()[:16]}"


def _splits(ds: HFDatasetArgs) -> list[str] | None:
    if ds.hf_dataset_splits is None:
        return None
    return [ds.hf_dataset_splits] if isinstance(ds.hf_dataset_splits, str) else list(ds.hf_dataset_splits)


def _check_splits(ds: HFDatasetArgs, where: str) -> None:
    """Requested splits exist in the saved ``DatasetDict``; the error lists those there are."""
    wanted = _splits(ds)
    if wanted is None:
        return
    src = Path(ds.hf_dataset_or_datasets)
    index = src / "dataset_dict.json"
    if not index.is_file():
        raise ConfigError(f"{where}.hf_dataset_splits: {src} has no splits (it is not a DatasetDict saved with "
                          f"save_to_disk); remove hf_dataset_splits")
    there = json.loads(index.read_text())["splits"]
    missing = [s for s in wanted if s not in there]
    if missing:
        raise ConfigError(f"{where}.hf_dataset_splits: no split {', '.join(map(repr, missing))} in {src}; the "
                          f"splits there are: {', '.join(there)}")


@contextmanager
def _exclusive(lock: Path, out: Path) -> Iterator[None]:
    """Hold the exclusive lock ``lock`` while preparing ``out``.

    Waits as long as the holder is alive: a dead holder releases the lock by itself, and a live one
    touches the lock file every ``HEARTBEAT_SECONDS`` however long the tokenization takes (a fixed
    time limit failed every other rank of a run whose dataset takes longer). Only a holder silent
    for ``STALE_SECONDS`` is given up on."""
    with open(lock, "a+") as f:
        since, waiting = time.time(), False
        while True:
            try:
                fcntl.lockf(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except OSError as e:  # held by another process, or no locks on this filesystem
                if e.errno not in (errno.EAGAIN, errno.EACCES):
                    raise ConfigError(f"general.cache_dir: {lock.parent} does not support file locks ({e.strerror}), "
                                      f"which keep two processes from tokenizing into one cache; set cache_dir on "
                                      f"a filesystem that does (a node-local disk: each node then prepares its own "
                                      f"copy)") from None
                silent = time.time() - max(os.fstat(f.fileno()).st_mtime, since)
                f.seek(0)
                holder = f.read().strip() or "another process"
                if silent > STALE_SECONDS:
                    raise WaitTimeout(f"{out}: {holder} holds {lock} but has shown no sign of life for "
                                      f"{silent:.0f}s; if it is gone, rerun") from None
                if not waiting:
                    print(f"waiting for {holder} to tokenize into {out}", flush=True)
                    waiting = True
                time.sleep(0.5)
        f.seek(0)
        f.truncate()
        f.write(f"{socket.gethostname()} pid {os.getpid()}\n")
        f.flush()
        stop = threading.Event()
        beat = threading.Thread(target=_heartbeat, args=(lock, stop), daemon=True)
        beat.start()
        try:
            yield
        finally:
            stop.set()
            beat.join()
            fcntl.lockf(f, fcntl.LOCK_UN)


def _heartbeat(lock: Path, stop: threading.Event) -> None:
    while not stop.wait(HEARTBEAT_SECONDS):
        os.utime(lock)


def prepare_hf_dataset(config: Config, ds: HFDatasetArgs, where: str = "data.dataset") -> Path:
    """Tokenize ``ds`` into its cache folder unless it is there already (once per cache, whatever the
    number of processes and nodes preparing it at the same time); returns the folder."""
    out = cache_folder(config, ds, where)
    if (out / MANIFEST_NAME).is_file():
        return out
    _check_splits(ds, where)
    writable_folder(out.parent, "set general.cache_dir to a writable folder")
    with _exclusive(out.parent / f".{out.name}.lock", out):
        if (out / MANIFEST_NAME).is_file():  # another process finished it while this one waited
            return out
        from nanoset.tokenize import tokenize

        def announce() -> None:  # once the tokenizer, the template and the inputs are checked: work starts
            print(f"{where}: the Hugging Face dataset {ds.hf_dataset_or_datasets} is tokenized into {out}, once "
                  f"(other processes and later runs read it)", flush=True)

        try:
            tokenize(tokenize_options(config, ds, out), on_start=announce)
        except MissingColumnError as e:
            keys = ("messages_column_name (or prompt_column_name and completion_column_name)" if ds.sft
                    else "text_column_name")
            chat = f", which hold conversations: set {where}.sft: true" if e.conversations and not ds.sft else ""
            raise ConfigError(f"{where}.{keys}: {e.column!r} is not a column of {e.where}; the columns "
                              f"there are: {', '.join(map(str, e.columns)) or 'none'}{chat}") from None
    return out


def resolve_stage_folders(config: Config) -> list[list[str]]:
    """The dataset folders of every stage, tokenizing Hugging Face stages into the cache first."""
    out = []
    for i, stage in enumerate(config.data_stages):
        ds = stage.data.dataset
        if isinstance(ds, HFDatasetArgs):
            where = f"data_stages[{i}] ({stage.name}).data.dataset"
            try:
                out.append([str(prepare_hf_dataset(config, ds, where))])
            except ConfigError:
                raise
            except BadRowError as e:  # a stage has no --skip-bad-lines: say what to do instead
                raise ConfigError(f"{where}: {_in_config_terms(e.problem)}; fix or remove that row, or tokenize the "
                                  f"data with `nanoset tokenize --skip-bad-lines` (and --chat for conversations) and "
                                  f"list that folder as dataset_folder instead") from None
            except NanosetError as e:
                raise ConfigError(f"{where}: {_in_config_terms(str(e))}") from None
        else:
            out.append(ds.folders)
    return out


def _in_config_terms(message: str) -> str:
    """A tokenize error says what to do in the config, not with a flag the config lacks (--eos-token is the
    config's tokenizer.eos_token)."""
    message = message.replace("pass --eos-token TOKEN", "set tokenizer.eos_token: TOKEN in the config")
    message = message.replace("pass a path to a tokenizer.json", "set tokenizer.tokenizer_name_or_path to a "
                              "tokenizer.json (or a folder holding one)")
    message = message.replace("pass the tokenizer.json file itself", "set tokenizer.tokenizer_name_or_path to a "
                              "tokenizer.json (or a folder holding one)")
    return message.replace("--eos-token ", "tokenizer.eos_token ")
