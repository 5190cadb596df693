"""One tokenizer for all of a run's data, and every id within the model's vocabulary: the checks the training
stages and the validation sets both pass before start-up.

Tokenizers are compared by sha256 when both folders record one, else by name (a datatrove folder records
only the name); the largest id comes from the manifest or a cached scan. Data whose tokenizer is unknown
(Megatron files record none; ``nanoset convert`` without ``--tokenizer`` records "unknown") cannot be
compared: beside data of a known tokenizer it is refused, since it may be another tokenizer's ids; the way
out is to record its tokenizer with ``nanoset convert --tokenizer``.
"""

from __future__ import annotations

from dataclasses import dataclass

from nanoset import NanosetReader, TokenizerInfo
from nanoset.errors import ConfigError

UNKNOWN = "unknown"  # the tokenizer name `nanoset convert` records without --tokenizer


def is_unknown(tokenizer: TokenizerInfo | None) -> bool:
    return tokenizer is None or (tokenizer.name == UNKNOWN and not tokenizer.sha256)


@dataclass
class SeenTokenizer:
    """A tokenizer seen so far, and the first folder made with it."""

    tokenizer: TokenizerInfo
    folder: str


def check_same_tokenizer(reader: NanosetReader, folder: str, seen: list[SeenTokenizer],
                         validation: str | None = None) -> list[SeenTokenizer]:
    """``reader``'s tokenizer is the one ``seen`` holds (returned with it added); ``validation``: the validation
    set being checked (its own messages), None for the training stages."""
    tok = reader.tokenizer
    if is_unknown(tok):
        return seen
    for other in seen:
        if not tok.same_as(other.tokenizer):
            if validation is not None:
                raise ConfigError(f"{validation}: {folder} was tokenized with {tok.describe()}, but {other.folder} "
                                  f"with {other.tokenizer.describe()}; validation data must be made with the training "
                                  f"tokenizer")
            raise ConfigError(f"data_stages: datasets were tokenized with different tokenizers: {other.folder} "
                              f"({other.tokenizer.describe()}) and {folder} ({tok.describe()}); re-tokenize them with "
                              f"one tokenizer")
    if all((tok.name, tok.sha256) != (o.tokenizer.name, o.tokenizer.sha256) for o in seen):
        seen = seen + [SeenTokenizer(tok, folder)]
    return seen


def check_unknown_beside_known(readers: list[tuple[NanosetReader, str]], seen: list[SeenTokenizer],
                               where: str) -> None:
    """Data of an unknown tokenizer beside data of a known one: refused, saying how to record its tokenizer."""
    if not seen:
        return
    for reader, folder in readers:
        if is_unknown(reader.tokenizer):
            why = "Megatron data records none" if reader.tokenizer is None else "converted without --tokenizer"
            first = seen[0]
            raise ConfigError(f"{where}: the tokenizer that made {folder} is unknown ({why}), but {first.folder} was "
                              f"tokenized with {first.tokenizer.describe()}: the ids may be another tokenizer's; if "
                              f"it was made with that tokenizer, record it with `nanoset convert {folder} -o OUT "
                              f"--tokenizer TOKENIZER` and list OUT instead")


def check_vocab(reader: NanosetReader, folder: str, vocab: int, validation: str | None = None) -> None:
    """The tokenizer's vocabulary and the largest id of ``reader`` fit ``model.vocab_size``."""
    tok = reader.tokenizer
    if tok and tok.vocab_size and tok.vocab_size > vocab:
        if validation is not None:
            raise ConfigError(f"{validation}: the tokenizer of {folder} has {tok.vocab_size} ids > model.vocab_size "
                              f"{vocab}")
        raise ConfigError(f"model.vocab_size {vocab} < vocab size {tok.vocab_size} of the tokenizer of {folder}; "
                          f"raise model.vocab_size to at least {tok.vocab_size}")
    top = reader.max_token_id
    if top >= vocab:
        if validation is not None:
            raise ConfigError(f"{validation}: {folder} holds token id {top}, ≥ model.vocab_size {vocab}; use data "
                              f"made with the model's tokenizer")
        raise ConfigError(f"{folder}: holds token id {top}, ≥ model.vocab_size {vocab}; raise model.vocab_size to at "
                          f"least {top + 1}, or use data made with the model's tokenizer")
