"""The tokenize job: parallel, deterministic, resumable.

Each task of the plan is tokenized by a worker process (the Rust encoder, in batches) straight
into its own shard files, published by rename, then a marker. A rerun skips tasks with a
marker; the manifest is written last from the markers in task order. The bytes written depend
only on the plan, never on the number of workers or machines or on restarts. With ``chat`` the
rows are conversations (``nanoset.tokenize.chat``) and every shard also gets its loss mask.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import signal
import sys
import time
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

import numpy as np

from nanoset.errors import NanosetError
from nanoset.format.spec import SKIPPED_EXAMPLES, SKIPPED_NAME, Manifest, dtype_for_vocab, dtype_name
from nanoset.format.writer import ShardWriter, write_manifest
from nanoset.tokenize.backends import (
    BackendChoice,
    Encoder,
    FastCheck,
    FastokensUnusable,
    TokenizersEncoder,
    choose_backend,
    first_difference,
    guard_sample,
    load_encoder,
    probe_texts,
)
from nanoset.tokenize.chat import MASK_RULE, ChatColumns, ChatReader, encode_chats
from nanoset.tokenize.chat_template import ChatRenderer, ChatTemplate, load_chat_template, special_token_strings
from nanoset.tokenize.inputs import Piece, discover
from nanoset.tokenize.rows import TextReader
from nanoset.tokenize.taskpool import TaskPool, WorkerDied
from nanoset.tokenize.tasks import OutputFolder, Plan, Task, TaskResult, make_plan
from nanoset.tokenize.tokenizer import ResolvedTokenizer, load_tokenizer, registered_tokens, resolve_tokenizer


@dataclass
class TokenizeOptions:
    inputs: list[str]
    output: Path
    tokenizer: str
    eos_token: str | None = None
    text_column: str = "text"
    workers: int = 1
    max_tokens_per_shard: int | None = None
    num_tasks: int = 1
    task_index: int = 0
    overwrite: bool = False
    skip_bad_lines: bool = False
    task_bytes: int | None = None  # input bytes per task; None: chosen from the corpus size (auto_task_bytes)
    splits: list[str] | None = None  # only these splits of Hugging Face DatasetDict inputs
    progress: bool = True
    chat: bool = False  # rows are conversations: render with the chat template, write loss masks
    chat_template: str | None = None  # a Jinja file; default: the tokenizer's own template
    messages_column: str = "messages"
    prompt_column: str = "prompt"
    completion_column: str = "completion"
    backend: str = "auto"  # the encoder: auto (fastokens where it loads and agrees), fastokens or tokenizers


FAULT_ENV = "NANOSET_FAULT_KILL_TASK"  # fault injection for tests: a worker SIGKILLs itself on this task
PROGRESS_SECONDS = 30.0  # between progress lines when stderr is not a terminal


@dataclass
class TokenizeSummary:
    output: Path
    complete: bool
    num_tasks: int
    tasks_run: int
    tasks_resumed: int
    documents: int
    tokens: int
    shards: int
    skipped_lines: int
    seconds: float
    skipped_examples: list[str] = field(default_factory=list)
    tokens_run: int = 0  # tokens of the tasks this run tokenized (the rate counts these, not resumed ones)
    redo_elsewhere: int = 0  # tasks of other task indices done by fastokens before it was seen to differ

    def details(self) -> list[str]:
        """Lines after the summary: the first rows skipped, and where the full list is."""
        if not self.skipped_examples:
            return []
        return ([f"  the first rows skipped (all {self.skipped_lines:,} in {self.output / SKIPPED_NAME}):"]
                + [f"    {e}" for e in self.skipped_examples])

    def line(self) -> str:
        rate = self.tokens_run / self.seconds if self.seconds > 0 else 0.0
        if self.complete:
            state = "complete"
        elif self.redo_elsewhere:
            n = self.redo_elsewhere
            state = (f"partial: {n} task{'s' * (n > 1)} of other task indices {'were' if n > 1 else 'was'} encoded by "
                     f"fastokens before it was seen to differ: rerun those task indices to encode "
                     f"{'them' if n > 1 else 'it'} again")
        else:
            state = "partial: other task indices still to run"
        return (
            f"{self.output}: {self.documents:,} documents, {self.tokens:,} tokens in {self.shards} shards; "
            f"ran {self.tasks_run} of {self.num_tasks} tasks ({self.tasks_resumed} already done) "
            f"in {self.seconds:.1f}s, {rate:,.0f} tokens/s tokenized; skipped {self.skipped_lines} bad lines; {state}"
        )


# ---------------------------------------------------------------- worker side -----------------

_worker: dict[str, Any] = {}


def _init_worker(tokenizer_path: str, config: dict, counters: tuple, single_threaded: bool) -> None:
    if single_threaded:  # one process per core: keep the Rust encoder from oversubscribing
        os.environ["TOKENIZERS_PARALLELISM"] = "false"
        os.environ["RAYON_NUM_THREADS"] = "1"
    chat = config.get("chat")
    renderer = None
    if chat:
        renderer = ChatRenderer(ChatTemplate(chat["template"], chat["template_origin"]), chat["special_tokens"])
    _worker.update(path=Path(tokenizer_path), config=config, counters=counters, renderer=renderer, encoders={})


def _encoder(backend: str) -> Encoder:
    """This worker's encoder of ``backend``, loaded on first use (FastokensUnusable: fastokens cannot load it)."""
    encoders = _worker["encoders"]
    if backend not in encoders:
        reference = None if backend == "tokenizers" else lambda: _encoder("tokenizers")
        encoders[backend] = load_encoder(_worker["path"], backend, bool(_worker["config"].get("chat")), reference)
    return encoders[backend]


