"""``nanoset verify --retokenize N``: re-encode sampled documents from the recorded inputs with the
``tokenizers`` backend and compare them with the shards.

Checksums prove the files are the ones written; this proves what was written is what tokenizers makes of
the inputs: it catches a wrong tokenizer, an encoder backend that drifted, or a copy corrupted in a way its
checksums were recomputed for. Each task's documents are its shards' documents in order (a task writes every
row its pieces yield, in order), so a sampled document is found by reading its task's pieces again, up to it.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from nanoset.errors import NanosetError
from nanoset.format.open import open_dataset
from nanoset.format.reader import NanosetReader
from nanoset.tokenize.backends import TokenizersEncoder
from nanoset.tokenize.chat import MASK_RULE, ChatColumns
from nanoset.tokenize.chat_template import ChatRenderer, load_chat_template
from nanoset.tokenize.inputs import Piece, Source
from nanoset.tokenize.rows import TextReader
from nanoset.tokenize.tokenizer import file_sampling_settings, load_tokenizer, registered_tokens, shown_settings
from nanoset.tokenize.worker import appends_eos, encode_batch, reader_for
from nanoset.verify import check_retokenize_count

SAMPLE_SEED = 0  # the documents sampled are the same on every run of the check


@dataclass
class Sampled:
    """A sampled document: its index in the dataset, its shard and its index in its task's documents."""

    index: int
    shard: str
    in_task: int


def _tasks(ds: NanosetReader) -> dict[str, list[int]]:
    """Shard positions by task (shard names are ``TASK_PART``), in order."""
    tasks: dict[str, list[int]] = {}
    for i, shard in enumerate(ds.manifest.shards):
        tasks.setdefault(shard.name.split("_")[0], []).append(i)
    return tasks


def _gone(path: str, what: str) -> NanosetError:
    where = "" if Path(path).is_absolute() else " (a relative path: run verify where tokenize ran)"
    return NanosetError(f"cannot re-encode: {what} {path} is gone{where}; --retokenize needs the inputs and the "
                        f"tokenizer the dataset was made from")


def _sources(ds: NanosetReader) -> dict[tuple[str, str | None], Source]:
    return {(d["path"], d.get("split")): Source(d["path"], d["kind"], d["bytes"], 0, d.get("split"))
            for d in ds.manifest.build["inputs"]}


def _check_source(source: Source) -> None:
    p = Path(source.path)
    if not p.exists():
        raise _gone(source.path, "input")
    size = sum(f.stat().st_size for f in p.rglob("*.arrow")) if source.kind == "hf" else p.stat().st_size
    if size != source.bytes:
        raise NanosetError(f"cannot re-encode: input {source.path} holds {size:,} bytes, not the {source.bytes:,} it "
                           f"had when the dataset was made: it changed since")


def _tokenizer(ds: NanosetReader):
    """The tokenizer the dataset was made with, if its file is still there and unchanged, and the files beside it
    still register the tokens the dataset was made with."""
    info = ds.manifest.tokenizer
    if not info.path or not Path(info.path).is_file():
        raise _gone(info.path or info.name, "tokenizer")
    if not info.matches_file(info.path):
        raise NanosetError(f"cannot re-encode: tokenizer {info.path} changed since the dataset was made (its sha256 "
                           f"differs from the manifest's); --retokenize needs the tokenizer that made it")
    now, then = registered_tokens(Path(info.path)), ds.manifest.build.get("registered_tokens", [])
    if now != then:
        def names(tokens: list[dict]) -> str:
            return ", ".join(repr(t["content"]) for t in tokens) or "none"

        raise NanosetError(f"cannot re-encode: the tokens registered from the files beside {info.path} changed since "
                           f"the dataset was made (now {names(now)}, then {names(then)}); --retokenize needs the "
                           f"tokenizer that made it")
    return load_tokenizer(Path(info.path))


def _chat_rows(ds: NanosetReader) -> tuple[ChatColumns, ChatRenderer]:
    """How to read the conversations of a ``--chat`` dataset: its recorded columns, and its template (the file
    it names, else the tokenizer's own, by sha256) with its special tokens."""
    m = ds.manifest
    chat = m.build["chat"]
    file = m.chat_template_file
    if file is not None and not Path(file).is_file():
        raise _gone(file, "chat template")
    template = load_chat_template(Path(m.tokenizer.path), file)
    if template.sha256 != m.chat_template_sha256:
        raise NanosetError(f"cannot re-encode: the chat template of {template.origin} changed since the dataset was "
                           f"made (its sha256 differs from the manifest's)")
    renderer = ChatRenderer(template, chat["special_tokens"])
    return ChatColumns(chat["messages_column"], chat["prompt_column"], chat["completion_column"]), renderer


