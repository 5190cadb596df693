"""Chat templates: found as Hugging Face stores them, rendered as ``transformers`` renders them.

The Jinja2 environment copies ``transformers``' ``_compile_jinja_template``: a sandbox with
``trim_blocks`` and ``lstrip_blocks``, the loop-controls extension, a ``{% generation %}`` tag (its
body is rendered as is), a ``tojson`` filter that does not escape HTML, and the globals
``raise_exception``, ``strftime_now``, ``dict`` and ``namespace``. A conversation is rendered with
``messages``, ``tools=None``, ``documents=None``, ``add_generation_prompt`` and the special-token
strings of ``tokenizer_config.json`` (``bos_token``, ``eos_token``, ...). A template that differs
renders the same text as ``tokenizer.apply_chat_template(messages, tokenize=False)``.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

from nanoset.errors import NanosetError

CONTENT_MARK = "\ue000nanoset-content\ue001"  # stands for an assistant's content to find the text written before it
SPECIAL_TOKEN_KEYS = ("bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token")


class ChatRenderError(NanosetError):
    """One conversation cannot be rendered or its assistant turns cannot be located (a bad row)."""


@dataclass(frozen=True)
class ChatTemplate:
    """A template's Jinja source and where it came from (for messages); sha256 goes in the manifest."""

    source: str
    origin: str

    @property
    def sha256(self) -> str:
        return hashlib.sha256(self.source.encode("utf-8")).hexdigest()


def _config(folder: Path) -> dict[str, Any]:
    path = folder / "tokenizer_config.json"
    if not path.is_file():
        return {}
    try:
        cfg = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise NanosetError(f"{path}: cannot read it ({e}); fix the JSON or pass --chat-template FILE") from e
    return cfg if isinstance(cfg, dict) else {}


def load_chat_template(tokenizer_file: Path, override: str | Path | None = None) -> ChatTemplate:
    """``override`` (a Jinja file) if given, else ``chat_template`` of the ``tokenizer_config.json``
    beside the tokenizer (a string, or a list of named templates: the one named ``default``), else a
    ``chat_template.jinja`` there (where recent ``transformers`` saves it)."""
    if override is not None:
        path = Path(override)
        try:
            return ChatTemplate(path.read_text(encoding="utf-8"), str(path))
        except (OSError, UnicodeDecodeError) as e:
            raise NanosetError(f"--chat-template {path}: cannot read it ({e})") from e
    folder = tokenizer_file.parent
    cfg_path = folder / "tokenizer_config.json"
    value = _config(folder).get("chat_template")
    if isinstance(value, list):
        named = {t.get("name"): t.get("template") for t in value if isinstance(t, dict)}
        if not isinstance(named.get("default"), str):
            raise NanosetError(f"{cfg_path}: chat_template holds templates named {sorted(map(str, named))} but none "
                               f"named 'default'; pass --chat-template FILE")
        return ChatTemplate(named["default"], f"{cfg_path} (default)")
    if isinstance(value, str):
        return ChatTemplate(value, str(cfg_path))
    if value is not None:
        raise NanosetError(f"{cfg_path}: chat_template is {type(value).__name__}, expected a string or a list "
                           f"of named templates; pass --chat-template FILE")
    jinja_file = folder / "chat_template.jinja"
    if jinja_file.is_file():
        return ChatTemplate(jinja_file.read_text(encoding="utf-8"), str(jinja_file))
    raise NanosetError(f"tokenizer {tokenizer_file}: no chat template (no chat_template in {cfg_path}, no "
                       f"{jinja_file.name} beside it); pass --chat-template FILE")


def special_token_strings(tokenizer_file: Path, eos_token: str | None) -> dict[str, str]:
    """The special-token globals ``transformers`` gives a template (its ``special_tokens_map``): the strings
    of ``tokenizer_config.json``; ``eos_token`` is the EOS the dataset appends (``--eos-token`` wins)."""
    out = {}
    for key, value in _config(tokenizer_file.parent).items():
        if key in SPECIAL_TOKEN_KEYS:
            value = value.get("content") if isinstance(value, dict) else value
            if isinstance(value, str):
                out[key] = value
    if eos_token is not None:
        out["eos_token"] = eos_token
    return out


