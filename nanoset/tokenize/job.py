"""The tokenize job: parallel, deterministic, resumable.

Each task of the plan is tokenized by a worker process (``nanoset.tokenize.worker``) straight
into its own shard files, published by rename, then a marker. A rerun skips tasks with a
marker; the manifest is written last from the markers in task order. The bytes written depend
only on the plan, never on the number of workers or machines or on restarts. With ``chat`` the
rows are conversations (``nanoset.tokenize.chat``) and every shard also gets its loss mask.
"""

from __future__ import annotations

import hashlib
import json
import multiprocessing as mp
import os
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field, fields
from pathlib import Path

import numpy as np

from nanoset.env import env_number
from nanoset.errors import NanosetError, OptionError, print_note
from nanoset.format.spec import SKIPPED_EXAMPLES, SKIPPED_NAME, Manifest, dtype_for_vocab, dtype_name
from nanoset.format.writer import write_manifest
from nanoset.tokenize.backends import (
    REFERENCE,
    BackendChoice,
    Encoder,
    FastFallback,
    TokenizersEncoder,
    choose_backend,
    difference_reason,
    encoded_fast,
    first_difference,
    is_fast,
)
from nanoset.tokenize.chat import MASK_RULE, ChatColumns, split_markers, split_markers_note
from nanoset.tokenize.chat_template import ChatRenderer, load_chat_template, special_token_strings
from nanoset.tokenize.inputs import discover
from nanoset.tokenize.remote_inputs import local_inputs, with_origins
from nanoset.tokenize.taskpool import TaskPool, WorkerDied
from nanoset.tokenize.tasks import OutputFolder, Task, TaskResult, TokenizePlan, describe_task, make_plan
from nanoset.tokenize.tokenizer import (
    ResolvedTokenizer,
    find_tokenizer_file,
    load_tokenizer,
    registered_tokens,
    resolve_tokenizer,
    sampling_note,
)
from nanoset.tokenize.worker import ChatSetup, WorkerConfig, appends_eos, init_worker, run_task


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
    backend: str = "auto"  # the encoder: auto (a fast backend where it loads and agrees), a fast one, or the reference


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
    redo_elsewhere: int = 0  # tasks of other task indices done by the fast backend before it was seen to differ
    redo_backend: str = ""  # that fast backend's name

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
                     f"{self.redo_backend} before it was seen to differ: rerun those task indices to encode "
                     f"{'them' if n > 1 else 'it'} again")
        else:
            state = "partial: other task indices still to run"
        return (
            f"{self.output}: {self.documents:,} documents, {self.tokens:,} tokens in {self.shards} shards; "
            f"ran {self.tasks_run} of {self.num_tasks} tasks ({self.tasks_resumed} already done) "
            f"in {self.seconds:.1f}s, {rate:,.0f} tokens/s tokenized; skipped {self.skipped_lines} bad lines; {state}"
        )


# ---------------------------------------------------------------- checking options ----------

def check_options(opts: TokenizeOptions) -> None:
    """The options alone make sense (before anything is read): counts in range, and no option of the other kind
    of rows (a text column for conversations, or the reverse), which would be silently ignored."""
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
    defaults = {f.name: f.default for f in fields(TokenizeOptions)}
    if opts.chat and opts.text_column != defaults["text_column"]:
        raise NanosetError("--text-column does not apply with --chat (conversations are read from --messages-column, "
                           "or --prompt-column and --completion-column)")
    for name in ("messages_column", "prompt_column", "completion_column"):
        if not opts.chat and getattr(opts, name) != defaults[name]:
            raise NanosetError(f"--{name.replace('_', '-')} needs --chat")
    if not opts.chat and opts.chat_template is not None:
        raise NanosetError("--chat-template needs --chat")


def job_tokenizer(opts: TokenizeOptions) -> ResolvedTokenizer:
    """The tokenizer of ``opts`` with its EOS settled; a path or name that holds none is an ``OptionError`` of
    ``tokenizer``."""
    try:
        find_tokenizer_file(opts.tokenizer)
    except NanosetError as e:
        raise OptionError("tokenizer", str(e)) from None
    return resolve_tokenizer(opts.tokenizer, opts.eos_token)


