"""Where a rendered conversation's assistant turns are: the character spans ``nanoset tokenize --chat`` trains on.

The rule (the one ``nanoset tokenize --chat`` documents): for assistant message ``i``,
``E = render(messages[:i+1])`` must be where the whole rendering starts (templates that render an
earlier turn differently once later turns follow are refused); the span ends at ``len(E)``, so it
holds everything the template writes after the content up to where the next message's rendering
begins (the end-of-turn marker and its separator). It starts where the content starts: the first
occurrence of the content (or of the content stripped of surrounding whitespace, for templates that
trim) at or after the end of the assistant header. The header is what the template writes before a
placeholder content (``render(messages[:i] + [placeholder turn])`` up to the placeholder), else
``render(messages[:i], add_generation_prompt=True)``, whichever the whole rendering starts with and
ends between ``render(messages[:i])`` and ``E``; else the search starts after ``render(messages[:i])``.
The placeholder covers templates that close a turn only when another follows (``loop.last``), where
neither ``render(messages[:i])`` nor the generation prompt ends where the header does, and a search
from there could match the header's own text (content ``a`` in ``<assistant>``). Empty content leaves
the end-of-turn text alone. Text written after the last message of every conversation (the rendering
of no messages, e.g. Phi-3's EOS) is taken off ``render(messages[:k])`` where the whole has it only at
its end. When ``E`` stops right after the content and a message follows, the span runs on to that
message's header (the header it has when rendered alone): a template closing a turn only when another
follows writes the end-of-turn there.

Cost: rendering those prefixes makes the work quadratic in the number of turns (1,000 messages took
2 s). So the spans are first found from two renders of the whole conversation that note where the
template takes up each message (``ChatRenderer.trace``: the end of ``render(messages[:k])`` is where
message ``k`` is taken up), one with each assistant content replaced by a placeholder (its header is
what is written between taking the message up and its placeholder), and two prefix renders that check
the template does not render earlier turns differently once later ones follow. A template this does
not fit (one that iterates the messages more than once or not in order, uses ``loop.last`` or
``loop.nextitem``, for which Jinja takes the next message up early, or gives anything that does not
agree) is located by the prefix renders themselves, with their errors: linear for the common
templates (ChatML, Llama-2 and 3, Mistral v0.1, DeepSeek, Phi-3), quadratic for the others.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Sequence
from typing import Any, Protocol

from nanoset.errors import NanosetError

# loop attributes for which Jinja takes the next message up early (``loop.last`` peeks at it): a template using
# one is located by prefix renders
LOOKS_AHEAD = re.compile(r"\bloop\s*\.\s*(last|nextitem|length|revindex0?)\b")
CONTENT_MARK = "\ue000nanoset-content\ue001"  # stands for an assistant's content to find the text written before it
Message = dict[str, str]
Spans = list[tuple[int, int]]


class ChatRenderer(Protocol):
    """What locating spans needs of a renderer (``nanoset.tokenize.chat_template.ChatRenderer`` is the one)."""

    template: Any  # its ``source``: the template's text

    def render(self, messages: list[Message], add_generation_prompt: bool = False) -> str: ...

    def trace(self, messages: list[Message]) -> tuple[str, MessageTrace]: ...

    def closing(self) -> str: ...


class ChatRenderError(NanosetError):
    """One conversation cannot be rendered or its assistant turns cannot be located (a bad row)."""


class MessageTrace:
    """What one render noted: for each message the template took up from its loop, the length of the text
    written so far; and how many loops over the messages it ran."""

    def __init__(self) -> None:
        self.written = 0  # characters of output received so far (the renderer counts them as they come)
        self.taken: list[tuple[int, int]] = []  # (message index, characters written before it)
        self.loops = 0

    def take(self, index: int) -> None:
        self.taken.append((index, self.written))

    def positions(self, count: int) -> dict[int, int] | None:
        """Message index -> where its rendering begins, when one loop took up messages ``[lo, count)`` in
        order, each once; else None."""
        indices = [k for k, _ in self.taken]
        if self.loops != 1 or not indices or indices != list(range(indices[0], count)):
            return None
        return dict(self.taken)


class TracedMessages(Sequence[Message]):
    """``messages[lo:hi]`` as a template sees them: indexing and slicing as a list, and each loop over them
    noted in a ``MessageTrace``."""

    def __init__(self, messages: list[Message], lo: int, hi: int, trace: MessageTrace) -> None:
        self._messages, self._lo, self._hi, self._trace = messages, lo, hi, trace

    def __len__(self) -> int:
        return self._hi - self._lo

    def __getitem__(self, i):  # type: ignore[override]
        if isinstance(i, slice):
            lo, hi, step = i.indices(len(self))
            if step != 1:
                return [self[k] for k in range(lo, hi, step)]
            return TracedMessages(self._messages, self._lo + lo, self._lo + max(lo, hi), self._trace)
        k = i + len(self) if i < 0 else i
        if not 0 <= k < len(self):
            raise IndexError("list index out of range")
        return self._messages[self._lo + k]

    def __iter__(self) -> Iterator[Message]:
        self._trace.loops += 1
        for k in range(self._lo, self._hi):
            self._trace.take(k)
            yield self._messages[k]


def locate_spans(renderer: ChatRenderer, messages: list[Message]) -> tuple[str, Spans]:
    """The rendered conversation and the ``[start, end)`` character spans of its assistant turns."""
    found = _by_tracing(renderer, messages)
    return found if found is not None else _by_prefixes(renderer, messages)


# ---------------------------------------------------------------- two traced renders ---------


def _by_tracing(r: ChatRenderer, messages: list[Message]) -> tuple[str, Spans] | None:
    """The spans from a constant number of renders, or None when the template does not fit (see above)."""
    assistants = [i for i, m in enumerate(messages) if m["role"] == "assistant"]
    if not assistants or LOOKS_AHEAD.search(r.template.source):
        return None
    marks = {i: f"\ue000nanoset-{i}\ue001" for i in assistants}
    try:
        text, trace = r.trace(messages)
        marked, marked_trace = r.trace([{**m, "content": marks[i]} if i in marks else m
                                        for i, m in enumerate(messages)])
    except ChatRenderError:
        return None
    starts, marked_starts = trace.positions(len(messages)), marked_trace.positions(len(messages))
    if starts is None or marked_starts is None or not set(assistants) <= starts.keys():
        return None
    spans = []
    for i in assistants:
        at = marked.find(marks[i])
        if at < marked_starts[i] or marked.count(marks[i]) != 1:
            return None
        header = marked[marked_starts[i] : at]
        begin, end = starts[i], starts.get(i + 1, len(text))
        if text[begin : begin + len(header)] != header or begin + len(header) > end:
            return None
        try:
            spans.append(_content_span(text, begin + len(header), end, messages[i]["content"], i))
        except ChatRenderError:
            return None
        spans[-1] = (spans[-1][0], end)
    closing = _closing_of(r, text)
    try:
        for k in {assistants[0] + 1, assistants[-1]}:  # earlier turns rendered alone as inside the whole
            _prefix_end(r, text, messages[:k], k - 1, closing)
    except ChatRenderError:
        return None
    return text, spans


# ---------------------------------------------------------------- the rule, by prefix renders ---------


def _by_prefixes(r: ChatRenderer, messages: list[Message]) -> tuple[str, Spans]:
    text = r.render(messages)
    spans = []
    ends: dict[int, int] = {0: 0}  # len(render(messages[:k])), each rendered once

    def prefix_end(k: int, i: int) -> int:
        if k not in ends:
            ends[k] = _prefix_end(r, text, messages[:k], i, _closing_of(r, text))
        return ends[k]

    for i, m in enumerate(messages):
        if m["role"] != "assistant":
            continue
        begin, end = prefix_end(i, i), prefix_end(i + 1, i)
        begin = _header_end(r, text, messages, i, begin, end)
        start, stop = _content_span(text, begin, end, m["content"], i)
        if stop == end and i + 1 < len(messages):  # nothing written after the content: see _turn_end
            end = _turn_end(r, text, messages, i, end)
        spans.append((start, end))
    return text, spans


def _header_end(r: ChatRenderer, text: str, messages: list[Message], i: int, begin: int, end: int) -> int:
    """Where assistant message ``i``'s header ends in ``text`` (``begin`` when no probe tells)."""
    def placeholder() -> str | None:
        rendered = r.render(messages[:i] + [{**messages[i], "content": CONTENT_MARK}])
        at = rendered.find(CONTENT_MARK)
        return rendered[:at] if at >= 0 else None

    for probe in (placeholder, lambda: r.render(messages[:i], add_generation_prompt=True)):
        try:
            header = probe()
        except ChatRenderError:
            continue  # a template that refuses this probe (e.g. a generation prompt here): try the next
        if header is not None and text.startswith(header) and begin <= len(header) <= end:
            return len(header)
    return begin