def _encode(encoder: Encoder, texts: list[str], eos_id: int, append_eos: bool) -> tuple[np.ndarray, np.ndarray]:
    """Token ids of ``texts`` (plus EOS each), flattened, and the document lengths."""
    flat, lengths = encoder.encode(texts)
    if not append_eos:
        return flat, lengths
    return np.insert(flat, np.cumsum(lengths), np.uint32(eos_id)), lengths + 1


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
    process). With fastokens the result also holds what it made of the task's first texts (and, with
    ``probe``, of the probe set), for the driver to compare with tokenizers; where fastokens cannot load
    the tokenizer, the task is encoded by tokenizers and the result says why (``--backend fastokens``: an
    error)."""
    if os.environ.get(FAULT_ENV) == str(task.index):
        os.kill(os.getpid(), signal.SIGKILL)
    cfg = _worker["config"]
    checks: list[FastCheck] = []
    unusable = None
    try:
        encoder = _encoder(backend)
    except FastokensUnusable as e:
        if cfg["strict_backend"]:
            raise FastokensUnusable(f"--backend fastokens: {e}; use --backend auto or tokenizers") from None
        encoder, unusable = _encoder("tokenizers"), str(e)
    guarded = encoder.name != "fastokens"
    if not guarded and probe:
        checks.append(FastCheck.of(encoder, probe_texts(encoder), bool(cfg["chat"])))
    docs_counter, tokens_counter = _worker["counters"]
    dtype = np.dtype(cfg["dtype"])
    writers: list[ShardWriter] = []

    chat = cfg.get("chat")

    def new_writer() -> ShardWriter:
        return ShardWriter(out, f"{prefix}_{len(writers):05d}", dtype, cfg["tokenizer_name"], loss_masks=bool(chat))

    writers.append(new_writer())
    sources: dict[str, list[dict]] = {}  # shard name -> the pieces its documents came from
    skipped = 0
    log = SkipLog(OutputFolder(Path(out)).skipped_log(task.index))
    try:
        for piece in task.pieces:
            if chat:
                reader: TextReader = ChatReader(piece, ChatColumns(**chat["columns"]), _worker["renderer"],
                                                cfg["skip_bad_lines"], log)
            else:
                reader = TextReader(piece, cfg["text_column"], cfg["skip_bad_lines"], log)
            for texts in reader.batches():
                if not guarded and texts:  # a batch of skipped rows only is empty: the next one is the first
                    guarded = True
                    sample = guard_sample([c.text for c in texts] if chat else texts)
                    checks.append(FastCheck.of(encoder, sample, bool(chat), task.index, describe_task(task)))
                if chat:
                    flat, loss, lengths = encode_chats(encoder, texts, cfg["eos_id"])
                else:
                    (flat, lengths), loss = _encode(encoder, texts, cfg["eos_id"], cfg["append_eos"]), None
                first = len(writers) - 1
                _write_split(writers, new_writer, flat, lengths, cfg["max_tokens_per_shard"], loss)
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


# ---------------------------------------------------------------- driver side -----------------


def describe_task(task: Task) -> str:
    """The input range of a task, for messages: its piece, or its first and last pieces."""

    def one(p: Piece) -> str:
        unit = "rows" if p.source.kind in ("parquet", "hf") else "bytes"
        return p.source.path + (f"[{p.source.split}]" if p.source.split else "") + f" {unit} {p.start}-{p.stop}"

    if len(task.pieces) == 1:
        return one(task.pieces[0])
    return f"{one(task.pieces[0])} to {one(task.pieces[-1])}, {len(task.pieces)} pieces"


def _appends_eos(tok, eos_id: int) -> bool:
    """True unless the tokenizer's post-processor already ends every encoding with EOS."""
    ids = tok.encode("a").ids
    return not ids or ids[-1] != eos_id