def chat_setup(opts: TokenizeOptions, tokenizer: ResolvedTokenizer) -> ChatSetup | None:
    """What workers need to render conversations (None without ``--chat``); the template is compiled here
    once, so a syntax error stops the job before any worker starts. A template that cannot be read or
    compiled is an ``OptionError`` of ``chat_template``."""
    if not opts.chat:
        return None
    try:
        template = load_chat_template(tokenizer.path, opts.chat_template)
        special = special_token_strings(tokenizer.path, tokenizer.info.eos_token)  # the template's globals
        renderer = ChatRenderer(template, special)
    except NanosetError as e:
        raise OptionError("chat_template", str(e)) from None
    split = split_markers(renderer, tokenizer.tokenizer or load_tokenizer(tokenizer.path))
    return ChatSetup(template, special, ChatColumns(opts.messages_column, opts.prompt_column, opts.completion_column),
                     str(Path(opts.chat_template).resolve()) if opts.chat_template else None, split)


def plan_options(opts: TokenizeOptions, tokenizer: ResolvedTokenizer, chat: ChatSetup | None) -> dict:
    """The options part of the job's plan: everything besides the inputs that decides the bytes written."""
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
    if tokenizer.sampling_off:  # the file's encoding would be random: the dataset is of its settings set off
        options["sampling_off"] = tokenizer.sampling_off
    if chat is not None:  # only chat plans carry the key: plain plans (and manifests) keep their bytes
        del options["text_column"]
        columns = chat.columns
        options["chat"] = {"template_sha256": chat.template.sha256, "special_tokens": chat.special_tokens,
                           "mask_rule": MASK_RULE, "messages_column": columns.messages,
                           "prompt_column": columns.prompt, "completion_column": columns.completion}
        if chat.split_markers:  # for inspect, in the template's order (derived from the tokenizer and template)
            options["chat"]["split_markers"] = [[m, n] for m, n in chat.split_markers.items()]
    return options


def plan_key(opts: TokenizeOptions) -> str:
    """The key of a job's options: the sha256 of the options part of its plan (``plan_options``: the tokenizer's
    sha256, its EOS id and registered tokens, the dtype, the shard size and bad-row handling, and the text
    column, or for conversations the template's sha256, the special-token strings it renders, the mask rule
    and the columns). Options that do not change the bytes (workers, task index, progress, backend, output)
    leave it as it is; the inputs are not part of it. Raises as the job would on options it cannot use
    (``OptionError`` for the tokenizer and the chat template)."""
    check_options(opts)
    tokenizer = job_tokenizer(opts)
    options = plan_options(opts, tokenizer, chat_setup(opts, tokenizer))
    return hashlib.sha256(json.dumps(options, sort_keys=True).encode("utf-8")).hexdigest()


def build_plan(opts: TokenizeOptions, tokenizer: ResolvedTokenizer, chat: ChatSetup | None = None) -> TokenizePlan:
    inputs, origins = local_inputs(opts.inputs)  # a URL: its copy in the cache
    sources = with_origins(discover(inputs, exclude=opts.output), origins)
    if opts.splits is not None:
        sources = [s for s in sources if s.split is None or s.split in opts.splits]
        missing = set(opts.splits) - {s.split for s in sources}
        if missing:
            raise NanosetError(f"{', '.join(opts.inputs)}: no split named {', '.join(sorted(missing))}")
    return make_plan(sources, plan_options(opts, tokenizer, chat), opts.task_bytes)


# ---------------------------------------------------------------- the job ----------------------

def tokenize(opts: TokenizeOptions, on_start: Callable[[], None] | None = None) -> TokenizeSummary:
    """Run (or resume) the job described by ``opts``; returns what was done. ``on_start`` is called once every
    check has passed (tokenizer, chat template, inputs, output folder), just before the first task runs: a
    caller's "tokenizing now" line never comes before an error that stops the job at once."""
    check_options(opts)
    t0 = time.perf_counter()
    tokenizer = job_tokenizer(opts)
    chat = chat_setup(opts, tokenizer)
    plan = build_plan(opts, tokenizer, chat)
    reference = TokenizersEncoder(tokenizer.tokenizer or load_tokenizer(tokenizer.path))
    # before the output folder is touched (--overwrite empties it): a --backend that cannot run is refused first
    choice = choose_backend(tokenizer.path, opts.backend, opts.chat, lambda: reference)
    folder = OutputFolder(opts.output)
    folder.lock([t.index for t in plan.share(opts.num_tasks, opts.task_index)], opts.num_tasks, opts.task_index)
    try:
        complete = folder.prepare(plan, opts.overwrite)
        for note in folder.notes:
            print_note(note)
        if complete:
            return _summary(opts, plan, folder.completed_manifest(), [], len(plan.tasks), True, t0)
        run = JobRun(opts, tokenizer, chat, plan, folder, reference, t0)
        with _task_errors(opts, folder):
            ran, resumed = run.pending_tasks(choice, on_start)
        return run.publish(ran, resumed)
    finally:
        folder.release()