def _compile(source: str, origin: str):
    """The template compiled in an environment set up as ``transformers._compile_jinja_template`` does."""
    import jinja2
    import jinja2.ext
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    class GenerationTag(jinja2.ext.Extension):
        """``{% generation %}...{% endgeneration %}`` (transformers' assistant tracker): renders its body."""

        tags = {"generation"}

        def parse(self, parser):
            lineno = next(parser.stream).lineno
            body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
            return jinja2.nodes.CallBlock(self.call_method("_body"), [], [], body).set_lineno(lineno)

        def _body(self, caller) -> str:
            return caller()

    def raise_exception(message: str) -> None:
        raise jinja2.exceptions.TemplateError(message)

    def tojson(x: Any, ensure_ascii: bool = False, indent: int | None = None, separators=None,
               sort_keys: bool = False) -> str:
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    def strftime_now(fmt: str) -> str:
        return datetime.now().strftime(fmt)

    class TemplateNamespace(jinja2.utils.Namespace):
        """A namespace that refuses underscore-prefixed names, as transformers' does (sandbox hardening)."""

        def __init__(*args: Any, **kwargs: Any) -> None:
            self, attrs = args[0], dict(*args[1:], **kwargs)
            for name in attrs:
                TemplateNamespace._check(name)
            jinja2.utils.Namespace.__init__(self, attrs)

        def __setitem__(self, name: str, value: Any) -> None:
            TemplateNamespace._check(name)
            jinja2.utils.Namespace.__setitem__(self, name, value)

        @staticmethod
        def _check(name: Any) -> None:
            if isinstance(name, str) and name.startswith("_"):
                raise jinja2.exceptions.SecurityError(f"chat templates cannot set the attribute {name!r}")

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=[GenerationTag, jinja2.ext.loopcontrols])
    env.filters["tojson"] = tojson
    env.globals.update(raise_exception=raise_exception, strftime_now=strftime_now,
                       dict=lambda *a, **k: dict(*a, **k), namespace=TemplateNamespace)
    try:
        template = env.from_string(source)
    except jinja2.exceptions.TemplateSyntaxError as e:
        raise NanosetError(f"{origin}: chat template syntax error at template line {e.lineno}: {e.message}") from e
    # its globals are a ChainMap over the environment's, merged again on every render (two thirds of the time
    # of rendering a short conversation); this environment is never changed after, so one dict is the same
    template.globals = dict(template.globals)
    return template