def _check_column_options(opts: TokenizeOptions) -> None:
    """A column option of the other kind of rows would be ignored (text for conversations, or the reverse)."""
    defaults = {f.name: f.default for f in fields(TokenizeOptions)}
    if opts.chat and opts.text_column != defaults["text_column"]:
        raise NanosetError("--text-column does not apply with --chat (conversations are read from --messages-column, "
                           "or --prompt-column and --completion-column)")
    for name in ("messages_column", "prompt_column", "completion_column"):
        if not opts.chat and getattr(opts, name) != defaults[name]:
            raise NanosetError(f"--{name.replace('_', '-')} needs --chat")


def chat_config(opts: TokenizeOptions, tokenizer: ResolvedTokenizer) -> dict | None:
    """What workers need to render conversations (None without ``--chat``); the template is compiled here
    once, so a syntax error stops the job before any worker starts."""
    _check_column_options(opts)
    if not opts.chat:
        if opts.chat_template is not None:
            raise NanosetError("--chat-template needs --chat")
        return None
    template = load_chat_template(tokenizer.path, opts.chat_template)
    special = special_token_strings(tokenizer.path, tokenizer.info.eos_token)
    ChatRenderer(template, special)
    return {"template": template.source, "template_origin": template.origin, "template_sha256": template.sha256,
            "template_file": str(Path(opts.chat_template).resolve()) if opts.chat_template else None,
            "special_tokens": special,
            "columns": {"messages": opts.messages_column, "prompt": opts.prompt_column,
                        "completion": opts.completion_column}}


def build_plan(opts: TokenizeOptions, tokenizer: ResolvedTokenizer, chat: dict | None = None) -> Plan:
    info = tokenizer.info
    options = {
        "tokenizer_sha256": info.sha256,
        "eos_id": info.eos_id,
        "dtype": dtype_name(dtype_for_vocab(info.vocab_size)),
        "text_column": opts.text_column,
        "max_tokens_per_shard": opts.max_tokens_per_shard,
        "skip_bad_lines": opts.skip_bad_lines,
    }
    if registered := registered_tokens(tokenizer.path):  # they change the ids; none: plain plans keep their bytes
        options["registered_tokens"] = registered
    if chat is not None:  # only chat plans carry the key: plain plans (and manifests) keep their bytes
        del options["text_column"]
        options["chat"] = {"template_sha256": chat["template_sha256"], "special_tokens": chat["special_tokens"],
                           "mask_rule": MASK_RULE, **{f"{k}_column": v for k, v in chat["columns"].items()}}
    sources = discover(opts.inputs, exclude=opts.output)
    if opts.splits is not None:
        sources = [s for s in sources if s.split is None or s.split in opts.splits]
        missing = set(opts.splits) - {s.split for s in sources}
        if missing:
            raise NanosetError(f"{', '.join(opts.inputs)}: no split named {', '.join(sorted(missing))}")
    return make_plan(sources, options, opts.task_bytes)


