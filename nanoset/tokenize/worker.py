"""What a worker process of the tokenize job does: encode one task's rows, in batches, straight into its
own shard files (a new shard when one is full), and hand the driver what it needs to publish them: their
records, the rows skipped, and what a fast backend made of the task's first texts, for the driver to compare
with the reference."""

from __future__ import annotations

import os
import signal
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from nanoset.format.spec import SKIPPED_EXAMPLES
from nanoset.format.writer import ShardWriter
from nanoset.tokenize.backends import (
    REFERENCE,
    BackendUnusable,
    Encoder,
    FastCheck,
    backend_refused,
    guard_sample,
    is_fast,
    load_encoder,
    probe_texts,
)
from nanoset.tokenize.chat import ChatColumns, ChatReader, encode_chats
from nanoset.tokenize.chat_template import ChatRenderer, ChatTemplate
from nanoset.tokenize.inputs import Piece
from nanoset.tokenize.rows import TextReader
from nanoset.tokenize.tasks import OutputFolder, Task, TaskResult, describe_task

FAULT_ENV = "NANOSET_FAULT_KILL_TASK"  # fault injection for tests: a worker SIGKILLs itself on this task


@dataclass(frozen=True)
class ChatSetup:
    """What rendering conversations needs, settled once by the driver (which compiles the template, so that a
    syntax error stops the job before any worker starts): the template, the special-token strings it is given,
    the columns rows keep conversations in, and the template file the user named (None: the tokenizer's own)."""

    template: ChatTemplate
    special_tokens: dict[str, str]
    columns: ChatColumns
    template_file: str | None = None
    split_markers: dict[str, int] = field(default_factory=dict)  # markers the tokenizer splits (chat.split_markers)


@dataclass(frozen=True)
class WorkerConfig:
    """What every worker of a job is told once, at its start: how to read rows and write shards. Frozen: a
    worker changes none of it, and every worker of a job has the same."""

    dtype: str  # of the token files
    tokenizer_name: str  # recorded in each shard's metadata file
    text_column: str
    skip_bad_lines: bool
    eos_id: int
    append_eos: bool  # False where the tokenizer's post-processor ends every encoding with EOS itself
    max_tokens_per_shard: int | None
    chat: ChatSetup | None  # None: rows are texts
    strict_backend: bool  # --backend NAME: a tokenizer that fast backend cannot load is an error, not a fallback


_worker: dict[str, Any] = {}


def init_worker(tokenizer_path: str, config: WorkerConfig, counters: tuple, single_threaded: bool) -> None:
    if single_threaded:  # one process per core: keep the Rust encoder from oversubscribing
        os.environ["TOKENIZERS_PARALLELISM"] = "false"
        os.environ["RAYON_NUM_THREADS"] = "1"
    chat = config.chat
    renderer = ChatRenderer(chat.template, chat.special_tokens) if chat is not None else None
    _worker.update(path=Path(tokenizer_path), config=config, counters=counters, renderer=renderer, encoders={})


def _encoder(backend: str) -> Encoder:
    """This worker's encoder of ``backend``, loaded on first use (BackendUnusable: a fast backend cannot load
    it)."""
    encoders = _worker["encoders"]
    if backend not in encoders:
        reference = None if backend == REFERENCE else lambda: _encoder(REFERENCE)
        encoders[backend] = load_encoder(_worker["path"], backend, _worker["config"].chat is not None, reference)
    return encoders[backend]


def encode_texts(encoder: Encoder, texts: list[str], eos_id: int, append_eos: bool) -> tuple[np.ndarray, np.ndarray]:
    """Token ids of ``texts`` (plus EOS each), flattened, and the document lengths."""
    flat, lengths = encoder.encode(texts)
    if not append_eos:
        return flat, lengths
    return np.insert(flat, np.cumsum(lengths), np.uint32(eos_id)), lengths + 1


def encode_batch(encoder: Encoder, batch: list, chat: bool, eos_id: int,
                 append_eos: bool) -> tuple[np.ndarray, np.ndarray | None, np.ndarray]:
    """A batch of rows (texts, or rendered conversations with ``chat``) as flat ids, their loss mask (None for
    texts) and the document lengths."""
    if chat:
        return encode_chats(encoder, batch, eos_id)
    flat, lengths = encode_texts(encoder, batch, eos_id, append_eos)
    return flat, None, lengths


def reader_for(piece: Piece, rows: str | tuple[ChatColumns, ChatRenderer], skip_bad: bool,
               on_skip: Callable[[str], None] | None = None) -> TextReader:
    """The row reader of ``piece``; ``rows``: the text column, or a chat dataset's columns and renderer."""
    if isinstance(rows, str):
        return TextReader(piece, rows, skip_bad, on_skip)
    return ChatReader(piece, *rows, skip_bad, on_skip)


