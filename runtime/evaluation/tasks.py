"""A multiple-choice task file and its encoding, as lm-evaluation-harness's log-likelihood rule reads one.

A task is a JSON-lines file, one item a line: ``{"context": str, "choices": [str, ...], "gold": int}``. Each
(context, choice) pair is a request: the context and the choice are encoded separately (no special tokens) and
concatenated, and the choice's tokens are the ones scored. A context that encodes to no token starts with the
EOS token instead, so that the choice's first token has something to be predicted from (the harness does the
same). Torch-free: the config check reads and encodes every task before any process starts.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from nanoset.errors import ConfigError


@dataclass(frozen=True)
class TaskItem:
    context: str
    choices: tuple[str, ...]
    gold: int


@dataclass(frozen=True)
class Request:
    """One (item, choice) pair as token ids: ``ids`` = context + choice, the last ``scored`` of them the choice's."""

    ids: tuple[int, ...]
    scored: int


@dataclass(frozen=True)
class Task:
    name: str
    path: str
    items: list[TaskItem]
    requests: list[Request]  # item-major: every choice of item 0, then of item 1, ...

    def check_fits(self, sequence_length: int) -> None:
        """Every choice must fit in one window of ``sequence_length`` predicted tokens (the context is cut from the
        left when the pair is longer, as the harness cuts it)."""
        k = 0
        for line, item in enumerate(self.items, 1):
            for c in range(len(item.choices)):
                if self.requests[k].scored > sequence_length:
                    raise ConfigError(f"{self.path}:{line}: choice {c} is {self.requests[k].scored} tokens, longer "
                                      f"than the evaluation's sequence length {sequence_length}; shorten it")
                k += 1


def read_items(path: str | Path) -> list[TaskItem]:
    """The items of a task file; a missing file or a bad line is one ``ConfigError`` naming the file and line."""
    try:
        lines = Path(path).read_text(encoding="utf-8").splitlines()
    except FileNotFoundError:
        raise ConfigError(f"{path}: no such task file; give evaluation.tasks[].path as a JSON-lines file of "
                          f'{{"context", "choices", "gold"}} rows') from None
    except (OSError, UnicodeDecodeError) as e:
        raise ConfigError(f"{path}: cannot read the task file ({e})") from None
    items = [_item(path, n, line) for n, line in enumerate(lines, 1) if line.strip()]
    if not items:
        raise ConfigError(f"{path}: the task file holds no item; write one JSON object a line")
    return items


def _item(path: str | Path, n: int, line: str) -> TaskItem:
    where = f"{path}:{n}"
    try:
        row = json.loads(line)
    except ValueError as e:
        raise ConfigError(f"{where}: not JSON ({e.args[0] if e.args else e}); write one JSON object a line") from None
    if not isinstance(row, dict) or set(row) < {"context", "choices", "gold"}:
        raise ConfigError(f'{where}: an item is an object with "context", "choices" and "gold"')
    context, choices, gold = row["context"], row["choices"], row["gold"]
    if not isinstance(context, str):
        raise ConfigError(f'{where}: "context" must be a string')
    if not isinstance(choices, list) or len(choices) < 2 or not all(isinstance(c, str) and c for c in choices):
        raise ConfigError(f'{where}: "choices" must be a list of at least two non-empty strings')
    if isinstance(gold, bool) or not isinstance(gold, int) or not 0 <= gold < len(choices):
        raise ConfigError(f'{where}: "gold" is {gold!r}; it must be the index of the right choice, 0 to '
                          f"{len(choices) - 1}")
    return TaskItem(context, tuple(choices), gold)


def encode(items: list[TaskItem], tokenizer, eos_id: int | None, path: str | Path) -> list[Request]:
    """Every (item, choice) pair as a ``Request`` (``tokenizer``: a ``tokenizers.Tokenizer``)."""
    requests = []
    for n, item in enumerate(items, 1):
        context = tokenizer.encode(item.context, add_special_tokens=False).ids
        if not context:
            if eos_id is None:
                raise ConfigError(f"{path}:{n}: the context is empty and the data's tokenizer has no EOS token to "
                                  f"start it with; give the item a context")
            context = [eos_id]
        for c, choice in enumerate(item.choices):
            ids = tokenizer.encode(choice, add_special_tokens=False).ids
            if not ids:
                raise ConfigError(f"{path}:{n}: choice {c} {choice!r} encodes to no token")
            requests.append(Request(tuple(context + ids), len(ids)))
    return requests


def open_task(name: str, path: str, tokenizer, eos_id: int | None) -> Task:
    items = read_items(path)
    return Task(name, path, items, encode(items, tokenizer, eos_id, path))


def task_metrics(task: Task, logprobs: list[float]) -> dict[str, float | int]:
    """``{"acc", "acc_norm", "n"}``: the share of items whose highest summed log-probability (``acc``) or highest
    log-probability per character of the choice (``acc_norm``) is the gold choice; ties go to the first choice.
    ``logprobs``: one per request, in the task's order."""
    acc = acc_norm = 0
    k = 0
    for item in task.items:
        scores = logprobs[k:k + len(item.choices)]
        k += len(item.choices)
        per_char = [s / len(c) for s, c in zip(scores, item.choices)]
        acc += _first_best(scores) == item.gold
        acc_norm += _first_best(per_char) == item.gold
    n = len(task.items)
    return {"acc": acc / n, "acc_norm": acc_norm / n, "n": n}


def _first_best(values: list[float]) -> int:
    """The index of the highest value, the first of equal ones (numpy's argmax, which the harness uses)."""
    return max(range(len(values)), key=lambda i: (values[i], -i))