@dataclass
class JobRun:
    """One run of a job whose output folder is prepared: the tasks of this ``--task-index`` still to do, run,
    then published (the manifest, once every task of the job is done)."""

    opts: TokenizeOptions
    tokenizer: ResolvedTokenizer
    chat: ChatSetup | None
    plan: TokenizePlan
    folder: OutputFolder
    reference: Encoder
    t0: float

    def __post_init__(self) -> None:
        self.itemsize = np.dtype(self.plan.build["dtype"]).itemsize
        self.assigned_tasks = self.plan.share(self.opts.num_tasks, self.opts.task_index)
        self.fallback = FastFallback(self.opts.backend, self.folder.encoder_fallback,
                                     self.folder.record_encoder_fallback, print_note)

    def worker_config(self) -> WorkerConfig:
        info = self.tokenizer.info
        return WorkerConfig(dtype=self.plan.build["dtype"], tokenizer_name=info.name, text_column=self.opts.text_column,
                            skip_bad_lines=self.opts.skip_bad_lines, eos_id=info.eos_id,
                            append_eos=appends_eos(self.reference.tok, info.eos_id),
                            max_tokens_per_shard=self.opts.max_tokens_per_shard, chat=self.chat,
                            strict_backend=is_fast(self.opts.backend))

    def start_notes(self) -> list[str]:
        """What the user hears of as the work starts: what was decided for them about the tokenizer (an EOS taken
        by its name, a sampling setting set off) and chat markers it encodes as text."""
        notes = list(self.tokenizer.notes)
        if self.tokenizer.sampling_off:
            notes.append(sampling_note(self.tokenizer.path, self.tokenizer.sampling_off))
        if self.chat is not None and self.chat.split_markers:
            notes.append(split_markers_note(self.chat.split_markers, self.tokenizer.path))
        return notes

    def _pending(self) -> list[Task]:
        return [t for t in self.assigned_tasks if not self.fallback.stands(self.folder.done(t, self.itemsize))]

    def pending_tasks(self, choice: BackendChoice,
                      on_start: Callable[[], None] | None) -> tuple[dict[int, TaskResult], int]:
        """Run this run's tasks without a standing result; returns the results by task index (a task encoded
        again counts once) and how many were done already. A second pass runs only after the fast backend
        differed (here or on another machine meanwhile): it redoes what it encoded."""
        ran: dict[int, TaskResult] = {}
        todo = batch = self._pending()
        if not batch:
            return ran, len(self.assigned_tasks)
        if on_start is not None:
            on_start()
        for note in self.start_notes():
            print_note(note)
        backend = self.fallback.first_backend(choice)
        config = self.worker_config()
        while batch:
            backend, done_now = _run_tasks(batch, self.plan, self.folder, self.tokenizer, config, self.opts,
                                           self.fallback, backend, self.reference)
            ran.update(done_now)
            if not self.fallback.refresh():
                break
            if self.folder.completed_manifest() is not None:  # another machine published it meanwhile
                break
            if is_fast(backend):  # another machine saw the fast backend differ while this one ran
                backend = self.fallback.switch(self.fallback.reason, "another run of this job", redo=True)
            batch = self._pending()
        return ran, len(self.assigned_tasks) - len(todo)

    def publish(self, ran: dict[int, TaskResult], resumed: int) -> TokenizeSummary:
        """The manifest, once every task of the job (of every task index) has a standing result; else the
        summary of a partial job."""
        opts, plan, folder, chat = self.opts, self.plan, self.folder, self.chat
        self.fallback.refresh()
        recorded = [folder.done(t, self.itemsize) for t in plan.tasks]
        results = [r if self.fallback.stands(r) else None for r in recorded]
        if any(r is None for r in results):
            finished = folder.completed_manifest()
            if finished is not None and finished.build == plan.build:  # another machine finished it meanwhile
                folder.finish()
                return _summary(opts, plan, finished, list(ran.values()), resumed, True, self.t0)
            # other --task-index runs have work left
            partial = Manifest(self.tokenizer.info, plan.build["dtype"],
                               [s for t in self.assigned_tasks if results[t.index] is not None
                                for s in results[t.index].shards],
                               loss_masks=chat is not None)
            summary = _summary(opts, plan, partial, list(ran.values()), resumed, False, self.t0)
            # tasks other runs finished with the fast backend before the fallback: redone only when those runs rerun
            overturned = self.fallback.overturned(recorded)
            summary.redo_elsewhere, summary.redo_backend = len(overturned), ", ".join(sorted(set(overturned)))
            return summary
        manifest = Manifest(tokenizer=self.tokenizer.info, dtype=plan.build["dtype"],
                            shards=[s for r in results for s in r.shards], build=plan.build,
                            skipped_lines=sum(r.skipped_lines for r in results),
                            skipped_examples=[e for r in results for e in r.skipped_examples][:SKIPPED_EXAMPLES],
                            loss_masks=chat is not None,
                            chat_template_sha256=chat.template.sha256 if chat else None,
                            loss_mask_rule=MASK_RULE if chat else None,
                            chat_template_file=chat.template_file if chat else None,
                            encoders=sorted({r.encoder or REFERENCE for r in results}))
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
        return _summary(opts, plan, manifest, list(ran.values()), resumed, True, self.t0)


