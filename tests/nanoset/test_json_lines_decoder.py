"""JSON lines read through orjson give what json gives: the same texts and conversations, the same bad rows
with the same messages (json's, naming line and column), whatever orjson refuses or reads differently."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from nanoset.errors import SKIP_HINT, NanosetError
from nanoset.tokenize import rows
from nanoset.tokenize.chat import ChatColumns, ChatReader
from nanoset.tokenize.chat_template import ChatRenderer, ChatTemplate
from nanoset.tokenize.inputs import Piece, Source
from nanoset.tokenize.rows import TextReader

pytest.importorskip("orjson")
CHATML = ("{% for m in messages %}{{ '<|im_start|>' + m['role'] + '\n' + m['content'] + '<|im_end|>\n' }}"
          "{% endfor %}")

# lines orjson refuses or reads differently from json, and the ones both read alike
TRICKY = [
    b'{"text": "plain"}', b'\xef\xbb\xbf{"text": "after a byte order mark"}', b'{"text": "x", "n": NaN}',
    b'{"text": "x", "n": Infinity}', b'{"text": 123456789012345678901234567890}', b'{"text": -9223372036854775809}',
    b'{"text": 1.5}', b'{"text": "\\ud83d"}', b'{"text": "\\ud83d\\ude00 pair"}', b'{"text": "\xed\xa0\xbd"}',
    b'{"text": "\xc0\xaf"}', b'{"text": "tab\there"}', b'{"text": "a", "text": "last wins"}', b'{"text": "x"} extra',
    b'{"text": "x",}', b'["text"]', b'null', b'{"other": "no text column"}', b'{"text": null}',
    b'{"text": "\\u0000 nul and \\u2028 separator"}', b'{"text": "x"}\r', b'  {"text": "spaced"}  ', b'{"a": 1e400}',
    b'{"text": "big", "n": 123456789012345678901234567890}', b'[[[[[[[[[[' * 200 + b']]]]]]]]]]' * 200,
]


def read(tmp_path, lines: list[bytes], fast: bool, monkeypatch, reader=None, skip=True):
    """The values and skipped count of ``lines`` read as one JSON-lines piece, with or without orjson; or the
    error message when a line is bad and ``skip`` is off."""
    monkeypatch.setattr(rows, "orjson", rows.orjson if fast else None)
    path = tmp_path / "p.jsonl"
    path.write_bytes(b"\n".join(lines) + b"\n")
    piece = Piece(Source(str(path), "jsonl", path.stat().st_size, 0), 0, path.stat().st_size, 0)
    r = reader(piece, skip) if reader else TextReader(piece, "text", skip)
    try:
        return [v for batch in r.batches() for v in batch], r.skipped
    except NanosetError as e:
        return str(e)


@pytest.mark.parametrize("line", TRICKY, ids=range(len(TRICKY)))
def test_each_tricky_line_reads_as_json_reads_it(tmp_path, monkeypatch, line):
    lines = [b'{"text": "first"}', line, b'{"text": "last"}']
    for skip in (True, False):
        fast = read(tmp_path, lines, True, monkeypatch, skip=skip)
        assert fast == read(tmp_path, lines, False, monkeypatch, skip=skip)
    assert read(tmp_path, [b'{"text": 123456789012345678901234567890}'], True, monkeypatch, skip=False) == \
        f"{tmp_path / 'p.jsonl'}:1: column 'text' is int, not text{SKIP_HINT}"


def test_conversations_read_as_json_reads_them(tmp_path, monkeypatch):
    renderer = ChatRenderer(ChatTemplate(CHATML, "t"), {})
    lines = [json.dumps({"messages": [{"role": "user", "content": "hi 😀"}, {"role": "assistant", "content": "yo"}],
                         "score": 0.5}).encode(),
             b'{"messages": [{"role": "user", "content": 123456789012345678901234567890}]}',
             b'{"messages": [{"role": 123456789012345678901234567890, "content": "x"}]}',
             b'{"prompt": "p", "completion": 123456789012345678901234567890}',
             b'{"prompt": "p", "completion": "c\\ud83d"}', b'{"prompt": "p", "completion": "c"}']

    def reader(piece, skip):
        return ChatReader(piece, ChatColumns(), renderer, skip)

    for skip in (True, False):
        fast = read(tmp_path, lines, True, monkeypatch, reader, skip)
        assert fast == read(tmp_path, lines, False, monkeypatch, reader, skip)
    texts, skipped = read(tmp_path, lines, True, monkeypatch, reader)
    assert [c.text for c in texts] == ["<|im_start|>user\nhi 😀<|im_end|>\n<|im_start|>assistant\nyo<|im_end|>\n",
                                       "<|im_start|>user\np<|im_end|>\n<|im_start|>assistant\nc<|im_end|>\n"]
    assert skipped == 4
    message = read(tmp_path, lines[2:3], True, monkeypatch, reader, skip=False)
    assert message == (f"{tmp_path / 'p.jsonl'}:1: messages[0] has role 123456789012345678901234567890; the roles "
                       f"are system, user, assistant{SKIP_HINT}")


@settings(max_examples=150, deadline=None)
@given(st.lists(st.one_of(
    st.builds(lambda t, a, extra: json.dumps({"text": t, "x": extra}, ensure_ascii=a).encode(),
              st.text(), st.booleans(), st.one_of(st.integers(), st.floats(), st.none(), st.text(max_size=5))),
    st.binary(max_size=30),
    st.sampled_from(TRICKY[:-1])), min_size=1, max_size=8))
def test_any_lines_read_as_json_reads_them(tmp_path_factory, lines):
    tmp_path = tmp_path_factory.mktemp("lines")
    lines = [line.replace(b"\n", b" ") for line in lines]
    with pytest.MonkeyPatch.context() as monkeypatch:
        assert read(tmp_path, lines, True, monkeypatch) == read(tmp_path, lines, False, monkeypatch)
        assert read(tmp_path, lines, True, monkeypatch, skip=False) == \
            read(tmp_path, lines, False, monkeypatch, skip=False)