def tokenize(opts: TokenizeOptions) -> TokenizeSummary:
    """Run (or resume) the job described by ``opts``; returns what was done."""
    if opts.workers < 1:
        raise NanosetError(f"--workers must be ≥ 1, got {opts.workers}")
    if opts.num_tasks < 1:
        raise NanosetError(f"--num-tasks must be ≥ 1, got {opts.num_tasks}")
    if not 0 <= opts.task_index < opts.num_tasks:
        raise NanosetError(f"--task-index must be in [0, {opts.num_tasks}), got {opts.task_index}")
    if opts.task_bytes is not None and opts.task_bytes < 1:
        raise NanosetError(f"--task-bytes must be ≥ 1, got {opts.task_bytes}")
    if opts.max_tokens_per_shard is not None and opts.max_tokens_per_shard < 1:
        raise NanosetError(f"--max-tokens-per-shard must be ≥ 1, got {opts.max_tokens_per_shard}")
    t0 = time.perf_counter()
    tokenizer = resolve_tokenizer(opts.tokenizer, opts.eos_token)
    chat = chat_config(opts, tokenizer)
    plan = build_plan(opts, tokenizer, chat)
    reference = TokenizersEncoder(tokenizer.tokenizer or load_tokenizer(tokenizer.path))
    # before the output folder is touched (--overwrite empties it): a --backend that cannot run is refused first
    choice = choose_backend(tokenizer.path, opts.backend, opts.chat, lambda: reference)
    folder = OutputFolder(opts.output)
    complete = folder.prepare(plan, opts.overwrite)
    for note in folder.notes:
        print(f"note: {note}", file=sys.stderr, flush=True)
    if complete:
        return _summary(opts, plan, folder.completed_manifest(), [], len(plan.tasks), True, t0)

    itemsize = np.dtype(plan.build["dtype"]).itemsize
    mine = [t for t in plan.tasks if t.index % opts.num_tasks == opts.task_index]
    config = {
        "dtype": plan.build["dtype"],
        "tokenizer_name": tokenizer.info.name,
        "text_column": opts.text_column,
        "skip_bad_lines": opts.skip_bad_lines,
        "eos_id": tokenizer.info.eos_id,
        "append_eos": _appends_eos(reference.tok, tokenizer.info.eos_id),
        "max_tokens_per_shard": opts.max_tokens_per_shard,
        "chat": chat,
        "strict_backend": opts.backend == "fastokens",
    }
    try:
        fell_back = folder.encoder_fallback() is not None
        ran: dict[int, TaskResult] = {}  # by task index: a task encoded again counts once
        todo = [t for t in mine if not _done_by(folder.done(t, itemsize), fell_back)]
        batch = todo
        if batch:
            backend = _settle_backend(opts, choice, folder)
        while batch:  # a second pass only after fastokens differed: it redoes what fastokens encoded
            backend, done_now = _run_tasks(batch, plan, folder, tokenizer, config, opts, backend, reference)
            ran.update(done_now)
            fallback = folder.encoder_fallback()
            fell_back = fallback is not None
            if fell_back and folder.completed_manifest() is not None:  # another machine published it meanwhile
                break
            if fell_back and backend == "fastokens":  # another machine saw fastokens differ while this one ran
                backend = _fall_back(opts, fallback, "another run of this job", redo=True)
            batch = [t for t in mine if not _done_by(folder.done(t, itemsize), fell_back)] if fell_back else []
    except WorkerDied as e:
        raise NanosetError(
            f"task {e.task.index} ({describe_task(e.task)}): its worker process {e.cause()}; the tasks finished "
            f"so far are kept: rerun the same command to resume (with fewer --workers if memory ran out)"
        ) from None
    except FileNotFoundError as e:  # a file of ours removed under us: by another job on this folder
        ours = {os.path.realpath(folder.path), os.path.realpath(folder.work)}
        if e.filename is None or os.path.dirname(os.path.realpath(e.filename)) not in ours:
            raise
        raise NanosetError(
            f"{opts.output}: {Path(e.filename).name} was removed while this run wrote it: is another `nanoset "
            f"tokenize` writing to this folder (with --overwrite, or the same --task-index)? Run one such job at "
            f"a time; rerunning resumes"
        ) from None

    fell_back = folder.encoder_fallback() is not None
    recorded = [folder.done(t, itemsize) for t in plan.tasks]
    results = [r if _done_by(r, fell_back) else None for r in recorded]
    if any(r is None for r in results):
        finished = folder.completed_manifest()
        if finished is not None and finished.build == plan.build:  # another machine finished it meanwhile
            folder.finish()
            return _summary(opts, plan, finished, list(ran.values()), len(mine) - len(todo), True, t0)
        # other --task-index runs have work left
        partial = Manifest(tokenizer.info, plan.build["dtype"],
                           [s for t in mine if results[t.index] is not None for s in results[t.index].shards],
                           loss_masks=chat is not None)
        summary = _summary(opts, plan, partial, list(ran.values()), len(mine) - len(todo), False, t0)
        # tasks other runs finished with fastokens before the fallback: they are redone only when those runs rerun
        summary.redo_elsewhere = sum(r is not None and results[i] is None for i, r in enumerate(recorded))
        return summary
    manifest = Manifest(tokenizer=tokenizer.info, dtype=plan.build["dtype"],
                        shards=[s for r in results for s in r.shards], build=plan.build,
                        skipped_lines=sum(r.skipped_lines for r in results),
                        skipped_examples=[e for r in results for e in r.skipped_examples][:SKIPPED_EXAMPLES],
                        loss_masks=chat is not None,
                        chat_template_sha256=chat["template_sha256"] if chat else None,
                        loss_mask_rule=MASK_RULE if chat else None,
                        chat_template_file=chat["template_file"] if chat else None,
                        encoders=sorted({r.encoder or TokenizersEncoder.name for r in results}))
    if manifest.num_documents == 0 and manifest.skipped_lines:
        raise NanosetError(f"{', '.join(opts.inputs)}: all {manifest.skipped_lines:,} rows were bad and skipped "
                           f"(--skip-bad-lines); nothing to tokenize: rerun with --overwrite and without "
                           f"--skip-bad-lines to see the first error")
    if manifest.num_documents == 0:
        raise NanosetError(f"{', '.join(opts.inputs)}: no documents found in the input; nothing to tokenize")
    try:
        folder.write_skipped_list(plan.tasks, results)
        write_manifest(opts.output, manifest)
    except FileNotFoundError:  # another machine finished at the same time and removed our temporary file
        finished = folder.completed_manifest()
        if finished is None or finished.build != plan.build:
            raise
    folder.finish()
    return _summary(opts, plan, manifest, list(ran.values()), len(mine) - len(todo), True, t0)