@contextmanager
def _task_errors(opts: TokenizeOptions, folder: OutputFolder) -> Iterator[None]:
    """What a run's end by a lost worker or a file removed under it means to the user: one line, and what to do."""
    try:
        yield
    except WorkerDied as e:
        raise NanosetError(
            f"task {e.task.index} ({describe_task(e.task)}): its worker process {e.cause()}; the tasks finished "
            f"so far are kept: rerun the same command to resume (with fewer --workers if memory ran out)"
        ) from None
    except FileNotFoundError as e:  # a file of ours removed under us: by another job on this folder
        own_folders = {os.path.realpath(folder.path), os.path.realpath(folder.work)}
        if e.filename is None or os.path.dirname(os.path.realpath(e.filename)) not in own_folders:
            raise
        raise NanosetError(
            f"{opts.output}: {Path(e.filename).name} was removed while this run wrote it: is another `nanoset "
            f"tokenize` writing to this folder (with --overwrite, or the same --task-index)? Run one such job at "
            f"a time; rerunning resumes"
        ) from None


def _summary(opts: TokenizeOptions, plan: TokenizePlan, manifest: Manifest, ran: list[TaskResult], resumed: int,
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
        self.interval = env_number("NANOSET_PROGRESS_SECONDS", PROGRESS_SECONDS, float, minimum=0)
        self.start = self.last = time.perf_counter()

    def update(self, done: int, documents: int, tokens: int) -> None:
        now = time.perf_counter()
        if now - self.last < self.interval:
            return
        self.last = now
        elapsed = now - self.start
        print(f"{self.output}: {done} of {self.total} tasks, {documents:,} documents, {tokens:,} tokens, "
              f"{tokens / max(elapsed, 1e-9):,.0f} tokens/s, {elapsed:.0f}s", file=sys.stderr, flush=True)


def _run_tasks(todo: list[Task], plan: TokenizePlan, folder: OutputFolder, tokenizer: ResolvedTokenizer,
               config: WorkerConfig, opts: TokenizeOptions, fallback: FastFallback, backend: str,
               reference: Encoder) -> tuple[str, dict[int, TaskResult]]:
    """Run tasks in a process pool (or inline for one worker), with a progress bar on a terminal (else a line
    now and then); returns the backend in use at the end and the results by task index. Each fast backend's
    result's checks are compared with ``reference``: from the first difference (or a worker where the fast
    backend cannot load the tokenizer) on, the reference (``fallback.differed``: noted once, recorded for
    reruns; ``--backend NAME``: an error)."""
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

    state = {"backend": backend, "probed": not is_fast(backend)}

    def record(task: Task, result: TaskResult) -> None:
        reason = result.unusable
        for check in result.checks:
            state["probed"] = state["probed"] or check.task is None
            if reason is None and (difference := first_difference(reference, check)) is not None:
                reason = difference_reason(result.encoder, difference)
        result.checks, result.unusable = [], None
        if reason is not None and is_fast(state["backend"]):  # recorded before the task's marker
            state["backend"] = fallback.differed(reason, redo=encoded_fast(result))  # --backend NAME: raises
        folder.mark_done(task, result)
        ran[task.index] = result
        bar.update(1)
        refresh()

    def args_of(task: Task) -> tuple:
        return task, str(folder.path), task.shard_prefix(plan.width), state["backend"], not state["probed"]

    try:
        if workers == 1:
            init_worker(*initargs[:3], False)
            for task in todo:
                record(task, run_task(*args_of(task)))
            return state["backend"], ran
        pool = TaskPool(ctx, workers, init_worker, initargs, run_task)
        try:
            for task, result in pool.run(todo, args_of, refresh):
                record(task, result)
        finally:
            pool.close()
        return state["backend"], ran
    finally:
        bar.close()
