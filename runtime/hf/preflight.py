"""Checks of ``model.init_from_hf`` that run before any process group: the weights' headers and the
tokenizer, so that a wrong folder is one line printed once, not a crash on every rank."""

from __future__ import annotations

import hashlib
from pathlib import Path

from nanoset import TokenizerInfo
from nanoset.errors import ConfigError, NanosetError
from nanoset.tokenize.tokenizer import encoding_difference
from runtime.config import Config


def data_tokenizer(plan) -> TokenizerInfo | None:
    """The tokenizer the run's data was made with (the plan checked that all datasets share one)."""
    return next((w.reader.tokenizer for w in plan.datasets if w.reader.tokenizer is not None), None)


def check_model_tokenizer(folder: str | Path, data: TokenizerInfo | None) -> None:
    """``folder/tokenizer.json``, when there is one, must encode as the tokenizer the data was made with: the same
    file, or one that encodes alike (``transformers`` saving a tokenizer again changes its bytes, not its ids). The
    encodings are compared with the file the manifest names only while it is still the file the data was made with
    (its sha256): a file edited since (another tokenizer under the same path) says nothing about the data."""
    path = Path(folder) / "tokenizer.json"
    if not path.is_file() or data is None or not data.sha256:
        return
    sha = _sha256(path)
    if sha == data.sha256:
        return
    recorded = Path(data.path) if data.path else None
    if recorded is None or not recorded.is_file():  # nothing to compare the encodings with
        raise ConfigError(f"model.init_from_hf: {path} (sha256 {sha[:12]}) is not the tokenizer the data was made "
                          f"with ({data.describe()}); tokenize the data with the model's tokenizer")
    if _sha256(recorded) != data.sha256:
        raise ConfigError(f"model.init_from_hf: {path} (sha256 {sha[:12]}) is not the tokenizer the data was made "
                          f"with ({data.describe()}), and {recorded}, where the data's manifest says that tokenizer "
                          f"was, has changed since (sha256 {_sha256(recorded)[:12]}), so the encodings cannot be "
                          f"compared; put the data's tokenizer back there, or tokenize the data with the model's "
                          f"tokenizer")
    try:
        difference = encoding_difference(path, recorded, ("the model's", "the data's"))
    except NanosetError as e:  # the model's tokenizer.json does not load
        raise ConfigError(f"model.init_from_hf: {e}; save the model's tokenizer there again (or remove the file) "
                          f"and rerun") from None
    if difference is not None:
        raise ConfigError(f"model.init_from_hf: {path} does not encode as the tokenizer the data was made with "
                          f"({recorded}): {difference}; tokenize the data with the model's tokenizer")


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def check_init_from_hf(config: Config, plan, fresh_start: bool) -> None:
    """The tokenizer always; the weights only when they will be loaded (no checkpoint to resume)."""
    folder = config.model.init_from_hf
    if folder is None:
        return
    check_model_tokenizer(folder, data_tokenizer(plan))
    if fresh_start:
        from runtime.hf.load import check_hf_weights

        check_hf_weights(config.model)
