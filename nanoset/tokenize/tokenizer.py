"""Find and load a Hugging Face ``tokenizers`` tokenizer offline (with the special tokens declared beside it),
and decide its EOS token."""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from nanoset.errors import NanosetError
from nanoset.format.spec import TokenizerInfo
from nanoset.tokenize.special_tokens import CONFIG, SPECIAL_TOKENS_MAP, declared_tokens, read_json_object

EOS_NAMES = ("<|endoftext|>", "</s>", "<|end_of_text|>", "<eos>", "<|eot_id|>", "<|im_end|>", "[SEP]")
BOS_NAMES = ("<|begin_of_text|>", "<s>", "<bos>", "<|startoftext|>", "[CLS]")


@dataclass
class ResolvedTokenizer:
    """A tokenizer file on disk and what the tokenize job needs to know about it."""

    spec: str
    path: Path
    info: TokenizerInfo
    tokenizer: Any = field(default=None, repr=False, compare=False)  # the loaded tokenizers.Tokenizer


def _hub_cache_dirs() -> list[Path]:
    dirs = []
    if os.environ.get("HF_HUB_CACHE"):
        dirs.append(Path(os.environ["HF_HUB_CACHE"]))
    hf_home = Path(os.environ.get("HF_HOME", Path.home() / ".cache" / "huggingface"))
    dirs.append(hf_home / "hub")
    return dirs


def find_tokenizer_file(spec: str) -> Path:
    """``spec`` is a tokenizer.json, a folder holding one, or a hub name already in the local cache."""
    p = Path(spec)
    if p.is_file():
        return p
    if p.is_dir():
        if (p / "tokenizer.json").is_file():
            return p / "tokenizer.json"
        raise NanosetError(f"{p}: folder has no tokenizer.json; pass the tokenizer.json file itself")
    repo = "models--" + spec.replace("/", "--")
    for cache in _hub_cache_dirs():
        hits = sorted((cache / repo / "snapshots").glob("*/tokenizer.json"))
        if hits:
            return hits[-1]
    raise NanosetError(
        f"tokenizer {spec!r}: not a file or folder, and not in the local Hugging Face cache "
        f"({', '.join(str(d) for d in _hub_cache_dirs())}); nothing is downloaded: pass a path to a "
        f"tokenizer.json, or fetch it first with `huggingface-cli download {spec} tokenizer.json`"
    )


def load_tokenizer(path: Path):  # -> tokenizers.Tokenizer
    """The tokenizer at ``path`` as ``transformers`` loads its folder: the special tokens declared beside it but
    missing from its added tokens are registered (``nanoset.tokenize.special_tokens``), and it is set to encode
    whole documents: a ``truncation`` or ``padding`` section in the file (meant for model inputs) would
    otherwise cut documents short or fill them with pad ids."""
    tok = _read_tokenizer(path)
    registered = declared_tokens(path.parent, _added_contents(tok)).to_register
    if registered:
        tok.add_tokens([t.added_token() for t in registered])
    tok.no_truncation()
    tok.no_padding()
    return tok


def _read_tokenizer(path: Path):
    from tokenizers import Tokenizer

    try:
        return Tokenizer.from_file(str(path))
    except Exception as e:  # the Rust side raises a plain Exception for bad JSON
        raise NanosetError(f"{path}: not a valid tokenizers JSON file ({e})") from e


def _added_contents(tok) -> set[str]:
    return {t.content for t in tok.get_added_tokens_decoder().values()}


def registered_tokens(path: Path) -> list[dict]:
    """The tokens ``load_tokenizer`` registers for the tokenizer at ``path`` (records for the tokenize plan:
    they change the ids written, so a changed declaration is another dataset)."""
    return [t.to_json() for t in declared_tokens(path.parent, _added_contents(_read_tokenizer(path))).to_register]


def _special_tokens(tok) -> list[str]:
    return [t.content for t in tok.get_added_tokens_decoder().values() if t.special]


def canonical_name(spec: str, path: Path) -> str:
    """The name recorded in the shards: a hub name as given, else the tokenizer's folder (or file) name,
    so that the bytes written do not depend on where the tokenizer sits or how its path was typed."""
    if not Path(spec).exists():
        return spec
    return path.parent.name if path.name == "tokenizer.json" else path.stem


