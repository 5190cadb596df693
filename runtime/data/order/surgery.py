"""Data surgery: steps read but not trained, and documents excised from a step on — an input of the data order.

``Surgery`` is a value: skipped step ranges (``A:B``, both included) and exclusions (documents, each
from a first step). It comes from the config's ``surgery:`` section, from what ``nanoset train
--rewind-to`` recorded in the run folder, and from the checkpoint a run resumes; these add up (the
union: a recorded surgery is never dropped). A surgery that changes a step already trained by the
checkpoint (a skip or an exclusion that starts at or before its step) is refused: rewind instead.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

from nanoset.errors import ConfigError

SURGERY_KEY = "surgery"  # the checkpoint metadata key of ``surgery_record``


def parse_step_range(text: str, where: str) -> tuple[int, int]:
    """``A:B`` (both included, 1 ≤ A ≤ B) → (A, B); a bad form is one ``ConfigError`` naming ``where``."""
    first, sep, last = str(text).partition(":")
    if not sep or not first.strip().isdigit() or not last.strip().isdigit() or not 1 <= int(first) <= int(last):
        raise ConfigError(f"{where}: expected A:B with 1 ≤ A ≤ B (steps, both included), got {text!r}")
    return int(first), int(last)


def parse_document(text: str, where: str) -> tuple[str, int]:
    """``FOLDER:DOC`` → (folder, document index); a bad form is a ``ConfigError`` naming ``where``."""
    folder, sep, doc = text.strip().rpartition(":")
    if not sep or not folder or not doc.strip().isdigit():
        raise ConfigError(f"{where}: expected FOLDER:DOC (a dataset folder and a document index), got {text.strip()!r}")
    return folder, int(doc)


def read_documents_file(path: str, where: str) -> list[tuple[str, int]]:
    """The ``FOLDER:DOC`` lines of ``path`` (what ``explain --documents`` reads); blank lines are ignored."""
    try:
        with open(path, encoding="utf-8") as f:
            lines = f.read().splitlines()
    except OSError as e:
        raise ConfigError(f"{where}: {path}: cannot read it ({e.strerror or e})") from None
    out = [parse_document(line, f"{where}: {path} line {n}") for n, line in enumerate(lines, 1) if line.strip()]
    if not out:
        raise ConfigError(f"{where}: {path}: no FOLDER:DOC line in it; give one document a line")
    return out


@dataclass(frozen=True)
class Surgery:
    """Skipped steps and excluded documents. ``exclusions``: first step → documents ``(resolved folder, doc)``."""

    skip_steps: tuple[tuple[int, int], ...] = ()
    exclusions: dict[int, frozenset[tuple[str, int]]] = field(default_factory=dict)

    def __bool__(self) -> bool:
        return bool(self.skip_steps or self.exclusions)

    def skips(self, step: int) -> bool:
        """Whether ``step`` is read but not trained."""
        return any(a <= step <= b for a, b in self.skip_steps)

    def skipped_in(self, first: int, last: int) -> list[int]:
        """The skipped steps of ``[first, last]``."""
        return [s for a, b in self.skip_steps for s in range(max(a, first), min(b, last) + 1)]

    def union(self, other: Surgery) -> Surgery:
        skips = _merged(list(self.skip_steps) + list(other.skip_steps))
        exclusions = {s: set(d) for s, d in self.exclusions.items()}
        for step, docs in other.exclusions.items():
            exclusions.setdefault(step, set()).update(docs)
        return Surgery(skips, _normalised(exclusions))

    def documents_from(self) -> dict[tuple[str, int], int]:
        """Each excluded document → the first step it is excluded from."""
        out: dict[tuple[str, int], int] = {}
        for step in sorted(self.exclusions):
            for doc in self.exclusions[step]:
                out.setdefault(doc, step)
        return out

    def to_json(self) -> dict:
        return {"skip_steps": [f"{a}:{b}" for a, b in self.skip_steps],
                "exclusions": [{"from_step": s, "documents": [f"{f}:{d}" for f, d in sorted(docs)]}
                               for s, docs in sorted(self.exclusions.items())]}

    @staticmethod
    def from_json(d: dict | None, where: str = "surgery") -> Surgery:
        if not d:
            return Surgery()
        skips = [parse_step_range(s, f"{where}.skip_steps") for s in d.get("skip_steps", [])]
        exclusions: dict[int, set[tuple[str, int]]] = {}
        for e in d.get("exclusions", []):
            docs = [parse_document(t, f"{where}.exclusions") for t in e["documents"]]
            exclusions.setdefault(int(e["from_step"]), set()).update(docs)
        return Surgery(_merged(skips), _normalised(exclusions))

    def describe(self) -> list[str]:
        """Lines for a log or ``--check``: the steps skipped, the documents excised from which step."""
        out = []
        if self.skip_steps:
            out.append("skips steps " + ", ".join(f"{a}-{b}" if a != b else f"{a}" for a, b in self.skip_steps)
                       + " (read, not trained)")
        for step, docs in sorted(self.exclusions.items()):
            out.append(f"excises {len(docs)} document(s) from step {step}")
        return out


def _merged(ranges: list[tuple[int, int]]) -> tuple[tuple[int, int], ...]:
    """Ranges sorted, overlapping or adjacent ones merged: one spelling of a set of steps."""
    out: list[list[int]] = []
    for a, b in sorted(ranges):
        if out and a <= out[-1][1] + 1:
            out[-1][1] = max(out[-1][1], b)
        else:
            out.append([a, b])
    return tuple((a, b) for a, b in out)


def _normalised(exclusions: dict[int, set[tuple[str, int]]]) -> dict[int, frozenset[tuple[str, int]]]:
    """A document excluded from two steps counts from the first; steps sorted, none empty."""
    seen: set[tuple[str, int]] = set()
    out = {}
    for step in sorted(exclusions):
        docs = frozenset(d for d in exclusions[step] if d not in seen)
        seen |= docs
        if docs:
            out[step] = docs
    return out


def surgery_of(skip_steps: list[str], documents: list[tuple[str, int]], from_step: int, where: str) -> Surgery:
    """A surgery of step ranges and ``(folder, doc)`` documents (folders resolved here) excluded from ``from_step``."""
    skips = [parse_step_range(s, f"{where}.skip_steps") for s in skip_steps]
    docs = {(os.path.realpath(f), d) for f, d in documents}
    return Surgery(_merged(skips), _normalised({from_step: docs} if docs else {}))


def config_surgery(config) -> Surgery:
    """The config's ``surgery:`` section as a ``Surgery`` (its documents file read here)."""
    s = config.surgery
    documents = [parse_document(t, "surgery.exclude_documents") for t in s.exclude_documents]
    if s.exclude_documents_file is not None:
        documents += read_documents_file(s.exclude_documents_file, "surgery.exclude_documents_file")
    return surgery_of(s.skip_steps, documents, s.exclude_from_step, "surgery")


