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
from nanoset.tokenize.chat_spans import ChatRenderError, MessageTrace, TracedMessages, locate_spans
from nanoset.tokenize.special_tokens import declared_tokens

__all__ = ["ChatRenderError", "ChatRenderer", "ChatTemplate", "load_chat_template", "special_token_strings"]



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
    """``override`` (a Jinja file) if given, else what ``transformers`` uses: a ``chat_template.jinja`` beside
    the tokenizer (where recent ``transformers`` saves it; it wins over the config), else ``chat_template`` of
    the ``tokenizer_config.json`` there (a string, or a list of named templates: the one named ``default``)."""
    if override is not None:
        return _read_template(Path(override), f"--chat-template {override}")
    folder = tokenizer_file.parent
    jinja_file = folder / "chat_template.jinja"
    if jinja_file.is_file():
        return _read_template(jinja_file, str(jinja_file))
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
    raise NanosetError(f"tokenizer {tokenizer_file}: no chat template (no chat_template in {cfg_path}, no "
                       f"{jinja_file.name} beside it); pass --chat-template FILE")


def _read_template(path: Path, what: str) -> ChatTemplate:
    """A Jinja template file; one that cannot be read (or is not UTF-8 text) is one line naming it."""
    try:
        return ChatTemplate(path.read_text(encoding="utf-8"), str(path))
    except UnicodeDecodeError as e:
        raise NanosetError(f"{what}: not UTF-8 text (byte {e.start} is {e.object[e.start:e.start + 1]!r}); save the "
                           f"template as UTF-8") from None
    except OSError as e:
        raise NanosetError(f"{what}: cannot read it ({e.strerror or e})") from None


def special_token_strings(tokenizer_file: Path, eos_token: str | None) -> dict[str, str]:
    """The special-token globals ``transformers`` gives a template (its ``special_tokens_map``: named tokens of
    ``tokenizer_config.json``, or of ``special_tokens_map.json`` for a folder of the older layout, and
    model-specific ``*_token`` keys); ``eos_token`` is the EOS the dataset appends (``--eos-token`` wins)."""
    out = dict(declared_tokens(tokenizer_file.parent, set()).named)
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
    """Renders conversations with one template (``render``, or ``trace``: one render that also notes where
    the template takes up each message) and finds the character spans trained on (``render_with_spans``,
    by the rule of ``nanoset.tokenize.chat_spans``)."""

    def __init__(self, template: ChatTemplate, special_tokens: dict[str, str]) -> None:
        self.template = template
        self.special_tokens = dict(special_tokens)
        self._compiled = _compile(template.source, template.origin)
        self._closing: str | None = None

    def render(self, messages: list[dict[str, str]], add_generation_prompt: bool = False) -> str:
        return "".join(self._generate(messages, add_generation_prompt))

    def trace(self, messages: list[dict[str, str]]) -> tuple[str, MessageTrace]:
        """The rendering and, for each message the template iterates over, how much text it had written
        when it took that message up (``MessageTrace``)."""
        out: list[str] = []
        trace = MessageTrace()
        for chunk in self._generate(TracedMessages(messages, 0, len(messages), trace), False):
            out.append(chunk)
            trace.written += len(chunk)  # a generator: a message is taken up only after what precedes it came
        return "".join(out), trace

    def _generate(self, messages, add_generation_prompt: bool):
        import jinja2

        try:
            yield from self._compiled.generate(messages=messages, tools=None, documents=None,
                                               add_generation_prompt=add_generation_prompt, **self.special_tokens)
        except jinja2.exceptions.TemplateError as e:
            raise ChatRenderError(f"the chat template raised: {e}") from None
        except Exception as e:  # a template bug (e.g. a missing key) shows up per row: keep the row's name on it
            raise ChatRenderError(f"the chat template failed: {type(e).__name__}: {e}") from None

    def closing(self) -> str:
        """What the template writes after the last message of every conversation (Phi-3: EOS unless a
        generation prompt follows): its rendering of no messages ("" when it refuses none)."""
        if self._closing is None:
            try:
                self._closing = self.render([])
            except ChatRenderError:
                self._closing = ""
        return self._closing

    def render_with_spans(self, messages: list[dict[str, str]]) -> tuple[str, list[tuple[int, int]]]:
        """The rendered conversation and the ``[start, end)`` character spans of its assistant turns."""
        return locate_spans(self, messages)