def resolve_tokenizer(spec: str, eos_token: str | None = None) -> ResolvedTokenizer:
    """Load ``spec`` and settle the EOS id: ``--eos-token``, else the tokenizer's own (declared beside it, as
    transformers reads it, or a well-known special token), else an error."""
    path = find_tokenizer_file(spec)
    base_vocab = _read_tokenizer(path).get_vocab_size(with_added_tokens=True)
    tok = load_tokenizer(path)
    declared = declared_tokens(path.parent, set()).named
    specials = _special_tokens(tok)

    def known(token: str) -> bool:  # in the tokenizer itself, not only added by the declarations beside it
        token_id = tok.token_to_id(token)
        return token_id is not None and token_id < base_vocab

    if eos_token is not None:
        if not known(eos_token):
            raise NanosetError(
                f"--eos-token {eos_token!r} is not in tokenizer {path}; its special tokens are: {specials}"
            )
    else:
        where = path.parent / CONFIG if "eos_token" in read_json_object(path.parent / CONFIG) else \
            path.parent / SPECIAL_TOKENS_MAP
        declared_eos = declared.get("eos_token")
        if declared_eos and not known(declared_eos):
            raise NanosetError(f"{where}: eos_token {declared_eos!r} is not in the tokenizer {path}; fix it or pass "
                               f"--eos-token TOKEN")
        candidates = [declared_eos] if declared_eos else [n for n in EOS_NAMES if n in specials]
        if not candidates:
            raise NanosetError(
                f"tokenizer {path} declares no EOS token; pass --eos-token TOKEN "
                f"(its special tokens are: {specials or 'none'})"
            )
        eos_token = candidates[0]
    eos_id = tok.token_to_id(eos_token)
    bos = declared.get("bos_token") or next((n for n in BOS_NAMES if n in specials), None)
    info = TokenizerInfo(
        name=canonical_name(spec, path),
        vocab_size=tok.get_vocab_size(with_added_tokens=True),
        eos_id=int(eos_id),
        eos_token=eos_token,
        bos_id=tok.token_to_id(bos) if bos else None,
        sha256=hashlib.sha256(path.read_bytes()).hexdigest(),
        path=str(path.resolve()),  # absolute: the manifest is read from other folders (inspect, export)
    )
    return ResolvedTokenizer(spec=spec, path=path, info=info, tokenizer=tok)


# texts whose ids tell tokenizers (and encoders of one tokenizer) apart: added tokens, whitespace runs, digits,
# emoji, mixed scripts, combining marks, CRLF, a long line
PROBE_TEXTS = (
    "Hello, world! The quick brown fox jumps over the lazy dog. I'm sure you're right; it's what we'd've done.",
    "a  b   c    d\t\te\t \n\n\nf     \u00a0\u00a0g\u3000h \u2003 i\u200bj\ufeffk",
    "   leading spaces",
    "trailing spaces   ",
    " ",
    "\n",
    "",
    "0 7 42 123 1234 12345 123456789 3.14159 -2.5e-10 1,000,000 2024-01-31 007 ٣٤٥ ４２",
    "emoji: 👍 👍🏽 👨‍👩‍👧‍👦 🇫🇷🇯🇵 ❤️ 🫠 ☃ ✔︎ 😀😀😀",
    "English, русский, 中文汉字, 日本語のテキスト, 한국어 문장, العربية, עברית, हिन्दी, ไทย, Ελληνικά, ქართული",
    "combining: e\u0301 a\u0308 n\u0303 A\u030a \u00c5 o\u0302\u0323 \u0915\u094d\u0937 \u1100\u1161\u11a8 ﬁ ½ Ⅻ",
    "line one\r\nline two\r\n\r\nline three\rline four\n\r\n",
    "def f(x):\n    return x ** 2  # comment\n\tif x != y and not z: pass\n\n\n    \n",
    "control \x00\x01\x1f\x7f\x85 chars, <html><b>tags</b></html> {\"json\": [1, 2]} \\escaped\\",
    "word " * 1500 + "a" * 3000 + " " + "ab" * 1500 + " " + "é" * 1000 + "\n" + "12" * 1000,
)


def encoding_difference(a: Path, b: Path, names: tuple[str, str] = ("one", "the other")) -> str | None:
    """How the tokenizers at ``a`` and ``b`` encode differently, None when they encode alike: the same vocabulary
    and added tokens, and the same ids (with and without special tokens) for a probe of texts and of their added
    tokens. A tokenizer that ``transformers`` saved again (a no-op post-processor added) is another file but
    encodes alike. ``names`` say which is which in the answer."""
    ta, tb = load_tokenizer(a), load_tokenizer(b)
    if ta.get_vocab(with_added_tokens=True) != tb.get_vocab(with_added_tokens=True):
        return "their vocabularies (or added tokens) differ"
    added = " ".join(sorted(ta.get_vocab(with_added_tokens=True).keys() - ta.get_vocab(with_added_tokens=False)))
    for text in (*PROBE_TEXTS, added):  # texts whose ids tell tokenizers apart
        for special in (True, False):
            enc_a, enc_b = ta.encode(text, add_special_tokens=special), tb.encode(text, add_special_tokens=special)
            if enc_a.ids != enc_b.ids:
                return _first_difference(text, enc_a, enc_b, names)
    return None


def _first_difference(text: str, enc_a, enc_b, names: tuple[str, str]) -> str:
    """Where two encodings of ``text`` part: the first differing token, the ids around it in both, and the text
    there (long probe texts share their first ids, so their beginnings tell nothing)."""
    a, b = enc_a.ids, enc_b.ids
    i = next((k for k, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
    lo, hi = max(0, i - 3), i + 4
    offsets = enc_a.offsets if i < len(a) else enc_b.offsets
    start = offsets[i][0] if i < len(offsets) else len(text)
    return (f"a probe text encodes differently from its token {i} on (character {start}: {text[start:start + 24]!r}"
            f"{'…' if len(text) > start + 24 else ''}): its ids {lo}-{hi - 1} are {a[lo:hi]} with {names[0]} and "
            f"{b[lo:hi]} with {names[1]}")
