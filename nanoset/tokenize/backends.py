"""Encoders: the one way from texts to token ids, for the tokenize job, chat loss masks, ``verify
--retokenize`` and the training runtime's HF-dataset cache.

Two backends give the same ids from the same ``tokenizer.json``: ``tokenizers`` (Hugging Face's, what
every dataset is defined by) and ``fastokens`` (a faster exact BPE; an optional dependency with wheels for
the common platforms). ``auto`` takes fastokens when it is installed, loads the tokenizer and agrees with
tokenizers on a probe set of awkward texts, and every task also compares its first texts with both. A guard
lowers the risk of a difference, it cannot prove there is none: ``nanoset verify --retokenize`` is the
check, and any difference seen makes the job fall back to tokenizers with a note (it is a fastokens bug).
Workers encode with one backend and hand back what fastokens made of the probe and of their tasks' first
texts (``FastCheck``); the job's driver, which holds tokenizers anyway, compares (``first_difference``).

fastokens tracks no character offsets. For a byte-level BPE without a normalizer they follow from the
token ids alone (``nanoset.tokenize.byte_offsets``), so ``--chat`` loss masks can use it too; other
tokenizers encode chats with tokenizers.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from nanoset.errors import NanosetError
from nanoset.tokenize.byte_offsets import ByteLevelOffsets
from nanoset.tokenize.special_tokens import declared_tokens
from nanoset.tokenize.tokenizer import PROBE_TEXTS, file_sampling_settings, load_tokenizer

if TYPE_CHECKING:
    from nanoset.tokenize.tasks import TaskResult

BACKENDS = ("auto", "fastokens", "tokenizers")
GUARD_CHARS = 4096  # characters of each task's first texts that both backends encode and compare


def _version(module: str) -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(module)
    except PackageNotFoundError:
        return "unknown"


class TokenizersEncoder:
    """Hugging Face ``tokenizers``: the backend every other one must match."""

    name = "tokenizers"

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


Encoder = TokenizersEncoder | FastokensEncoder

# ---------------------------------------------------------------- byte-level offsets ----------


class FastokensUnusable(NanosetError):
    """fastokens cannot encode with this tokenizer (it cannot load it); the message says why."""


def _load_fastokens(path: Path, spec: str | None = None):
    """fastokens' tokenizer of the file at ``path``, or of ``spec`` (its text) where given."""
    try:
        import fastokens
    except ImportError as e:  # installed, but its native library does not load here (built for another system)
        raise FastokensUnusable(f"fastokens cannot be imported ({type(e).__name__}: {' '.join(str(e).split())})") \
            from None
    try:
        tok = fastokens.Tokenizer.from_file(str(path)) if spec is None else fastokens.Tokenizer.from_json_str(spec)
    except Exception as e:  # fastokens raises ValueError for what it lacks (a normalizer, a model type, ...)
        raise FastokensUnusable(f"fastokens cannot load {path} ({type(e).__name__}: {' '.join(str(e).split())})") \
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
    """The encoder of ``backend`` ("fastokens" or "tokenizers") for the tokenizer at ``path``, with character
    offsets if ``chat``; ``reference`` gives the tokenizers encoder (fastokens falls back on it for a batch
    whose offsets its token bytes do not give). FastokensUnusable when fastokens cannot load it.

    fastokens encodes with the tokenizer tokenizers encodes with: where tokens declared beside the file are
    registered (or a sampling setting is set off), it loads tokenizers' serialization of that tokenizer (its
    own ``add_tokens`` numbers new tokens differently)."""
    reference = reference or _reference_loader(path)
    if backend == "tokenizers":
        return reference()
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


def fastokens_refused(reason: str) -> NanosetError:
    """The error for ``--backend fastokens`` where fastokens cannot (or must not) encode: why, and what to use."""
    return NanosetError(f"--backend fastokens: {reason}; use --backend auto or tokenizers")


@dataclass(frozen=True)
class BackendChoice:
    """What a job starts encoding with, and the note that says why it is not fastokens (None: nothing to say)."""

    backend: str
    note: str | None = None


def choose_backend(path: Path, requested: str, chat: bool,
                   reference: Callable[[], TokenizersEncoder] | None = None) -> BackendChoice:
    """Settle ``--backend`` before any task runs, from what is known without loading fastokens (each worker
    loads it: ``load_encoder``): ``tokenizers`` as asked; ``fastokens`` or ``auto`` when fastokens is
    installed and, with ``chat``, the token bytes give character offsets. Where not, ``auto`` falls back
    (with a note when fastokens is installed) and ``fastokens`` is an error naming the reason. ``reference``
    gives the tokenizers encoder (loaded when needed if not given)."""
    import importlib.util

    if requested not in BACKENDS:
        raise NanosetError(f"--backend {requested!r}: choose one of {', '.join(BACKENDS)}")
    if requested == "tokenizers":
        return BackendChoice("tokenizers")
    if importlib.util.find_spec("fastokens") is None:
        if requested == "fastokens":
            raise fastokens_refused("fastokens is not installed (`pip install fastokens`: wheels for Linux "
                                    "x86-64/aarch64, macOS and Windows)")
        return BackendChoice("tokenizers")  # the ordinary case where no wheel exists: nothing to say
    if chat:
        offsets, reason = ByteLevelOffsets.of_tokenizer(encoding_config(path, reference or _reference_loader(path)))
        if offsets is None:
            reason = (f"--chat needs character offsets, which fastokens does not give and the token bytes give only "
                      f"for byte-level BPE without a normalizer: {reason}")
            if requested == "fastokens":
                raise fastokens_refused(reason)
            return BackendChoice("tokenizers", f"encoding with tokenizers: {reason}")
    return BackendChoice("fastokens")