def _note(message: str) -> None:
    print(f"note: {message}", file=sys.stderr, flush=True)


def _settle_backend(opts: TokenizeOptions, choice: BackendChoice, folder: OutputFolder) -> str:
    """The backend this run starts with: ``--backend`` as ``choose_backend`` settled it (its note printed), and
    tokenizers where an earlier run of this job saw fastokens differ or fail."""
    if choice.note:
        _note(choice.note)
    earlier = folder.encoder_fallback()
    if earlier is not None and choice.backend == "fastokens":
        return _fall_back(opts, earlier, "an earlier run of this job")
    return choice.backend


def _fall_back(opts: TokenizeOptions, reason: str, who: str, redo: bool = False) -> str:
    """Tokenizers from now on, because ``who`` saw fastokens differ or fail (``reason``), said once; ``--backend
    fastokens``: an error."""
    if opts.backend == "fastokens":
        raise NanosetError(f"--backend fastokens: {who} saw {reason}; use --backend auto or tokenizers")
    _note(f"encoding with tokenizers{' (what fastokens encoded is encoded again)' if redo else ''}, as {who} did: "
          f"{reason}")
    return "tokenizers"


def _done_by(result: TaskResult | None, fell_back: bool) -> bool:
    """A task result that stands: after fastokens differed anywhere in the job, only tokenizers' do."""
    return result is not None and not (fell_back and result.by_fastokens)


def _summary(opts: TokenizeOptions, plan: Plan, manifest: Manifest, ran: list[TaskResult], resumed: int,
             complete: bool, t0: float) -> TokenizeSummary:
    return TokenizeSummary(
        output=opts.output, complete=complete, num_tasks=len(plan.tasks), tasks_run=len(ran), tasks_resumed=resumed,
        tokens_run=sum(s.num_tokens for r in ran for s in r.shards),
        documents=manifest.num_documents, tokens=manifest.num_tokens, shards=len(manifest.shards),
        skipped_lines=manifest.skipped_lines, seconds=time.perf_counter() - t0,
        skipped_examples=list(manifest.skipped_examples) if complete else [],
    )