def surgery_record(surgery: Surgery) -> dict:
    """What a checkpoint records of the surgery in force (stored under ``SURGERY_KEY``)."""
    return surgery.to_json()


def resumed_surgery(surgery: Surgery, recorded: dict | None, last_step: int, checkpoint: str) -> Surgery:
    """The surgery of a run resuming ``checkpoint`` (of step ``last_step``, which recorded ``recorded``): the union,
    refused when what is new to the checkpoint would change a step it trained already."""
    past = Surgery.from_json(recorded, f"{checkpoint}: surgery")
    total = surgery.union(past)
    new_skips = [(a, b) for a, b in surgery.skip_steps
                 if any(not past.skips(s) for s in range(a, min(b, last_step) + 1))]
    if new_skips:
        a, b = new_skips[0]
        raise ConfigError(f"{checkpoint}: surgery skips steps {a}-{b}, but this checkpoint trained steps up to "
                          f"{last_step}; a skip must start after the step resumed: rewind to an earlier checkpoint "
                          f"(nanoset train --rewind-to STEP with STEP < {a})")
    before = past.documents_from()
    for doc, step in sorted(surgery.documents_from().items(), key=lambda kv: kv[1]):
        if step <= last_step and before.get(doc, last_step + 1) > step:
            raise ConfigError(f"{checkpoint}: surgery excludes {doc[0]}:{doc[1]} from step {step}, but this checkpoint "
                              f"trained steps up to {last_step}; an exclusion must start after the step resumed: "
                              f"rewind to an earlier checkpoint (nanoset train --rewind-to STEP with STEP < {step})")
    return total
