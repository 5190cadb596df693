"""Stages that name a Hugging Face dataset (a local path or a ``save_to_disk`` folder) are
tokenized once into a Nanoset cache folder keyed by a fingerprint of the data, the splits, the
text column and the tokenizer; later runs (and every other rank) read the cache."""

from __future__ import annotations

import hashlib
import json
import os
import time
from pathlib import Path

from runtime.config import Config, ConfigError, HFDatasetArgs

WAIT_SECONDS = 3600


def _files_fingerprint(path: Path) -> list:
    files = [path] if path.is_file() else sorted(p for p in path.rglob("*") if p.is_file())
    return [(str(p.relative_to(path) if p != path else p.name), p.stat().st_size, p.stat().st_mtime_ns) for p in files]


def cache_folder(config: Config, ds: HFDatasetArgs) -> Path:
    """Where the tokenized copy of ``ds`` lives; the name changes when anything that matters does."""
    from nanoset.tokenizer import find_tokenizer_file

    src = Path(ds.hf_dataset_or_datasets)
    if not src.exists():
        raise ConfigError(f"hf_dataset_or_datasets {str(src)!r}: no such local file or folder (nothing is "
                          f"downloaded at run time; save the dataset locally first)")
    tok = config.tokenizer
    tok_file = find_tokenizer_file(tok.tokenizer_name_or_path)
    key = json.dumps([str(src.resolve()), _files_fingerprint(src), ds.hf_dataset_splits, ds.text_column_name,
                      hashlib.sha256(tok_file.read_bytes()).hexdigest(), tok.eos_token])
    digest = hashlib.sha256(key.encode()).hexdigest()[:16]
    return Path(config.general.cache_dir) / f"{src.name}-{digest}"


def _splits(ds: HFDatasetArgs) -> list[str] | None:
    if ds.hf_dataset_splits is None:
        return None
    return [ds.hf_dataset_splits] if isinstance(ds.hf_dataset_splits, str) else list(ds.hf_dataset_splits)


def prepare_hf_dataset(config: Config, ds: HFDatasetArgs, build: bool = True) -> Path:
    """Tokenize ``ds`` into its cache folder unless it is there already; returns the folder.

    With ``build=False`` (ranks other than the node's first) wait for another process to do it.
    """
    out = cache_folder(config, ds)
    if (out / "nanoset.json").is_file():
        return out
    if not build:
        deadline = time.time() + WAIT_SECONDS
        while not (out / "nanoset.json").is_file():
            if time.time() > deadline:
                raise TimeoutError(f"{out}: waited {WAIT_SECONDS}s for local rank 0 to tokenize the dataset")
            time.sleep(1.0)
        return out
    from nanoset.tokenize import TokenizeOptions, tokenize

    tokenize(TokenizeOptions(inputs=[ds.hf_dataset_or_datasets], output=out,
                             tokenizer=config.tokenizer.tokenizer_name_or_path, eos_token=config.tokenizer.eos_token,
                             text_column=ds.text_column_name, splits=_splits(ds), progress=False))
    return out


def resolve_stage_folders(config: Config) -> list[list[str]]:
    """The dataset folders of every stage, tokenizing Hugging Face stages into the cache first."""
    build = int(os.environ.get("LOCAL_RANK", "0")) == 0
    out = []
    for i, stage in enumerate(config.data_stages):
        ds = stage.data.dataset
        if isinstance(ds, HFDatasetArgs):
            try:
                out.append([str(prepare_hf_dataset(config, ds, build))])
            except ValueError as e:
                raise ConfigError(f"data_stages[{i}] ({stage.name}).data.dataset: {e}") from None
        else:
            out.append(ds.folders)
    return out
