"""Encoders: the one way from texts to token ids, for the tokenize job, chat loss masks, ``verify
--retokenize`` and the training runtime's HF-dataset cache.

Every backend gives the same ids from the same ``tokenizer.json``: ``tokenizers`` (Hugging Face's, what
every dataset is defined by: the reference) and the fast backends of the registry (``register_backend``;
``fastokens``, a faster exact BPE and an optional dependency with wheels for the common platforms, is the
first). ``auto`` takes the first registered fast backend that is installed, loads the tokenizer and agrees
with the reference on a probe set of awkward texts, and every task also compares its first texts with both.
A guard lowers the risk of a difference, it cannot prove there is none: ``nanoset verify --retokenize`` is
the check, and any difference seen makes the job fall back to the reference with a note (it is a bug of the
fast backend). Workers encode with one backend and hand back what a fast backend made of the probe and of
their tasks' first texts (``FastCheck``); the job's driver, which holds the reference anyway, compares
(``first_difference``).

fastokens tracks no character offsets. For a byte-level BPE without a normalizer they follow from the
token ids alone (``nanoset.tokenize.byte_offsets``), so ``--chat`` loss masks can use it too; other
tokenizers encode chats with tokenizers.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

import numpy as np

from nanoset.errors import NanosetError
from nanoset.tokenize.byte_offsets import ByteLevelOffsets
from nanoset.tokenize.special_tokens import declared_tokens
from nanoset.tokenize.tokenizer import PROBE_TEXTS, file_sampling_settings, load_tokenizer

if TYPE_CHECKING:
    from nanoset.tokenize.tasks import TaskResult

AUTO = "auto"
REFERENCE = "tokenizers"  # the backend every other one is checked against and falls back to
GUARD_CHARS = 4096  # characters of each task's first texts that both backends encode and compare


def _version(module: str) -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(module)
    except PackageNotFoundError:
        return "unknown"


class Encoder(Protocol):
    """What every backend's encoder gives: its ``name`` (the ``--backend`` value), a ``label`` recorded in the
    manifest (name and version), and token ids of a batch of texts, with character offsets for chats. A fast
    backend's encoder also names its added tokens (``added_tokens``: their contents), for the probe set."""

    name: str

    @property
    def label(self) -> str: ...

    def encode(self, texts: list[str], add_special_tokens: bool = True) -> tuple[np.ndarray, np.ndarray]: ...

    def encode_with_offsets(self, texts: list[str]) -> tuple[np.ndarray, np.ndarray, np.ndarray]: ...


