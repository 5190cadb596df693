"""Conversations into tokens and loss masks: rows → messages → rendered text → ids + a 0/1 mask.

A row holds a ``messages`` list of ``{role, content}`` (roles system, user, assistant) or a
``prompt`` and a ``completion`` (one user turn, one assistant turn). The template renders it
(``nanoset.tokenize.chat_template``), the rendered text is encoded as ``transformers`` encodes a chat
(``add_special_tokens=False``: a BOS the template writes is not doubled), and each token gets
``1`` when any character it covers lies in an assistant span, else ``0`` (``transformers`` ≥ 5's
``return_assistant_tokens_mask`` rule: the token that merges a template's space with the answer's
first word is the answer's first token, and is trained).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import numpy as np

from nanoset.errors import NanosetError
from nanoset.tokenize.chat_columns import ChatColumns
from nanoset.tokenize.chat_template import ChatRenderer, ChatRenderError
from nanoset.tokenize.rows import TextReader

ROLES = ("system", "user", "assistant")
# The rule this code turns conversations into ids and masks with (``nanoset.format.spec.LOSS_MASK_RULES`` says
# what each means), recorded in chat plans and manifests: a job resumed after a change of rule starts afresh
# instead of mixing shards of two rules, and ``inspect`` says which rule made a dataset.
MASK_RULE = 2
_SURROGATE = re.compile("[\ud800-\udfff]")


@dataclass(frozen=True)
class RenderedChat:
    """A conversation as the template wrote it, and the character spans trained on."""

    text: str
    spans: tuple[tuple[int, int], ...]
    ends_with_assistant: bool


def _content(value: object, what: str) -> str:
    if not isinstance(value, str):
        raise ChatRenderError(f"{what} is {type(value).__name__}, not text")
    if bad := _SURROGATE.search(value):
        raise ChatRenderError(f"{what} holds a lone surrogate \\u{ord(bad.group()):04x}, which is not valid Unicode")
    return value


def conversation_from_row(row: dict, columns: ChatColumns, where: str = "row") -> list[dict[str, str]]:
    """The messages of a row (only ``role`` and ``content`` are kept); ChatRenderError for a bad one,
    MissingColumnError (naming ``where``) for a row with neither form."""
    if columns.choose(list(row), where) == [columns.messages]:
        messages = row[columns.messages]
        name = columns.messages
        if not isinstance(messages, list):
            raise ChatRenderError(f"column {name!r} is {type(messages).__name__}, not a list of {{role, content}} "
                                  f"objects")
        out = []
        for j, m in enumerate(messages):
            if not isinstance(m, dict) or "role" not in m or "content" not in m:
                raise ChatRenderError(f"{name}[{j}] is not a {{role, content}} object")
            if m["role"] not in ROLES:
                raise ChatRenderError(f"{name}[{j}] has role {m['role']!r}; the roles are {', '.join(ROLES)}")
            out.append({"role": m["role"], "content": _content(m["content"], f"{name}[{j}].content")})
        if not any(m["role"] == "assistant" for m in out):
            raise ChatRenderError(f"column {name!r} holds no assistant message: nothing to train on")
        return out
    return [{"role": "user", "content": _content(row[columns.prompt], f"column {columns.prompt!r}")},
            {"role": "assistant", "content": _content(row[columns.completion], f"column {columns.completion!r}")}]


class ChatReader(TextReader):
    """Yields the rendered conversations of one piece in batches; bad rows name their file and line."""

    def __init__(self, piece, columns: ChatColumns, renderer: ChatRenderer, skip_bad: bool,
                 on_skip: Callable[[str], None] | None = None) -> None:
        super().__init__(piece, columns.messages, skip_bad, on_skip)
        self.columns = columns
        self.renderer = renderer

    def batches(self) -> Iterator[list[RenderedChat]]:  # type: ignore[override]
        if self.piece.source.kind == "txt":
            raise NanosetError(f"{self.piece.source.path}: a .txt file holds plain text, not conversations; --chat "
                               f"reads rows with a {self.columns.messages!r} column or {self.columns.prompt!r} and "
                               f"{self.columns.completion!r} columns")
        yield from super().batches()

    @staticmethod
    def _weight(value: RenderedChat) -> int:  # type: ignore[override]
        return len(value.text)

    def _exact(self, row: object) -> bool:
        """orjson's row is json's in every value a conversation reads: roles and contents are strings."""
        if type(row) is not dict:
            return False
        messages = row.get(self.columns.messages)
        if self.columns.messages in row:
            return type(messages) is list and all(
                type(m) is dict and type(m.get("role")) is str and type(m.get("content")) is str for m in messages)
        return type(row.get(self.columns.prompt)) is str and type(row.get(self.columns.completion)) is str

    def _value(self, row: dict, where: Callable[[], str],  # type: ignore[override]
               escapes: bool) -> RenderedChat | None:
        if self.columns.messages not in row and not (self.columns.prompt in row and self.columns.completion in row):
            self.columns.choose(list(row), where())  # raises the missing-column error, naming the line
        try:
            messages = conversation_from_row(row, self.columns)
            text, spans = self.renderer.render_with_spans(messages)
        except ChatRenderError as e:
            self._bad(lambda e=e: f"{where()}: {e}")
            return None
        return RenderedChat(text, tuple(spans), messages[-1]["role"] == "assistant")

    def _table_columns(self, names: list[str], where: str) -> list[str]:
        return self.columns.choose(names, where)

    def _table_values(self, table, first_row: int, where: str) -> list[RenderedChat]:  # type: ignore[override]
        try:
            rows = table.to_pylist()
        except UnicodeDecodeError:  # a string holding invalid UTF-8: find the rows one by one
            rows = []
            for i in range(table.num_rows):
                try:
                    rows.append(table.slice(i, 1).to_pylist()[0])
                except UnicodeDecodeError:
                    self._bad(lambda: f"{where}: row index {first_row + i}: holds invalid UTF-8")
                    rows.append(None)
        out = []
        for i, row in enumerate(rows):
            if row is not None and (value := self._value(row, lambda: f"{where}: row index {first_row + i}", False)):
                out.append(value)
        return out


def token_loss_mask(offsets: np.ndarray, spans: tuple[tuple[int, int], ...] | list[tuple[int, int]]) -> np.ndarray:
    """1 for each token whose characters ``[offsets[:, 0], offsets[:, 1])`` overlap one of the sorted,
    disjoint character ``spans`` ``[start, end)``, else 0: a token straddling a span's edge is trained (an
    empty token counts when it sits strictly inside a span), as transformers' assistant mask does."""
    pairs = np.asarray(offsets, dtype=np.int64).reshape(-1, 2)
    if not len(spans):
        return np.zeros(len(pairs), dtype=np.uint8)
    s = np.array([a for a, _ in spans], dtype=np.int64)
    e = np.array([b for _, b in spans], dtype=np.int64)
    k = np.searchsorted(e, pairs[:, 0], side="right")  # the first span that ends after the token starts
    inside = (k < len(e)) & (pairs[:, 1] > s[np.minimum(k, len(s) - 1)])
    return inside.astype(np.uint8)


