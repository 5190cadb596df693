"""The tokenizer files of a Hugging Face export: those of the data the checkpoint's stage trained on (its
``tokenizer.json``, the ``tokenizer_config.json`` beside it with the recorded chat template and special tokens),
or those of a folder the user chose (``runtime.export --tokenizer DIR``), copied as they are."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from nanoset.atomic import atomic_write_text
from nanoset.errors import ConfigError
from runtime.checkpoint.tokenizer_record import TokenizerRecord

CONFIG = "tokenizer_config.json"
SIDE_FILES = (CONFIG, "special_tokens_map.json")  # beside the data's tokenizer.json
FOLDER_FILES = ("tokenizer.json", *SIDE_FILES, "chat_template.jinja")  # of a folder the user chose


def check_tokenizer_folder(folder: str | Path) -> None:
    """``--tokenizer DIR`` must hold a ``tokenizer.json`` (checked before any weight is read)."""
    if not (Path(folder) / "tokenizer.json").is_file():
        what = "no such folder" if not Path(folder).exists() else "no tokenizer.json there"
        raise ConfigError(f"--tokenizer {folder}: {what}; give a Hugging Face tokenizer folder (with tokenizer.json)")


def copy_tokenizer_folder(folder: Path, out: Path) -> str:
    """The tokenizer files of ``folder`` into ``out``, unchanged; says what was done (for the log)."""
    for name in FOLDER_FILES:
        if (folder / name).is_file():
            shutil.copyfile(folder / name, out / name)
    return f"tokenizer files from {folder} (--tokenizer)"


def write_data_tokenizer(record: TokenizerRecord | None, out: Path, max_positions: int) -> str:
    """The data's tokenizer files beside the weights, its ``tokenizer_config.json`` carrying the chat template that
    rendered the stage's conversations and the special tokens, and (where it states one) the exported model's
    ``max_positions`` as ``model_max_length``, not the length of the model the tokenizer came with; says what was
    done (for the log)."""
    info = record.info if record is not None else None
    if info is None or not info.path:
        return "no tokenizer recorded for the data: tokenizer files not written"
    src = Path(info.path)
    if not src.is_file():
        where = (f"recorded relative to the directory the data was tokenized in, and not found from {Path.cwd()}"
                 if not src.is_absolute() else "no longer there")
        return (f"the data's tokenizer {src} is {where}: tokenizer files not written; copy its tokenizer.json (and "
                f"tokenizer_config.json) into the output folder, or pass --tokenizer DIR")
    if not info.matches_file(src):
        return f"{src} changed since the data was made (sha256): tokenizer files not written; pass --tokenizer DIR"
    shutil.copyfile(src, out / "tokenizer.json")
    for name in SIDE_FILES:
        if (src.parent / name).is_file():
            shutil.copyfile(src.parent / name, out / name)
    config = _read_config(out / CONFIG)
    wanted = dict(config)
    if not (out / CONFIG).is_file():  # transformers needs one to load tokenizer.json
        wanted["tokenizer_class"] = "PreTrainedTokenizerFast"
    for key, token in record.special_tokens.items():
        wanted.setdefault(key, token)
    if info.eos_token:
        wanted.setdefault("eos_token", info.eos_token)
    if "model_max_length" in wanted:
        wanted["model_max_length"] = max_positions
    if record.chat_template is not None:  # the template that rendered the stage's conversations wins
        wanted["chat_template"] = record.chat_template
    if wanted != config or not (out / CONFIG).is_file():
        atomic_write_text(out / CONFIG, json.dumps(wanted, indent=2, ensure_ascii=False) + "\n")
    chat = f", chat template of stage {record.stage!r}" if record.chat_template is not None else ""
    return f"tokenizer files from {src.parent}{chat}"


def _read_config(path: Path) -> dict:
    """A copied ``tokenizer_config.json`` ({} without one, or for one that is no JSON object: rewritten)."""
    if not path.is_file():
        return {}
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}
