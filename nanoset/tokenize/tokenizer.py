"""Find and load a Hugging Face ``tokenizers`` tokenizer offline (with the special tokens declared beside it),
set to encode deterministically, and decide its EOS token."""

from __future__ import annotations

import hashlib
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from nanoset.errors import NanosetError
from nanoset.format.spec import TokenizerInfo
from nanoset.tokenize.special_tokens import CONFIG, SPECIAL_TOKENS_MAP, declared_tokens, read_json_object

EOS_NAMES = ("<|endoftext|>", "</s>", "<|end_of_text|>", "<eos>", "<|eot_id|>", "<|im_end|>", "[SEP]")
BOS_NAMES = ("<|begin_of_text|>", "<s>", "<bos>", "<|startoftext|>", "[CLS]")
# the end-of-text tokens a bare tokenizer file's vocabulary is searched for when it declares no EOS (GPT-2's
# tokenizer.json adds no token: transformers' GPT-2 tokenizer takes <|endoftext|> by its name)
END_OF_TEXT_NAMES = ("<|endoftext|>", "</s>", "<|end_of_text|>", "<eos>")
# special tokens that are never an EOS, so a lone one is not taken for it
NOT_EOS_NAMES = {"<unk>", "<pad>", "<|pad|>", "<mask>", "[UNK]", "[PAD]", "[MASK]", *BOS_NAMES}
# settings of a tokenizers model that sample its encoding (another result on every call), by model type:
# BPE dropout skips merges at random; Unigram's alpha samples a segmentation (recent tokenizers)
SAMPLING_SETTINGS = {"BPE": ("dropout",), "Unigram": ("alpha",)}
# what a Hugging Face repository id looks like (``gpt2``, ``org/name``): the only names the hub is suggested for
REPO_ID = re.compile(r"[A-Za-z0-9][\w.-]*(/[A-Za-z0-9][\w.-]*)?")
FILE_SUFFIXES = (".json", ".jsonl", ".model", ".txt", ".bin", ".vocab", ".tiktoken")


@dataclass
class ResolvedTokenizer:
    """A tokenizer file on disk and what the tokenize job needs to know about it."""

    spec: str
    path: Path
    info: TokenizerInfo
    tokenizer: Any = field(default=None, repr=False, compare=False)  # the loaded tokenizers.Tokenizer
    notes: list[str] = field(default_factory=list)  # the EOS decided for the user (taken by its name), to say
    sampling_off: dict[str, float] = field(default_factory=dict)  # sampling settings set off (sampling_settings)


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
    if not looks_like_repo_id(spec):
        raise NanosetError(f"tokenizer {spec!r}: no such file or folder{_near(p)}; pass a path to a tokenizer.json")
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


def looks_like_repo_id(spec: str) -> bool:
    """Whether ``spec``, which names no file or folder here, is shaped like a hub repository id (``gpt2``,
    ``org/name``) rather than a mistyped local path: no path separator beyond one, no file extension, and no
    first part that is a folder here (``data/tok`` in a folder holding ``data/``)."""
    if not REPO_ID.fullmatch(spec) or spec.lower().endswith(FILE_SUFFIXES):
        return False
    return "/" not in spec or not Path(spec).parent.is_dir()


def _near(path: Path) -> str:
    """For a path that does not exist: what its folder holds that could be meant (its JSON files), if it exists."""
    folder = path.parent
    if str(folder) in ("", ".") or not folder.is_dir():
        return ""
    try:
        names = sorted(q.name for q in folder.iterdir() if q.suffix == ".json" or (q / "tokenizer.json").is_file())
    except OSError:
        return ""
    if not names:
        return f" ({folder} holds no tokenizer)"
    return f" ({folder} holds {', '.join(names[:5])}{' and more' if len(names) > 5 else ''})"


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
    for key in sampling_settings(tok):  # a dataset is a function of its inputs: never a random sample
        setattr(tok.model, key.removeprefix("model."), None)
    return tok


