"""Find and load a Hugging Face ``tokenizers`` tokenizer offline, and decide its EOS token."""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from nanoset.errors import NanosetError
from nanoset.format.spec import TokenizerInfo

EOS_NAMES = ("<|endoftext|>", "</s>", "<|end_of_text|>", "<eos>", "<|eot_id|>", "<|im_end|>", "[SEP]")
BOS_NAMES = ("<|begin_of_text|>", "<s>", "<bos>", "<|startoftext|>", "[CLS]")


@dataclass
class ResolvedTokenizer:
    """A tokenizer file on disk and what the tokenize job needs to know about it."""

    spec: str
    path: Path
    info: TokenizerInfo
    tokenizer: Any = field(default=None, repr=False, compare=False)  # the loaded tokenizers.Tokenizer


def _hub_cache_dirs() -> list[Path]:
    dirs = []
    if os.environ.get("HF_HUB_CACHE"):
        dirs.append(Path(os.environ["HF_HUB_CACHE"]))
    hf_home = Path(os.environ.get("HF_HOME", Path.home() / ".cache" / "huggingface"))
    dirs.append(hf_home / "hub")
    return dirs


def find_tokenizer_file(spec: str) -> Path:
    """``spec`` is a tokenizer.json, a folder holding one, or a hub name already in the local cache."""
    p = Path(spec)
    if p.is_file():
        return p
    if p.is_dir():
        if (p / "tokenizer.json").is_file():
            return p / "tokenizer.json"
        raise NanosetError(f"{p}: folder has no tokenizer.json; pass the tokenizer.json file itself")
    repo = "models--" + spec.replace("/", "--")
    for cache in _hub_cache_dirs():
        hits = sorted((cache / repo / "snapshots").glob("*/tokenizer.json"))
        if hits:
            return hits[-1]
    raise NanosetError(
        f"tokenizer {spec!r}: not a file or folder, and not in the local Hugging Face cache "
        f"({', '.join(str(d) for d in _hub_cache_dirs())}); nothing is downloaded: pass a path to a "
        f"tokenizer.json, or fetch it first with `huggingface-cli download {spec} tokenizer.json`"
    )


def load_tokenizer(path: Path):  # -> tokenizers.Tokenizer
    """The tokenizer at ``path``, set to encode whole documents: a ``truncation`` or ``padding`` section
    in the file (meant for model inputs) would otherwise cut documents short or fill them with pad ids."""
    from tokenizers import Tokenizer

    try:
        tok = Tokenizer.from_file(str(path))
    except Exception as e:  # the Rust side raises a plain Exception for bad JSON
        raise NanosetError(f"{path}: not a valid tokenizers JSON file ({e})") from e
    tok.no_truncation()
    tok.no_padding()
    return tok


def _config_token(folder: Path, key: str) -> str | None:
    """``eos_token`` / ``bos_token`` from a tokenizer_config.json beside the tokenizer, if any."""
    cfg = folder / "tokenizer_config.json"
    if not cfg.is_file():
        return None
    try:
        config = json.loads(cfg.read_text(encoding="utf-8"))
    except ValueError as e:  # ignoring it would choose another EOS without a word
        raise NanosetError(f"{cfg}: not valid JSON ({e}); fix or remove it") from None
    if not isinstance(config, dict):
        raise NanosetError(f"{cfg}: a JSON {type(config).__name__}, not an object; fix or remove it")
    value = config.get(key)
    if isinstance(value, dict):
        value = value.get("content")
    return value if isinstance(value, str) else None


def _special_tokens(tok) -> list[str]:
    return [t.content for t in tok.get_added_tokens_decoder().values() if t.special]


def canonical_name(spec: str, path: Path) -> str:
    """The name recorded in the shards: a hub name as given, else the tokenizer's folder (or file) name,
    so that the bytes written do not depend on where the tokenizer sits or how its path was typed."""
    if not Path(spec).exists():
        return spec
    return path.parent.name if path.name == "tokenizer.json" else path.stem


def resolve_tokenizer(spec: str, eos_token: str | None = None) -> ResolvedTokenizer:
    """Load ``spec`` and settle the EOS id: ``--eos-token``, else the tokenizer's own, else an error."""
    path = find_tokenizer_file(spec)
    tok = load_tokenizer(path)
    specials = _special_tokens(tok)
    if eos_token is not None:
        eos_id = tok.token_to_id(eos_token)
        if eos_id is None:
            raise NanosetError(
                f"--eos-token {eos_token!r} is not in tokenizer {path}; its special tokens are: {specials}"
            )
    else:
        declared = _config_token(path.parent, "eos_token")
        candidates = [declared] if declared else [n for n in EOS_NAMES if n in specials]
        if declared and tok.token_to_id(declared) is None:
            raise NanosetError(f"{path.parent / 'tokenizer_config.json'}: eos_token {declared!r} is not in the "
                               f"tokenizer {path}; fix it or pass --eos-token TOKEN")
        if not candidates or tok.token_to_id(candidates[0]) is None:
            raise NanosetError(
                f"tokenizer {path} declares no EOS token; pass --eos-token TOKEN "
                f"(its special tokens are: {specials or 'none'})"
            )
        eos_token = candidates[0]
        eos_id = tok.token_to_id(eos_token)
    bos = _config_token(path.parent, "bos_token") or next((n for n in BOS_NAMES if n in specials), None)
    info = TokenizerInfo(
        name=canonical_name(spec, path),
        vocab_size=tok.get_vocab_size(with_added_tokens=True),
        eos_id=int(eos_id),
        eos_token=eos_token,
        bos_id=tok.token_to_id(bos) if bos else None,
        sha256=hashlib.sha256(path.read_bytes()).hexdigest(),
        path=str(path),
    )
    return ResolvedTokenizer(spec=spec, path=path, info=info, tokenizer=tok)