class FastokensFallback:
    """A job's fallback from fastokens to tokenizers, as every run of the job sees it.

    Once fastokens differed from tokenizers (or failed) anywhere in the job, the reason is recorded in the
    work folder (``record``; ``recorded`` reads it back), so reruns and the job's other machines encode with
    tokenizers too, and from then on only tokenizers' task results stand: what fastokens encoded is encoded
    again. Each switch is said once, in a note (``--backend fastokens``: an error instead)."""

    def __init__(self, requested: str, recorded: Callable[[], str | None], record: Callable[[str], None],
                 note: Callable[[str], None]) -> None:
        self.requested = requested
        self._recorded, self._record, self._note = recorded, record, note
        self.reason = recorded()  # why the job gave fastokens up; None: it has not

    def refresh(self) -> bool:
        """Read the job's record again (another machine may have written it meanwhile); whether it fell back."""
        self.reason = self._recorded()
        return self.reason is not None

    def stands(self, result: TaskResult | None) -> bool:
        """A task result that stands: after fastokens differed anywhere in the job, only tokenizers' do."""
        return result is not None and not (self.reason is not None and result.by_fastokens)

    def overturned(self, results: Iterable[TaskResult | None]) -> int:
        """How many of ``results`` were finished by fastokens before the job gave it up."""
        return sum(r is not None and not self.stands(r) for r in results)

    def first_backend(self, choice: BackendChoice) -> str:
        """The backend a run starts with: ``--backend`` as ``choose_backend`` settled it (its note said), and
        tokenizers where an earlier run of this job gave fastokens up."""
        if choice.note:
            self._note(choice.note)
        if self.reason is not None and choice.backend == "fastokens":
            return self.switch(self.reason, "an earlier run of this job")
        return choice.backend

    def switch(self, reason: str, who: str | None = None, redo: bool = False) -> str:
        """Tokenizers from now on, because ``who`` (another run; None: this one) saw fastokens differ or fail
        (``reason``), said once; ``--backend fastokens``: an error. ``redo``: what fastokens encoded is encoded
        again."""
        if self.requested == "fastokens":
            raise fastokens_refused(f"{who} saw {reason}" if who else reason)
        redone = " (what fastokens encoded is encoded again)" if redo else ""
        self._note(f"encoding with tokenizers{redone}, as {who} did: {reason}" if who else
                   f"encoding with tokenizers{redone}: {reason}")
        return "tokenizers"

    def differed(self, reason: str, redo: bool) -> str:
        """This run saw fastokens differ or fail: switch, and record why for the job's other runs (before the
        task's marker: a run killed in between must not keep a differing task's shards)."""
        backend = self.switch(reason, redo=redo)
        self._record(reason)
        self.reason = reason
        return backend


@dataclass
class FastCheck:
    """What fastokens made of some texts, for the driver to compare with tokenizers: the probe set (``task``
    None), or the first texts of a task."""

    task: int | None
    texts: list[str]
    ids: np.ndarray
    lengths: np.ndarray
    offsets: np.ndarray | None  # with --chat: the character offsets from the token bytes
    source: str = ""  # the task's input range, for messages

    @staticmethod
    def of(encoder: FastokensEncoder, texts: list[str], chat: bool, task: int | None = None,
           source: str = "") -> FastCheck:
        if chat:
            ids, offsets, lengths = encoder.encode_with_offsets(texts)
            return FastCheck(task, texts, ids, lengths, offsets, source)
        ids, lengths = encoder.encode(texts)
        return FastCheck(task, texts, ids, lengths, None, source)

    def where(self) -> str:
        return "a probe text" if self.task is None else f"task {self.task}'s first texts ({self.source})"


def probe_texts(encoder: FastokensEncoder, limit: int = 64) -> list[str]:
    """The probe set, with the tokenizer's added tokens (special tokens such as ``<|im_end|>``) written into
    text."""
    added = [t["content"] for t in encoder.tok.added_tokens()[:limit]]
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


def first_difference(reference: TokenizersEncoder, check: FastCheck) -> str | None:
    """Where tokenizers first disagrees with what fastokens made of ``check``'s texts (ids, and with chat
    offsets the character offsets), in words; None when they agree."""
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
            return (f"{check.where()}: text {d} ({_excerpt(text)}) at token {pos}: fastokens gives "
                    f"{[int(x) for x in a[pos : pos + 3]]}, tokenizers {[int(x) for x in b[pos : pos + 3]]}")
        if chat:
            a_o = check.offsets[a_bounds[d] : a_bounds[d] + check.lengths[d]]
            b_o = b_off[b_bounds[d] : b_bounds[d] + b_len[d]]
            if not np.array_equal(a_o, b_o):
                pos = int(np.argmax((a_o != b_o).any(axis=1)))
                return (f"{check.where()}: text {d} ({_excerpt(text)}) at token {pos}: character offsets "
                        f"{tuple(map(int, a_o[pos]))} from the token bytes, tokenizers {tuple(map(int, b_o[pos]))}")
    return None


def _excerpt(text: str, width: int = 40) -> str:
    return repr(text[:width] + ("…" if len(text) > width else ""))