def sampling_settings(tok) -> dict[str, float]:
    """The settings of ``tok``'s model that make its encoding random (``model.dropout``: BPE dropout), by their
    ``tokenizer.json`` key: ``load_tokenizer`` sets them off, and fastokens encodes with that tokenizer."""
    model = tok.model
    keys = SAMPLING_SETTINGS.get(type(model).__name__, ())
    return {f"model.{key}": round(float(getattr(model, key)), 6) for key in keys if getattr(model, key, None)}


def file_sampling_settings(path: Path) -> dict[str, float]:
    """``sampling_settings`` of the tokenizer file at ``path`` as it is (before ``load_tokenizer`` sets them off)."""
    return sampling_settings(_read_tokenizer(path))


def shown_settings(settings: dict[str, float]) -> str:
    return ", ".join(f"{key} {value:g}" for key, value in settings.items())


def sampling_note(path: Path, settings: dict[str, float]) -> str:
    """The one line that says the sampling ``settings`` of the tokenizer at ``path`` are set off."""
    return (f"tokenizer {path} sets {shown_settings(settings)}, which makes its encoding random; it is set off (the "
            f"output is then a function of the input, the same on every run)")


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
    transformers reads it, or a well-known special token), else, for a bare tokenizer file, an end-of-text token
    of its vocabulary by its name or its only special token (with a note), else an error listing the candidates."""
    path = find_tokenizer_file(spec)
    base = _read_tokenizer(path)
    base_vocab = base.get_vocab_size(with_added_tokens=True)
    tok = load_tokenizer(path)
    declared = declared_tokens(path.parent, set()).named
    specials = _special_tokens(tok)
    notes = []

    def known(token: str) -> bool:  # in the tokenizer itself, not only added by the declarations beside it
        token_id = tok.token_to_id(token)
        return token_id is not None and token_id < base_vocab

    in_vocabulary = [n for n in END_OF_TEXT_NAMES if n not in specials and known(n)]
    own_specials = [s for s in specials if known(s)]  # the candidates an error offers: those it would accept
    if eos_token is not None:
        if not known(eos_token):
            beside = path.parent / CONFIG if (path.parent / CONFIG).is_file() else path.parent / SPECIAL_TOKENS_MAP
            source = f" (only {beside} declares it)" if tok.token_to_id(eos_token) is not None else ""
            raise NanosetError(f"--eos-token {eos_token!r} is not in tokenizer {path}{source}; "
                               f"{_eos_candidates(own_specials, in_vocabulary)}")
    else:
        where = path.parent / CONFIG if "eos_token" in read_json_object(path.parent / CONFIG) else \
            path.parent / SPECIAL_TOKENS_MAP
        declared_eos = declared.get("eos_token")
        if declared_eos and not known(declared_eos):
            raise NanosetError(f"{where}: eos_token {declared_eos!r} is not in the tokenizer {path}; fix it or pass "
                               f"--eos-token TOKEN")
        candidates = [declared_eos] if declared_eos else [n for n in EOS_NAMES if n in specials]
        lone = [s for s in specials if s not in NOT_EOS_NAMES]
        if candidates:
            eos_token = candidates[0]
        elif in_vocabulary or len(lone) == 1:
            eos_token = in_vocabulary[0] if in_vocabulary else lone[0]
            why = "the end-of-text token of its vocabulary" if in_vocabulary else "its only special token"
            notes.append(f"tokenizer {path} declares no EOS token; every document ends with {eos_token!r} (id "
                         f"{tok.token_to_id(eos_token)}), {why}, as transformers does: pass --eos-token TOKEN for "
                         f"another")
        else:
            raise NanosetError(f"tokenizer {path} declares no EOS token; pass --eos-token TOKEN "
                               f"({_eos_candidates(own_specials, in_vocabulary)})")
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
    return ResolvedTokenizer(spec=spec, path=path, info=info, tokenizer=tok, notes=notes,
                             sampling_off=sampling_settings(base))


def _eos_candidates(specials: list[str], in_vocabulary: list[str]) -> str:
    """What a tokenizer offers to end documents with, for an EOS error: its special tokens, and the end-of-text
    names of its vocabulary."""
    shown = "its special tokens are: " + ", ".join(map(repr, specials)) if specials else "it has no special tokens"
    if in_vocabulary:
        shown += f"; its vocabulary holds {', '.join(map(repr, in_vocabulary))}"
    return shown


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