class ChatRenderer:
    """Renders conversations with one template and finds the character spans that are trained on.

    The rule (the one ``nanoset tokenize --chat`` documents): for assistant message ``i``,
    ``E = render(messages[:i+1])`` must be where the whole rendering starts (templates that render
    an earlier turn differently once later turns follow are refused); the span ends at ``len(E)``,
    so it holds everything the template writes after the content up to where the next message's
    rendering begins (the end-of-turn marker and its separator). It starts where the content starts:
    the first occurrence of the content (or of the content stripped of surrounding whitespace, for
    templates that trim) at or after the end of the assistant header. The header is what the template
    writes before a placeholder content (``render(messages[:i] + [placeholder turn])`` up to the
    placeholder), else ``render(messages[:i], add_generation_prompt=True)``, whichever the whole
    rendering starts with and ends between ``render(messages[:i])`` and ``E``; else the search starts
    after ``render(messages[:i])``. The placeholder covers templates that close a turn only when
    another follows (``loop.last``), where neither ``render(messages[:i])`` nor the generation prompt
    ends where the header does, and a search from there could match the header's own text (content
    ``a`` in ``<assistant>``). Empty content leaves the end-of-turn text alone. Text written after the last
    message of every conversation (the rendering of no messages, e.g. Phi-3's EOS) is taken off
    ``render(messages[:k])`` where the whole has it only at its end. When ``E`` stops right after the
    content and a message follows, the span runs on to that message's header (the header it has when
    rendered alone): a template closing a turn only when another follows writes the end-of-turn there."""

    def __init__(self, template: ChatTemplate, special_tokens: dict[str, str]) -> None:
        self.template = template
        self.special_tokens = dict(special_tokens)
        self._compiled = _compile(template.source, template.origin)
        self._closing: str | None = None

    def render(self, messages: list[dict[str, str]], add_generation_prompt: bool = False) -> str:
        import jinja2

        try:
            return self._compiled.render(messages=messages, tools=None, documents=None,
                                         add_generation_prompt=add_generation_prompt, **self.special_tokens)
        except jinja2.exceptions.TemplateError as e:
            raise ChatRenderError(f"the chat template raised: {e}") from None
        except Exception as e:  # a template bug (e.g. a missing key) shows up per row: keep the row's name on it
            raise ChatRenderError(f"the chat template failed: {type(e).__name__}: {e}") from None

    def render_with_spans(self, messages: list[dict[str, str]]) -> tuple[str, list[tuple[int, int]]]:
        """The rendered conversation and the ``[start, end)`` character spans of its assistant turns."""
        text = self.render(messages)
        spans = []
        ends: dict[int, int] = {0: 0}  # len(render(messages[:k])), each rendered once

        def prefix_end(k: int, i: int) -> int:
            if k not in ends:
                ends[k] = self._prefix_end(text, messages[:k], i, self._closing_of(text))
            return ends[k]

        for i, m in enumerate(messages):
            if m["role"] != "assistant":
                continue
            begin, end = prefix_end(i, i), prefix_end(i + 1, i)
            begin = self._header_end(text, messages, i, begin, end)
            start, stop = self._content_span(text, begin, end, m["content"], i)
            if stop == end and i + 1 < len(messages):  # nothing written after the content: see _turn_end
                end = self._turn_end(text, messages, i, end)
            spans.append((start, end))
        return text, spans

    def _header_end(self, text: str, messages: list[dict[str, str]], i: int, begin: int, end: int) -> int:
        """Where assistant message ``i``'s header ends in ``text`` (``begin`` when no probe tells)."""
        def placeholder() -> str | None:
            rendered = self.render(messages[:i] + [{**messages[i], "content": CONTENT_MARK}])
            at = rendered.find(CONTENT_MARK)
            return rendered[:at] if at >= 0 else None

        for probe in (placeholder, lambda: self.render(messages[:i], add_generation_prompt=True)):
            try:
                header = probe()
            except ChatRenderError:
                continue  # a template that refuses this probe (e.g. a generation prompt here): try the next
            if header is not None and text.startswith(header) and begin <= len(header) <= end:
                return len(header)
        return begin

    def _closing_of(self, text: str) -> str:
        """What the template writes after the last message of every conversation (Phi-3: EOS unless a
        generation prompt follows) — its rendering of no messages — when ``text`` ends with it, else ""."""
        if self._closing is None:
            try:
                self._closing = self.render([])
            except ChatRenderError:
                self._closing = ""
        return self._closing if self._closing and text.endswith(self._closing) else ""

    def _prefix_end(self, text: str, prefix: list[dict[str, str]], i: int, closing: str) -> int:
        """Where ``text`` goes on after ``prefix``: ``len(render(prefix))``, less the conversation's closing
        text when ``render(prefix)`` ends with it (the whole has it only once, at its end)."""
        rendered = self.render(prefix)
        if closing and not text.startswith(rendered) and rendered.endswith(closing):
            rendered = rendered[: -len(closing)]
        if not text.startswith(rendered):
            raise ChatRenderError(
                f"the chat template renders messages[:{len(prefix)}] differently alone than inside the whole "
                f"conversation, so assistant message {i} cannot be located; use a template whose earlier turns "
                f"do not depend on later ones (--chat-template FILE)")
        return len(rendered)

    def _turn_end(self, text: str, messages: list[dict[str, str]], i: int, end: int) -> int:
        """Where assistant message ``i``'s turn ends when ``render(messages[:i+1])`` stops right after its
        content: a template that closes a turn only when another follows (``loop.last``) writes the
        end-of-turn text with the next message, before that message's header — the text between ``end``
        and the next content, less the header the next message has when rendered alone."""
        nxt = [{**messages[i + 1], "content": CONTENT_MARK}]
        try:
            inside, alone = self.render(messages[: i + 1] + nxt), self.render(nxt)
        except ChatRenderError:
            return end
        at, header = inside.find(CONTENT_MARK), alone[: max(alone.find(CONTENT_MARK), 0)]
        gap = inside[end:at]
        if at < end or not header or not text.startswith(inside[:at]) or not gap.endswith(header):
            return end
        return end + len(gap) - len(header)

    @staticmethod
    def _content_span(text: str, begin: int, end: int, content: str, i: int) -> tuple[int, int]:
        for needle in (content, content.strip()):
            at = text.find(needle, begin, end)
            if at >= 0:
                return at, at + len(needle)
        raise ChatRenderError(f"the chat template does not write assistant message {i}'s content as given "
                              f"(not found in its rendering), so its tokens cannot be located")