class TokenizersEncoder:
    """Hugging Face ``tokenizers``: the reference, the backend every other one must match."""

    name = REFERENCE

    def __init__(self, tok) -> None:
        self.tok = tok
        self.version = _version("tokenizers")

    @property
    def label(self) -> str:
        return f"{self.name} {self.version}"

    def encode(self, texts: list[str], add_special_tokens: bool = True) -> tuple[np.ndarray, np.ndarray]:
        """Token ids of ``texts`` flattened (uint32) and the number of ids of each.

        Each encoding becomes an array and is dropped at once: only one document's ids are ever a Python
        list (the ``tokenizers`` API has no other way out), so a huge document is not held twice over."""
        encode = getattr(self.tok, "encode_batch_fast", self.tok.encode_batch)
        encodings = encode(texts, add_special_tokens=add_special_tokens)
        docs = []
        for i, e in enumerate(encodings):
            docs.append(np.array(e.ids, dtype=np.uint32))
            encodings[i] = None
        lengths = np.fromiter((len(d) for d in docs), dtype=np.int64, count=len(docs))
        return (np.concatenate(docs) if docs else np.empty(0, np.uint32)), lengths

    def encode_with_offsets(self, texts: list[str]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Ids, character offsets (one ``[start, end)`` row per id) and lengths, encoded as a chat is: without
        the tokenizer's own added special tokens."""
        encodings = self.tok.encode_batch(texts, add_special_tokens=False)
        ids, offsets = [], []
        for i, e in enumerate(encodings):
            ids.append(np.array(e.ids, dtype=np.uint32))
            offsets.append(np.array(e.offsets, dtype=np.int64).reshape(-1, 2))
            encodings[i] = None
        lengths = np.fromiter((len(d) for d in ids), dtype=np.int64, count=len(ids))
        if not ids:
            return np.empty(0, np.uint32), np.empty((0, 2), np.int64), lengths
        return np.concatenate(ids), np.concatenate(offsets), lengths


class FastokensEncoder:
    """``fastokens``: the same ids as tokenizers, as one flat buffer per batch (no Python object per token)."""

    name = "fastokens"

    def __init__(self, tok, offsets: ByteLevelOffsets | None, reference: Callable[[], TokenizersEncoder]) -> None:
        self.tok = tok
        self.offsets = offsets
        self.reference = reference  # loaded only if a batch needs it
        self.version = _version("fastokens")

    @property
    def label(self) -> str:
        return f"{self.name} {self.version}"

    def encode(self, texts: list[str], add_special_tokens: bool = True) -> tuple[np.ndarray, np.ndarray]:
        ids, bounds = self.tok.encode_batch_flat(texts, add_special_tokens=add_special_tokens)
        return np.frombuffer(ids, dtype="<u4"), np.diff(np.frombuffer(bounds, dtype="<u8")).astype(np.int64)

    def encode_with_offsets(self, texts: list[str]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """As ``TokenizersEncoder.encode_with_offsets``; a batch whose offsets the token bytes do not give
        (an id outside the byte alphabet, tokens not covering the text) is encoded by tokenizers."""
        if self.offsets is None:
            raise NanosetError("fastokens gives no character offsets for this tokenizer")
        ids, lengths = self.encode(texts, add_special_tokens=False)
        offsets = self.offsets.of(texts, ids, lengths)
        if offsets is None:
            return self.reference().encode_with_offsets(texts)
        return ids, offsets, lengths

    def added_tokens(self) -> list[str]:
        return [t["content"] for t in self.tok.added_tokens()]


class BackendUnusable(NanosetError):
    """A fast backend cannot encode with this tokenizer (it cannot load it); the message says why."""


@dataclass(frozen=True)
class FastBackend:
    """A registered fast backend: whether it is installed (and, where not, why ``--backend NAME`` cannot run),
    how its encoder of a tokenizer is loaded (``load(path, chat, reference)``; BackendUnusable where it cannot
    load it), and why it cannot give ``--chat`` the character offsets of a tokenizer (None: it can)."""

    name: str
    installed: Callable[[], bool]
    missing: str
    load: Callable[[Path, bool, Callable[[], TokenizersEncoder]], Encoder]
    chat_refusal: Callable[[Path, Callable[[], TokenizersEncoder]], str | None] = lambda path, reference: None


FAST_BACKENDS: dict[str, FastBackend] = {}  # by name, in the order ``auto`` tries them


def register_backend(backend: FastBackend) -> None:
    """Add a fast backend: ``--backend NAME`` encodes with it, and ``auto`` tries it after those registered
    before it. Its ids are checked against the reference like any fast backend's."""
    FAST_BACKENDS[backend.name] = backend


def backend_names() -> tuple[str, ...]:
    """The values of ``--backend``."""
    return (AUTO, *sorted(FAST_BACKENDS), REFERENCE)


def is_fast(backend: str) -> bool:
    return backend in FAST_BACKENDS


def encoded_fast(result: TaskResult | None) -> bool:
    """Whether a task result was encoded by a fast backend (its label is not the reference's; a result written
    before backends were recorded was encoded by the reference)."""
    return result is not None and result.encoder is not None and result.encoder.split()[0] != REFERENCE


def _fastokens_installed() -> bool:
    import importlib.util

    return importlib.util.find_spec("fastokens") is not None


def _load_fastokens(path: Path, spec: str | None = None):
    """fastokens' tokenizer of the file at ``path``, or of ``spec`` (its text) where given."""
    try:
        import fastokens
    except ImportError as e:  # installed, but its native library does not load here (built for another system)
        raise BackendUnusable(f"fastokens cannot be imported ({type(e).__name__}: {' '.join(str(e).split())})") \
            from None
    try:
        tok = fastokens.Tokenizer.from_file(str(path)) if spec is None else fastokens.Tokenizer.from_json_str(spec)
    except Exception as e:  # fastokens raises ValueError for what it lacks (a normalizer, a model type, ...)
        raise BackendUnusable(f"fastokens cannot load {path} ({type(e).__name__}: {' '.join(str(e).split())})") \
            from None
    tok.no_truncation()
    tok.no_padding()
    return tok


def _file_is_not_the_encoder(path: Path, added: set[str]) -> bool:
    """Whether the file at ``path`` alone is not the tokenizer that encodes (``load_tokenizer``): tokenizers
    registers tokens declared beside it that its added tokens (``added``: their contents) lack, or sets off a
    setting of it that samples the encoding (BPE dropout, which fastokens applies too)."""
    return bool(declared_tokens(Path(path).parent, added).to_register) or bool(file_sampling_settings(path))


def _reference_loader(path: Path) -> Callable[[], TokenizersEncoder]:
    """The tokenizers encoder of ``path``, loaded on first call."""
    loaded: list[TokenizersEncoder] = []

    def reference() -> TokenizersEncoder:
        if not loaded:
            loaded.append(TokenizersEncoder(load_tokenizer(path)))
        return loaded[0]

    return reference


def encoding_config(path: Path, reference: Callable[[], TokenizersEncoder]) -> dict:
    """The parsed ``tokenizer.json`` of the tokenizer that encodes: the file's, or, where tokens declared beside
    it are registered (or a sampling setting is set off), tokenizers' own serialization of it (their ids
    included)."""
    config = json.loads(Path(path).read_text(encoding="utf-8"))
    if _file_is_not_the_encoder(path, {t.get("content") for t in config.get("added_tokens") or []}):
        return json.loads(reference().tok.to_str())
    return config


def load_encoder(path: Path, backend: str, chat: bool = False,
                 reference: Callable[[], TokenizersEncoder] | None = None) -> Encoder:
    """The encoder of ``backend`` (a registered fast backend or the reference) for the tokenizer at ``path``,
    with character offsets if ``chat``; ``reference`` gives the reference encoder (loaded when needed if not
    given). BackendUnusable when the fast backend cannot load it."""
    reference = reference or _reference_loader(path)
    if backend == REFERENCE:
        return reference()
    return FAST_BACKENDS[backend].load(Path(path), chat, reference)


def _load_fastokens_encoder(path: Path, chat: bool, reference: Callable[[], TokenizersEncoder]) -> FastokensEncoder:
    """fastokens' encoder (falling back on ``reference`` for a chat batch whose offsets its token bytes do not
    give). It encodes with the tokenizer tokenizers encodes with: where tokens declared beside the file are
    registered (or a sampling setting is set off), it loads tokenizers' serialization of that tokenizer (its
    own ``add_tokens`` numbers new tokens differently)."""
    tok = _load_fastokens(path)
    spec = None
    if _file_is_not_the_encoder(path, {t["content"] for t in tok.added_tokens()}):
        spec = reference().tok.to_str()
        tok = _load_fastokens(path, spec)
    offsets = None
    if chat:
        config = json.loads(spec) if spec is not None else json.loads(Path(path).read_text(encoding="utf-8"))
        offsets = ByteLevelOffsets.of_tokenizer(config)[0]
    return FastokensEncoder(tok, offsets, reference)


def _fastokens_chat_refusal(path: Path, reference: Callable[[], TokenizersEncoder]) -> str | None:
    offsets, reason = ByteLevelOffsets.of_tokenizer(encoding_config(path, reference))
    if offsets is not None:
        return None
    return (f"--chat needs character offsets, which fastokens does not give and the token bytes give only "
            f"for byte-level BPE without a normalizer: {reason}")


register_backend(FastBackend(
    "fastokens", _fastokens_installed,
    "fastokens is not installed (`pip install fastokens`: wheels for Linux x86-64/aarch64, macOS and Windows)",
    _load_fastokens_encoder, _fastokens_chat_refusal))


def backend_refused(backend: str, reason: str) -> NanosetError:
    """The error for ``--backend NAME`` (a fast backend) where it cannot (or must not) encode: why, and what to
    use."""
    return NanosetError(f"--backend {backend}: {reason}; use --backend {AUTO} or {REFERENCE}")


@dataclass(frozen=True)
class BackendChoice:
    """What a job starts encoding with, and the note that says why it is not a fast backend (None: nothing to
    say)."""

    backend: str
    note: str | None = None


def choose_backend(path: Path, requested: str, chat: bool,
                   reference: Callable[[], TokenizersEncoder] | None = None) -> BackendChoice:
    """Settle ``--backend`` before any task runs, from what is known without loading a fast backend (each
    worker loads it: ``load_encoder``): the reference as asked; a fast backend (``auto``: the first registered
    one that is installed) when it is installed and, with ``chat``, can give character offsets. Where not,
    ``auto`` falls back to the reference (with a note when the backend is installed) and a named fast backend
    is an error naming the reason. ``reference`` gives the reference encoder (loaded when needed if not given)."""
    names = backend_names()
    if requested not in names:
        raise NanosetError(f"--backend {requested!r}: choose one of {', '.join(names)}")
    if requested == REFERENCE:
        return BackendChoice(REFERENCE)
    if requested == AUTO:
        fast = next((b for b in FAST_BACKENDS.values() if b.installed()), None)
        if fast is None:
            return BackendChoice(REFERENCE)  # the ordinary case where no wheel exists: nothing to say
    else:
        fast = FAST_BACKENDS[requested]
        if not fast.installed():
            raise backend_refused(requested, fast.missing)
    if chat:
        reason = fast.chat_refusal(Path(path), reference or _reference_loader(path))
        if reason is not None:
            if requested != AUTO:
                raise backend_refused(requested, reason)
            return BackendChoice(REFERENCE, f"encoding with {REFERENCE}: {reason}")
    return BackendChoice(fast.name)


class FastFallback:
    """A job's fallback from its fast backend to the reference, as every run of the job sees it.

    Once the fast backend differed from the reference (or failed) anywhere in the job, the reason is recorded
    in the work folder (``record``; ``recorded`` reads it back), so reruns and the job's other machines encode
    with the reference too, and from then on only the reference's task results stand: what the fast backend
    encoded is encoded again. Each switch is said once, in a note (``--backend NAME``: an error instead)."""

    def __init__(self, requested: str, recorded: Callable[[], str | None], record: Callable[[str], None],
                 note: Callable[[str], None]) -> None:
        self.requested = requested
        self.fast = requested if is_fast(requested) else None  # the fast backend in use (first_backend settles it)
        self._recorded, self._record, self._note = recorded, record, note
        self.reason = recorded()  # why the job gave its fast backend up; None: it has not

    def refresh(self) -> bool:
        """Read the job's record again (another machine may have written it meanwhile); whether it fell back."""
        self.reason = self._recorded()
        return self.reason is not None

    def stands(self, result: TaskResult | None) -> bool:
        """A task result that stands: after the fast backend differed anywhere in the job, only the reference's
        do."""
        return result is not None and not (self.reason is not None and encoded_fast(result))

    def overturned(self, results: Iterable[TaskResult | None]) -> list[str]:
        """The fast backend's name for each of ``results`` it finished before the job gave it up."""
        return [r.encoder.split()[0] for r in results if r is not None and not self.stands(r)]

    def first_backend(self, choice: BackendChoice) -> str:
        """The backend a run starts with: ``--backend`` as ``choose_backend`` settled it (its note said), and
        the reference where an earlier run of this job gave the fast backend up."""
        if choice.note:
            self._note(choice.note)
        if is_fast(choice.backend):
            self.fast = choice.backend
            if self.reason is not None:
                return self.switch(self.reason, "an earlier run of this job")
        return choice.backend

    def switch(self, reason: str, who: str | None = None, redo: bool = False) -> str:
        """The reference from now on, because ``who`` (another run; None: this one) saw the fast backend differ
        or fail (``reason``), said once; ``--backend NAME``: an error. ``redo``: what the fast backend encoded
        is encoded again."""
        if is_fast(self.requested):
            raise backend_refused(self.requested, f"{who} saw {reason}" if who else reason)
        redone = f" (what {self.fast} encoded is encoded again)" if redo else ""
        self._note(f"encoding with {REFERENCE}{redone}, as {who} did: {reason}" if who else
                   f"encoding with {REFERENCE}{redone}: {reason}")
        return REFERENCE

    def differed(self, reason: str, redo: bool) -> str:
        """This run saw the fast backend differ or fail: switch, and record why for the job's other runs (before
        the task's marker: a run killed in between must not keep a differing task's shards)."""
        backend = self.switch(reason, redo=redo)
        self._record(reason)
        self.reason = reason
        return backend


def difference_reason(label: str, difference: str) -> str:
    """Why a job gives the fast backend of ``label`` (a task result's encoder) up: where it differs."""
    return f"{label} and {REFERENCE} differ on {difference} (a {label.split()[0]} bug: please report it)"


@dataclass
class FastCheck:
    """What a fast backend made of some texts, for the driver to compare with the reference: the probe set
    (``task`` None), or the first texts of a task."""

    task: int | None
    texts: list[str]
    ids: np.ndarray
    lengths: np.ndarray
    offsets: np.ndarray | None  # with --chat: the character offsets from the token bytes
    source: str = ""  # the task's input range, for messages
    backend: str = ""  # the fast backend's name

    @staticmethod
    def of(encoder: Encoder, texts: list[str], chat: bool, task: int | None = None,
           source: str = "") -> FastCheck:
        if chat:
            ids, offsets, lengths = encoder.encode_with_offsets(texts)
            return FastCheck(task, texts, ids, lengths, offsets, source, encoder.name)
        ids, lengths = encoder.encode(texts)
        return FastCheck(task, texts, ids, lengths, None, source, encoder.name)

    def where(self) -> str:
        return "a probe text" if self.task is None else f"task {self.task}'s first texts ({self.source})"


def probe_texts(encoder: Encoder, limit: int = 64) -> list[str]:
    """The probe set, with the tokenizer's added tokens (special tokens such as ``<|im_end|>``) written into
    text."""
    added = encoder.added_tokens()[:limit]
    return list(PROBE_TEXTS) + [f"x{t}y {t} {t}{t}\n{t}" for t in added]


def guard_sample(texts: list[str]) -> list[str]:
    """The texts a task compares: its first ones while they fit in ``GUARD_CHARS`` (the first one cut to
    that length if it is longer alone)."""
    out, chars = [], 0
    for t in texts:
        if chars + len(t) > GUARD_CHARS:
            if not out:
                out.append(t[:GUARD_CHARS])
            break
        out.append(t)
        chars += len(t)
    return out


def first_difference(reference: Encoder, check: FastCheck) -> str | None:
    """Where the reference first disagrees with what a fast backend made of ``check``'s texts (ids, and with
    chat offsets the character offsets), in words; None when they agree."""
    chat = check.offsets is not None
    if chat:
        b_ids, b_off, b_len = reference.encode_with_offsets(check.texts)
    else:
        (b_ids, b_len), b_off = reference.encode(check.texts), None
    a_bounds, b_bounds = np.cumsum(check.lengths) - check.lengths, np.cumsum(b_len) - b_len
    for d, text in enumerate(check.texts):
        a = check.ids[a_bounds[d] : a_bounds[d] + check.lengths[d]]
        b = b_ids[b_bounds[d] : b_bounds[d] + b_len[d]]
        if not np.array_equal(a, b):
            n = min(len(a), len(b))
            pos = int(np.argmax(a[:n] != b[:n])) if (a[:n] != b[:n]).any() else n
            return (f"{check.where()}: text {d} ({_excerpt(text)}) at token {pos}: {check.backend} gives "
                    f"{[int(x) for x in a[pos : pos + 3]]}, {REFERENCE} {[int(x) for x in b[pos : pos + 3]]}")
        if chat:
            a_o = check.offsets[a_bounds[d] : a_bounds[d] + check.lengths[d]]
            b_o = b_off[b_bounds[d] : b_bounds[d] + b_len[d]]
            if not np.array_equal(a_o, b_o):
                pos = int(np.argmax((a_o != b_o).any(axis=1)))
                return (f"{check.where()}: text {d} ({_excerpt(text)}) at token {pos}: character offsets "
                        f"{tuple(map(int, a_o[pos]))} from the token bytes, {REFERENCE} {tuple(map(int, b_o[pos]))}")
    return None


def _excerpt(text: str, width: int = 40) -> str:
    return repr(text[:width] + ("…" if len(text) > width else ""))