def _write_split(writers: list[ShardWriter], new_writer, flat: np.ndarray, lengths: np.ndarray,
                 max_tokens: int | None, loss: np.ndarray | None = None) -> None:
    """Append documents (and their loss masks), opening a new shard whenever the next one would pass
    ``max_tokens``."""
    ends = np.cumsum(lengths)
    i, base = 0, 0
    while i < len(lengths):
        w = writers[-1]
        if max_tokens is None:
            k = len(lengths) - i
        else:
            room = max_tokens - w.num_tokens
            k = int(np.searchsorted(ends[i:] - base, room, side="right"))
            if k == 0:
                if w.num_documents > 0:
                    writers.append(new_writer())
                    continue
                k = 1  # a document longer than the limit gets a shard of its own
        stop = int(ends[i + k - 1])
        w.add_documents(flat[base:stop], lengths[i : i + k], None if loss is None else loss[base:stop])
        i, base = i + k, stop


class SkipLog:
    """The rows a task skipped: all of them in its list in the work folder (renamed into place when the task
    is done), the first few kept for the manifest."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.tmp = path.with_name(f".{path.name}.partial-{os.getpid()}")
        self.examples: list[str] = []
        self._file = None

    def __call__(self, message: str) -> None:
        if len(self.examples) < SKIPPED_EXAMPLES:
            self.examples.append(message)
        if self._file is None:
            self._file = open(self.tmp, "w", encoding="utf-8")
        self._file.write(message.replace("\n", " ") + "\n")

    def publish(self) -> None:
        if self._file is not None:
            self._file.close()
            os.replace(self.tmp, self.path)

    def abort(self) -> None:
        if self._file is not None:
            self._file.close()
            self.tmp.unlink(missing_ok=True)


def run_task(task: Task, out: str, prefix: str, backend: str = "tokenizers", probe: bool = False) -> TaskResult:
    """Tokenize one task into shards ``PREFIX_00000...`` with the encoder of ``backend`` (called in a worker
    process). With a fast backend the result also holds what it made of the task's first texts (and, with
    ``probe``, of the probe set), for the driver to compare with the reference; where the fast backend cannot
    load the tokenizer, the task is encoded by the reference and the result says why (``--backend NAME``: an
    error)."""
    if os.environ.get(FAULT_ENV) == str(task.index):
        os.kill(os.getpid(), signal.SIGKILL)
    cfg: WorkerConfig = _worker["config"]
    chat = cfg.chat is not None
    checks: list[FastCheck] = []
    unusable = None
    try:
        encoder = _encoder(backend)
    except BackendUnusable as e:
        if cfg.strict_backend:
            raise backend_refused(backend, str(e)) from None
        encoder, unusable = _encoder(REFERENCE), str(e)
    guarded = not is_fast(encoder.name)
    if not guarded and probe:
        checks.append(FastCheck.of(encoder, probe_texts(encoder), chat))
    docs_counter, tokens_counter = _worker["counters"]
    dtype = np.dtype(cfg.dtype)
    writers: list[ShardWriter] = []

    def new_writer() -> ShardWriter:
        return ShardWriter(out, f"{prefix}_{len(writers):05d}", dtype, cfg.tokenizer_name, loss_masks=chat)

    writers.append(new_writer())
    sources: dict[str, list[dict]] = {}  # shard name -> the pieces its documents came from
    skipped = 0
    log = SkipLog(OutputFolder(Path(out)).skipped_log(task.index))
    rows = (cfg.chat.columns, _worker["renderer"]) if chat else cfg.text_column
    try:
        for piece in task.pieces:
            reader = reader_for(piece, rows, cfg.skip_bad_lines, log)
            for texts in reader.batches():
                if not guarded and texts:  # a batch of skipped rows only is empty: the next one is the first
                    guarded = True
                    sample = guard_sample([c.text for c in texts] if chat else texts)
                    checks.append(FastCheck.of(encoder, sample, chat, task.index, describe_task(task)))
                flat, loss, lengths = encode_batch(encoder, texts, chat, cfg.eos_id, cfg.append_eos)
                first = len(writers) - 1
                _write_split(writers, new_writer, flat, lengths, cfg.max_tokens_per_shard, loss)
                for w in writers[first:]:
                    pieces = sources.setdefault(w.name, [])
                    if not pieces or pieces[-1] != piece.to_json():
                        pieces.append(piece.to_json())
                with docs_counter.get_lock():
                    docs_counter.value += len(lengths)
                with tokens_counter.get_lock():
                    tokens_counter.value += len(flat)
            skipped += reader.skipped
        shards = [w.finalize(sources[w.name]) for w in writers if w.num_documents > 0]
        log.publish()
        return TaskResult(shards, skipped, log.examples, encoder.label, checks, unusable)
    finally:
        log.abort()
        for w in writers:
            if not w.finalized:
                w.abort()


def appends_eos(tok, eos_id: int) -> bool:
    """True unless the tokenizer's post-processor already ends every encoding with EOS."""
    ids = tok.encode("a").ids
    return not ids or ids[-1] != eos_id
