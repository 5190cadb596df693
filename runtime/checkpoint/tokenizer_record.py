"""The tokenizer a checkpoint records: that of the data its step's stage trained on, with the chat template that
rendered the stage's conversations and the named special tokens, so that an export of an SFT checkpoint is a
chat model (``apply_chat_template`` works on it) even when the pretraining data's tokenizer folder had no template.
"""

from __future__ import annotations

import hashlib
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path

from nanoset import TokenizerInfo


@dataclass
class TokenizerRecord:
    """The data's tokenizer (its manifest record: name, sha256, vocabulary, EOS/BOS, its file), the stage whose data
    it is, the template that rendered that stage's conversations (None for plain text) and the special tokens
    transformers names (``eos_token``, ``pad_token``, ...)."""

    info: TokenizerInfo
    stage: str | None = None
    chat_template: str | None = None
    special_tokens: dict[str, str] = field(default_factory=dict)

    def to_json(self) -> dict:
        return {"info": asdict(self.info), "stage": self.stage, "chat_template": self.chat_template,
                "special_tokens": dict(self.special_tokens)}

    @staticmethod
    def from_json(data: object, version: int) -> TokenizerRecord:
        """Version 1 kept the tokenizer info alone (of the first dataset of the run); keys of another version of
        ``TokenizerInfo`` are ignored. Raises ``TypeError``/``KeyError`` on what is not a record."""
        if not isinstance(data, dict):
            raise TypeError(f"tokenizer is a JSON {type(data).__name__}, not an object")
        info = data if version == 1 else data["info"]
        if not isinstance(info, dict):
            raise TypeError("tokenizer.info is not an object")
        known = {f.name for f in fields(TokenizerInfo)}
        record = TokenizerRecord(TokenizerInfo(**{k: v for k, v in info.items() if k in known}))
        if version == 1:
            return record
        template, special = data.get("chat_template"), data.get("special_tokens") or {}
        if template is not None and not isinstance(template, str) or not isinstance(special, dict):
            raise TypeError("tokenizer.chat_template or tokenizer.special_tokens has the wrong type")
        record.stage, record.chat_template, record.special_tokens = data.get("stage"), template, special
        return record


def stage_tokenizer(plan, step: int) -> TokenizerRecord | None:
    """The tokenizer of the data that the stage of ``step`` trains on (the plan checked that every dataset shares
    one tokenizer; its file, template and special tokens may still differ): a chat dataset's first, else the
    stage's first dataset's. None where no dataset records a tokenizer."""
    stage = plan.stage_for_step(step) if step >= 1 else plan.stages[0]
    readers = [plan.datasets[d].reader for d in stage.dataset_ids]
    readers = [r for r in readers if r.tokenizer is not None]
    if not readers:
        return None
    chat = next((r for r in readers if r.manifest is not None and r.manifest.loss_masks), None)
    reader = chat or readers[0]
    info = reader.tokenizer
    record = TokenizerRecord(info, stage.name)
    file = Path(info.path) if info.path else None
    if file is None or not file.is_file():
        return record
    from nanoset.tokenize.chat_template import special_token_strings

    try:
        record.special_tokens = special_token_strings(file, info.eos_token)
    except Exception:  # noqa: BLE001 - a tokenizer_config.json edited since: the export names no extra tokens
        record.special_tokens = {}
    if chat is not None:
        record.chat_template = _template(chat.manifest, file)
    return record


def _template(manifest, tokenizer_file: Path) -> str | None:
    """The source of the template that rendered a chat dataset: its ``--chat-template`` file or the tokenizer's
    own, when it is still the one the manifest's sha256 names (None when it changed or is gone)."""
    from nanoset.tokenize.chat_template import load_chat_template

    try:
        template = load_chat_template(tokenizer_file, manifest.chat_template_file).source
    except Exception:  # noqa: BLE001 - moved or unreadable since the data was made
        return None
    sha = hashlib.sha256(template.encode("utf-8")).hexdigest()
    return template if manifest.chat_template_sha256 in (None, sha) else None