def encode_chats(encoder, chats: list[RenderedChat], eos_id: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Token ids (EOS appended unless the template already ended with it), loss masks and document lengths
    of ``chats``, encoded by ``encoder`` (``nanoset.tokenize.backends``). The appended EOS is trained on when
    the conversation ends with an assistant turn: it is that turn's end; after a trailing user or system
    message it is not (nothing there is the model's)."""
    ids, offsets, lengths = encoder.encode_with_offsets([c.text for c in chats])
    if not len(chats):
        return np.empty(0, np.uint32), np.empty(0, np.uint8), lengths
    ends = np.cumsum(lengths)
    loss = np.concatenate([token_loss_mask(offsets[end - n : end], chat.spans)
                           for chat, n, end in zip(chats, lengths.tolist(), ends.tolist())])
    eos = (lengths == 0) | (ids[np.maximum(ends - 1, 0)] != eos_id) if len(ids) else np.ones(len(chats), bool)
    trained = np.fromiter((c.ends_with_assistant for c in chats), dtype=np.uint8, count=len(chats))
    ids = np.insert(ids, ends[eos], np.uint32(eos_id))
    loss = np.insert(loss.astype(np.uint8, copy=False), ends[eos], trained[eos])
    return ids, loss, lengths + eos


# what a template's role and turn markers look like: <|im_start|>, <start_of_turn>, </s>, [INST]
MARKER = re.compile(r"<\|[^\s<>|]{1,64}\|>|</?[A-Za-z][\w-]{0,63}>|\[/?[A-Z][A-Z_]{0,63}\]")
PROBE_CONVERSATION = ({"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi there"},
                      {"role": "assistant", "content": "Hello"})


def split_markers(renderer: ChatRenderer, tok) -> dict[str, int]:
    """The markers the template writes (``MARKER``: ``<|im_start|>``, ``[INST]``) that the tokenizers
    tokenizer ``tok`` encodes as several tokens, with how many: a ChatML template over a tokenizer without
    ``<|im_start|>`` trains on 7 pieces of text where one token was meant. Found in the template's rendering of
    a short conversation (without its system message where it refuses one); {} where it renders neither."""
    for messages in (list(PROBE_CONVERSATION), list(PROBE_CONVERSATION[1:])):
        try:
            text = renderer.render(messages)
        except ChatRenderError:
            continue
        counts = {m: len(tok.encode(m, add_special_tokens=False).ids) for m in dict.fromkeys(MARKER.findall(text))}
        return {m: n for m, n in counts.items() if n > 1}
    return {}


def split_markers_note(markers: dict[str, int], tokenizer_path) -> str:
    """The one line that says which chat markers are not tokens of the tokenizer, and into how many they split."""
    shown = ", ".join(f"{m!r} into {n}" for m, n in markers.items())
    return (f"the chat template's markers are not tokens of tokenizer {tokenizer_path}, so each is encoded as text, "
            f"in pieces ({shown}); list them in extra_special_tokens of its tokenizer_config.json to make each one "
            f"token")