def retokenize(path: Path, count: int) -> tuple[list[str], str]:
    """Compare ``count`` sampled documents of the dataset at ``path`` with the tokenizers backend's encoding of
    their recorded inputs. Returns one line per differing document and a summary line; raises (one line) when
    the check cannot be made."""
    check_retokenize_count(count)
    ds = open_dataset(path)
    m = ds.manifest
    if m is None or "inputs" not in m.build:
        raise NanosetError(f"{path}: not made by `nanoset tokenize` (no recorded inputs): nothing to re-encode")
    encoder = TokenizersEncoder(_tokenizer(ds))
    eos_id = m.tokenizer.eos_id
    chat = "chat" in m.build
    # masks of another rule (an older nanoset's) are not what re-encoding makes: their ids are still compared
    masks = chat and m.loss_mask_rule == MASK_RULE
    rows = _chat_rows(ds) if chat else m.build["text_column"]

    def reader_of(piece: Piece) -> TextReader:
        return reader_for(piece, rows, m.build["skip_bad_lines"])

    append_eos = appends_eos(encoder.tok, eos_id)
    picks = np.sort(np.random.default_rng(SAMPLE_SEED).choice(ds.num_documents, min(count, ds.num_documents),
                                                              replace=False))
    sources = _sources(ds)
    lines: list[str] = []
    for name, positions in _tasks(ds).items():
        first, last = int(ds.document_offsets[positions[0]]), int(ds.document_offsets[positions[-1] + 1])
        wanted = [int(d) for d in picks if first <= d < last]
        if not wanted:
            continue
        sampled = [Sampled(d, ds.manifest.shards[ds.shard_of_document(d)].name, d - first) for d in wanted]
        values = _read_task(ds, positions, sources, reader_of, [s.in_task for s in sampled], name)
        flat, loss, lengths = encode_batch(encoder, values, chat, eos_id, append_eos)
        ends = np.cumsum(lengths)
        for k, s in enumerate(sampled):
            a, b = int(ends[k] - lengths[k]), int(ends[k])
            start, stop = ds.document_bounds(s.index)
            problem = _difference(np.asarray(ds.tokens(start, stop)), flat[a:b], "token ids")
            if problem is None and masks:
                problem = _difference(np.asarray(ds.loss_mask(start, stop)), loss[a:b], "loss mask bytes")
            if problem is not None:
                lines.append(f"document {s.index} (shard {s.shard}): {problem}")
    n = len(picks)
    if lines:
        raise RetokenizeMismatch(lines, f"{path}: {len(lines)} of {n} re-encoded documents differ from the shards "
                                        f"(tokenizers {encoder.version}); the dataset does not match its inputs and "
                                        f"tokenizer: re-create it with `nanoset tokenize ... --overwrite "
                                        f"--backend tokenizers`")
    what = "ids and loss masks" if masks else "ids"
    unchecked = (f" (loss masks not compared: made with loss-mask rule {m.loss_mask_rule}, this nanoset makes rule "
                 f"{MASK_RULE})" if chat and not masks else "")
    if sampling := file_sampling_settings(Path(m.tokenizer.path)):  # set off by load_tokenizer, as tokenize does
        unchecked += f" (the tokenizer's {shown_settings(sampling)} set off, as tokenize does)"
    return lines, (f"OK: {path}: {n} sampled documents re-encoded from their inputs with tokenizers "
                   f"{encoder.version}: {what} identical to the shards{unchecked}")


class RetokenizeMismatch(NanosetError):
    """Documents whose re-encoding differs: ``lines`` names each (document, first differing position)."""

    def __init__(self, lines: list[str], summary: str) -> None:
        super().__init__(summary)
        self.lines = lines


def _difference(stored: np.ndarray, encoded: np.ndarray, what: str) -> str | None:
    """Where ``encoded`` first differs from ``stored``, in words; None when equal."""
    n = min(len(stored), len(encoded))
    unequal = np.flatnonzero(stored[:n].astype(np.int64) != encoded[:n].astype(np.int64))
    if len(unequal):
        i = int(unequal[0])
        return f"{what} differ first at position {i}: the shard has {int(stored[i])}, re-encoding gives " \
               f"{int(encoded[i])}"
    if len(stored) != len(encoded):
        return f"{what} differ first at position {n}: the shard has {len(stored)} tokens, re-encoding gives " \
               f"{len(encoded)}"
    return None


def _read_task(ds: NanosetReader, positions: list[int], sources: dict, reader_of, wanted: list[int],
               task: str) -> list:
    """The values (texts or rendered chats) at indices ``wanted`` (sorted) of a task's documents, read from its
    recorded pieces up to the last one wanted."""
    pieces: list[dict] = []
    for i in positions:
        for p in ds.manifest.shards[i].sources:
            if not pieces or pieces[-1] != p:
                pieces.append(p)
    out, seen, want = [], 0, set(wanted)
    for p in pieces:
        source = sources.get((p["path"], p.get("split")))
        if source is None:
            raise NanosetError(f"{ds.folder}: task {task} names input {p['path']}, which the manifest's inputs "
                               f"do not list: the manifest is damaged")
        _check_source(source)
        reader = reader_of(Piece(source, p["start"], p["stop"], 0))
        for batch in reader.batches():
            for value in batch:
                if seen in want:
                    out.append(value)
                seen += 1
            if seen > wanted[-1]:
                return out
    raise NanosetError(f"cannot re-encode: the inputs of task {task} now yield {seen} documents, fewer than its "
                       f"shards hold: they changed since the dataset was made")
