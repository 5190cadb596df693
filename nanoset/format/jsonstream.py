"""A JSON object read from a file with the elements of one of its arrays handed over one by one.

Why: a dataset of 100,000 shards has a 50 MB manifest; ``json.loads`` of it holds the text and every
record at once (~180 MB). Read this way, memory is bounded by the largest element plus what the
caller keeps of each. Anything that is not plain JSON of that shape raises ``ValueError``: the
caller then reads the file the ordinary way, which names the problem.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from typing import IO, Any

BLOCK = 1 << 20  # characters read at a time
BATCH = 1024  # array elements handed over at a time
_SPACE = re.compile(r"[ \t\n\r]*")
_AFTER_ELEMENT = re.compile(r"[ \t\n\r]*([,\]])[ \t\n\r]*")
_DECODER = json.JSONDecoder()


class _Reader:
    """Characters of a text file, read in blocks, with JSON values decoded at the current position."""

    def __init__(self, f) -> None:
        self.f = f
        self.text = ""
        self.pos = 0
        self.eof = False

    def _more(self, at_least: int) -> bool:
        if self.eof:
            return False
        block = self.f.read(max(BLOCK, at_least))
        self.text = self.text[self.pos :] + block
        self.pos = 0
        self.eof = not block
        return bool(block)

    def peek(self) -> str:
        """The next character that is not white space ("" at the end of the file)."""
        while True:
            self.pos = _SPACE.match(self.text, self.pos).end()
            if self.pos < len(self.text):
                return self.text[self.pos]
            if not self._more(0):
                return ""

    def expect(self, char: str) -> None:
        if self.peek() != char:
            raise ValueError(f"expected {char!r} at character {self.pos}")
        self.pos += 1

    def value(self) -> Any:
        """The JSON value at the current position. One that reaches the end of what was read (a number
        may go on in the next block) is decoded again once more text is in."""
        self.peek()
        while True:
            try:
                value, end = _DECODER.raw_decode(self.text, self.pos)
                if end < len(self.text) or self.eof:
                    self.pos = end
                    return value
            except json.JSONDecodeError:
                if self.eof:
                    raise
            self._more(len(self.text))

    def _separator(self) -> re.Match:
        """The ``,`` or ``]`` after an element (read on when the block ends before it)."""
        while (m := _AFTER_ELEMENT.match(self.text, self.pos)) is None:
            if not self._more(0):
                raise ValueError(f"expected ',' or ']' at character {self.pos}")
        return m

    def elements(self, on_batch: Callable[[list[Any]], None]) -> None:
        """The elements of the array whose ``[`` was just read, up to its ``]``, in batches; the loop of a
        large manifest (one regex and one decode per element, text read ahead a block at a time)."""
        batch: list[Any] = []
        if self.peek() == "]":
            self.pos += 1
            return
        decode, after = _DECODER.raw_decode, _AFTER_ELEMENT.match
        while True:
            if len(self.text) - self.pos < BLOCK // 2 and not self.eof:
                self._more(0)
            try:
                value, end = decode(self.text, self.pos)
                m = after(self.text, end)
            except json.JSONDecodeError:
                m = None
            if m is None:  # the element or its separator cut by the block's end (or not JSON: raised below)
                value = self.value()
                m = self._separator()
            batch.append(value)
            self.pos = m.end()
            if len(batch) == BATCH or m.group(1) == "]":
                on_batch(batch)
                batch = []
            if m.group(1) == "]":
                return


def read_object(f: IO[str], array_key: str, on_batch: Callable[[list[Any]], None]) -> dict[str, Any]:
    """The JSON object in the text file ``f`` (open at its start), less ``array_key``: the elements of that array
    are passed to ``on_batch`` in order instead, a list of up to ``BATCH`` at a time. ValueError when the file is
    not a JSON object, ``array_key`` is missing, repeated or not an array, or anything follows the object."""
    out: dict[str, Any] = {}
    seen = False
    r = _Reader(f)
    r.expect("{")
    first = True
    while r.peek() != "}":
        if not first:
            r.expect(",")
        first = False
        key = r.value()
        if not isinstance(key, str) or key in out or (key == array_key and seen):
            raise ValueError(f"key {key!r}: not a string, or repeated")
        r.expect(":")
        if key != array_key:
            out[key] = r.value()
            continue
        seen = True
        r.expect("[")
        r.elements(on_batch)
    r.expect("}")
    if r.peek() != "":
        raise ValueError("text after the object")
    if not seen:
        raise ValueError(f"no {array_key!r} array")
    return out