def _closing_of(r: ChatRenderer, text: str) -> str:
    """The template's closing text (``ChatRenderer.closing``) when ``text`` ends with it, else ""."""
    closing = r.closing()
    return closing if closing and text.endswith(closing) else ""


def _prefix_end(r: ChatRenderer, text: str, prefix: list[Message], i: int, closing: str) -> int:
    """Where ``text`` goes on after ``prefix``: ``len(render(prefix))``, less the conversation's closing
    text when ``render(prefix)`` ends with it (the whole has it only once, at its end)."""
    rendered = r.render(prefix)
    if closing and not text.startswith(rendered) and rendered.endswith(closing):
        rendered = rendered[: -len(closing)]
    if not text.startswith(rendered):
        raise ChatRenderError(
            f"the chat template renders messages[:{len(prefix)}] differently alone than inside the whole "
            f"conversation, so assistant message {i} cannot be located; use a template whose earlier turns "
            f"do not depend on later ones (--chat-template FILE)")
    return len(rendered)


def _turn_end(r: ChatRenderer, text: str, messages: list[Message], i: int, end: int) -> int:
    """Where assistant message ``i``'s turn ends when ``render(messages[:i+1])`` stops right after its
    content: a template that closes a turn only when another follows (``loop.last``) writes the
    end-of-turn text with the next message, before that message's header — the text between ``end``
    and the next content, less the header the next message has when rendered alone."""
    nxt = [{**messages[i + 1], "content": CONTENT_MARK}]
    try:
        inside, alone = r.render(messages[: i + 1] + nxt), r.render(nxt)
    except ChatRenderError:
        return end
    at, header = inside.find(CONTENT_MARK), alone[: max(alone.find(CONTENT_MARK), 0)]
    gap = inside[end:at]
    if at < end or not header or not text.startswith(inside[:at]) or not gap.endswith(header):
        return end
    return end + len(gap) - len(header)


def _content_span(text: str, begin: int, end: int, content: str, i: int) -> tuple[int, int]:
    for needle in (content, content.strip()):
        at = text.find(needle, begin, end)
        if at >= 0:
            return at, at + len(needle)
    raise ChatRenderError(f"the chat template does not write assistant message {i}'s content as given "
                          f"(not found in its rendering), so its tokens cannot be located")