class ProgressLog:
    """Progress as a line on stderr every ``$NANOSET_PROGRESS_SECONDS`` (default 30) seconds, for a stderr that
    is no terminal (a batch system's log), where a progress bar would write nothing or a mess of redraws; the
    summary line ends the run."""

    def __init__(self, output: Path, total: int) -> None:
        self.output, self.total = output, total
        self.interval = float(os.environ.get("NANOSET_PROGRESS_SECONDS") or PROGRESS_SECONDS)
        self.start = self.last = time.perf_counter()

    def update(self, done: int, documents: int, tokens: int) -> None:
        now = time.perf_counter()
        if now - self.last < self.interval:
            return
        self.last = now
        elapsed = now - self.start
        print(f"{self.output}: {done} of {self.total} tasks, {documents:,} documents, {tokens:,} tokens, "
              f"{tokens / max(elapsed, 1e-9):,.0f} tokens/s, {elapsed:.0f}s", file=sys.stderr, flush=True)


def _run_tasks(todo: list[Task], plan: Plan, folder: OutputFolder, tokenizer: ResolvedTokenizer,
               config: dict, opts: TokenizeOptions, backend: str,
               reference: TokenizersEncoder) -> tuple[str, dict[int, TaskResult]]:
    """Run tasks in a process pool (or inline for one worker), with a progress bar on a terminal (else a line
    now and then); returns the backend in use at the end and the results by task index. Each fastokens
    result's checks are compared with ``reference``: from the first difference (or a worker where fastokens
    cannot load the tokenizer) on, tokenizers, noted once and recorded in the work folder for reruns
    (``--backend fastokens``: an error)."""
    from tqdm import tqdm

    ctx = mp.get_context("spawn")
    counters = (ctx.Value("q", 0), ctx.Value("q", 0))
    workers = min(opts.workers, max(1, len(todo)))
    folder.remove_partials([task.shard_prefix(plan.width) for task in todo])
    initargs = (str(tokenizer.path), config, counters, workers > 1)
    terminal = sys.stderr.isatty()
    bar = tqdm(total=len(todo), unit="task", disable=not (opts.progress and terminal), dynamic_ncols=True)
    log = ProgressLog(opts.output, len(todo)) if opts.progress and not terminal else None
    start = time.perf_counter()
    ran: dict[int, TaskResult] = {}

    def refresh() -> None:
        rate = counters[1].value / max(time.perf_counter() - start, 1e-9)
        bar.set_postfix_str(f"{counters[0].value:,} docs, {counters[1].value:,} tokens, {rate:,.0f} tok/s")
        if log is not None:
            log.update(len(ran), counters[0].value, counters[1].value)

    state = {"backend": backend, "probed": backend != "fastokens"}

    def record(task: Task, result: TaskResult) -> None:
        reason = result.unusable
        for check in result.checks:
            state["probed"] = state["probed"] or check.task is None
            if reason is None and (difference := first_difference(reference, check)) is not None:
                reason = f"{result.encoder} and tokenizers differ on {difference} (a fastokens bug: please report it)"
                if config["strict_backend"]:
                    raise NanosetError(f"--backend fastokens: {reason}; use --backend auto or tokenizers")
        result.checks, result.unusable = [], None
        if reason is not None and state["backend"] == "fastokens":  # recorded before the task's marker: a run
            folder.record_encoder_fallback(reason)  # killed in between must not keep a differing task's shards
            redo = " (what fastokens encoded is encoded again)" if result.by_fastokens else ""
            _note(f"encoding with tokenizers{redo}: {reason}")
            state["backend"] = "tokenizers"
        folder.mark_done(task, result)
        ran[task.index] = result
        bar.update(1)
        refresh()

    def args_of(task: Task) -> tuple:
        return task, str(folder.path), task.shard_prefix(plan.width), state["backend"], not state["probed"]

    try:
        if workers == 1:
            _init_worker(*initargs[:3], False)
            for task in todo:
                record(task, run_task(*args_of(task)))
            return state["backend"], ran
        pool = TaskPool(ctx, workers, _init_worker, initargs, run_task)
        try:
            for task, result in pool.run(todo, args_of, refresh):
                record(task, result)
        finally:
            pool.close()
        return state["backend"], ran
    finally:
        bar.close()
