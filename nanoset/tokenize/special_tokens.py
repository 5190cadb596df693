"""The special tokens of a tokenizer folder as ``transformers`` (≥ 5) reads them, from the files beside
``tokenizer.json``: which strings a chat template gets as ``bos_token``, ``eos_token``, ... and which
tokens are registered before encoding.

Why: ``tokenizer.json`` is not the whole tokenizer. ``transformers`` also reads ``tokenizer_config.json``
(its named tokens, ``added_tokens_decoder``, ``extra_special_tokens`` / ``additional_special_tokens``,
model-specific ``*_token`` keys) and, for a folder whose config has no ``added_tokens_decoder``,
``special_tokens_map.json`` over it; every token declared there but missing from ``tokenizer.json``'s
added tokens is added before anything is encoded (a rendered ``<|endoftext|>`` is then one id, not seven
pieces). The order they are added in decides the ids of tokens new to the vocabulary, so it is kept.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from nanoset.errors import NanosetError

CONFIG = "tokenizer_config.json"
SPECIAL_TOKENS_MAP = "special_tokens_map.json"
NAMED = ("bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token")
_FLAGS = ("single_word", "lstrip", "rstrip", "normalized", "special")


@dataclass(frozen=True)
class DeclaredToken:
    """A token to register: its text and the ``AddedToken`` flags given for it."""

    content: str
    flags: tuple[tuple[str, bool], ...] = (("special", True),)

    def added_token(self):  # -> tokenizers.AddedToken
        from tokenizers import AddedToken

        return AddedToken(self.content, **dict(self.flags))

    def to_json(self) -> dict[str, Any]:
        return {"content": self.content, **dict(self.flags)}


@dataclass(frozen=True)
class DeclaredTokens:
    """``named``: the template's special-token globals (``transformers``' ``special_tokens_map``), in the
    order read; ``to_register``: the tokens to add, in ``transformers``' order, before encoding."""

    named: dict[str, str]
    to_register: tuple[DeclaredToken, ...]


def read_json_object(path: Path) -> dict[str, Any]:
    """A JSON object file beside a tokenizer ({} when there is none); one line for a broken one."""
    if not path.is_file():
        return {}
    try:
        value = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:  # ignoring it would choose other tokens without a word
        raise NanosetError(f"{path}: not valid JSON ({e}); fix or remove it") from None
    if not isinstance(value, dict):
        raise NanosetError(f"{path}: a JSON {type(value).__name__}, not an object; fix or remove it")
    return value


def _content(value: Any) -> str | None:
    """The text of a token given as a string or as an ``AddedToken`` record."""
    if isinstance(value, dict):
        value = value.get("content")
    return value if isinstance(value, str) else None


def _declared(value: Any, special: bool) -> DeclaredToken | None:
    """A token given as a string (special) or an ``AddedToken`` record (its flags; ``special`` when it does not
    say, or when it is one of the named tokens)."""
    content = _content(value)
    if content is None:
        return None
    if not isinstance(value, dict):
        return DeclaredToken(content)
    flags = {k: bool(value[k]) for k in _FLAGS if k in value}
    flags["special"] = flags.get("special", special) or special
    return DeclaredToken(content, tuple(sorted(flags.items())))


def _token_list(value: Any) -> list[Any]:
    if isinstance(value, dict):
        return list(value.values())
    return list(value) if isinstance(value, list) else []


def declared_tokens(folder: Path, present: set[str]) -> DeclaredTokens:
    """The special tokens of the tokenizer folder ``folder`` whose ``tokenizer.json`` already has the added
    tokens ``present`` (their contents)."""
    config = read_json_object(folder / CONFIG)
    kwargs = dict(config)
    if kwargs.get("additional_special_tokens") and not kwargs.get("extra_special_tokens"):
        kwargs["extra_special_tokens"] = kwargs.pop("additional_special_tokens")
    if "added_tokens_decoder" not in config:  # the older layout: special_tokens_map.json is read over the config
        for key, value in read_json_object(folder / SPECIAL_TOKENS_MAP).items():
            if key == "extra_special_tokens" and isinstance(value, list):
                kwargs[key] = _token_list(kwargs.get(key)) + [v for v in value if v not in _token_list(kwargs.get(key))]
            else:
                kwargs[key] = value
        if kwargs.get("additional_special_tokens") and not kwargs.get("extra_special_tokens"):
            kwargs["extra_special_tokens"] = kwargs.pop("additional_special_tokens")
    values = {key: kwargs[key] for key in NAMED if _content(kwargs.get(key)) is not None}
    extras = kwargs.get("extra_special_tokens")
    model_specific = {k: v for k, v in kwargs.items() if k.endswith("_token") and k not in NAMED}
    if isinstance(extras, dict):  # named extra tokens: model-specific, as in transformers
        model_specific.update(extras)
    values.update((k, v) for k, v in model_specific.items() if _content(v) is not None)
    named = {key: _content(value) for key, value in values.items()}

    register: list[DeclaredToken] = []
    seen = set(present)

    def add(token: DeclaredToken | None) -> None:
        if token is not None and token.content not in seen:
            seen.add(token.content)
            register.append(token)

    decoder = config.get("added_tokens_decoder")
    if isinstance(decoder, dict):
        for _, value in sorted(decoder.items(), key=lambda kv: _as_int(kv[0])):
            record = value if isinstance(value, dict) else {"content": value}
            add(_declared({"special": False, **record}, _content(value) in named.values()))
    for value in values.values():
        add(_declared(value, True))
    if not isinstance(extras, dict):
        for value in _token_list(extras):
            add(_declared(value, True))
    return DeclaredTokens(named, tuple(register))


def _as_int(key: Any) -> int:
    try:
        return int(key)
    except (TypeError, ValueError):
        return 1 << 62  # a key that is not an id sorts last
