"""Data surgery: steps read but not trained, and documents excised from a step on — an input of the data order.

``Surgery`` is a value: skipped step ranges (``A:B``, both included) and exclusions (documents, each
from a first step). It comes from the config's ``surgery:`` section, from what ``nanoset train
--rewind-to`` recorded in the run folder, and from the checkpoint a run resumes; these add up (the
union: a recorded surgery is never dropped). A surgery that changes a step already trained by the
checkpoint (a skip or an exclusion that starts at or before its step) is refused: rewind instead.

A dataset is named by its content, not its location: the documents of a folder that opens as a dataset are kept
under ``fingerprint:F`` (its manifest's fingerprint), the folder only for display (``names``), so a surgery
recorded by a checkpoint or a rewind follows the data to another path, mount or node. A name that is no dataset
folder (a Hugging Face stage's source) stays a resolved location, as do the folders of records made before.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

import numpy as np

from nanoset import NanosetError, open_dataset, storage
from nanoset.errors import ConfigError
from runtime.config.parsers import MAX_DIGITS, parse_document, parse_step_range
from runtime.data.order.excision import sorted_unique

SURGERY_KEY = "surgery"  # the checkpoint metadata key of ``surgery_record``
FINGERPRINT = "fingerprint:"  # a dataset key of content: ``fingerprint:`` and the manifest's fingerprint


# The common form, unindented and with an index that fits int64; anything else goes through parse_document.
_LINE = re.compile(rf"^(\S.*):([0-9]{{1,{MAX_DIGITS}}})$", re.M)


def read_document_lines(path: str, where: str) -> list[tuple[str, int | str]]:
    """The ``FOLDER:DOC`` lines of ``path`` in order, blank lines ignored: one reader for ``explain --documents``,
    ``--exclude-documents`` and ``surgery.exclude_documents_file``. UTF-8, with or without a byte-order mark
    (editors on Windows write one); anything else is one ``ConfigError`` naming the file and the line. One regular
    expression over the text when every line has the plain form (100,000 lines in a fraction of a second; the
    index is then left as digits), a line at a time otherwise."""
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError as e:
        raise ConfigError(f"{where}: {path}: cannot read it ({e.strerror or e})") from None
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        line = data.count(b"\n", 0, e.start) + 1
        raise ConfigError(f"{where}: {path} line {line}: not UTF-8 (byte {data[e.start]:#04x}); save the file as "
                          f"UTF-8, one FOLDER:DOC a line") from None
    found = _LINE.findall(text)
    if len(found) != text.count("\n") + (not text.endswith("\n")):  # blank lines, spaces, or a mistake
        found = [parse_document(line, f"{where}: {path} line {n}") for n, line in enumerate(text.splitlines(), 1)
                 if line.strip()]
    if not found:
        raise ConfigError(f"{where}: {path}: no FOLDER:DOC line in it; give one document a line")
    return found


def read_documents_file(path: str, where: str) -> dict[str, np.ndarray]:
    """The documents ``path`` lists (``read_document_lines``) as folder → document indices."""
    folders, docs = zip(*read_document_lines(path, where))
    numbers = np.array(docs).astype(np.int64)
    named = set(folders)
    if len(named) == 1:
        return {folders[0]: numbers}
    spelled = np.array(folders, dtype=object)
    return {f: numbers[spelled == f] for f in sorted(named)}


def documents_of(pairs: list[tuple[str, int]]) -> dict[str, np.ndarray]:
    """``(folder, doc)`` pairs as folder → document indices."""
    lists: dict[str, list[int]] = {}
    for folder, doc in pairs:
        lists.setdefault(folder, []).append(doc)
    return {f: np.array(d, dtype=np.int64) for f, d in lists.items()}


Documents = dict[str, np.ndarray]  # dataset key (``dataset_key``) → sorted, unique document indices


def dataset_key(folder: str) -> tuple[str, str]:
    """(the key a surgery keeps ``folder``'s documents under, the resolved folder): ``fingerprint:F`` for a folder
    that opens as a dataset, else (a Hugging Face source, a missing folder) the resolved folder itself; a key given
    already is kept."""
    if folder.startswith(FINGERPRINT):
        return folder, folder
    location = storage.resolved(folder)
    try:
        return FINGERPRINT + open_dataset(location).fingerprint, location
    except (NanosetError, OSError):
        return location, location


@dataclass(frozen=True, eq=False)
class Surgery:
    """Skipped steps and excluded documents. ``exclusions``: first step → documents (a document excluded from two
    steps is listed at the first only)."""

    skip_steps: tuple[tuple[int, int], ...] = ()
    exclusions: dict[int, Documents] = field(default_factory=dict)
    names: dict[str, str] = field(default_factory=dict)  # a key of content → the folder it was named by (display)

    def __bool__(self) -> bool:
        return bool(self.skip_steps or self.exclusions)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Surgery) and self._content() == other._content()

    def shown(self, key: str) -> str:
        """How a dataset key is shown: the folder it was named by."""
        return self.names.get(key, key)

    def skips(self, step: int) -> bool:
        """Whether ``step`` is read but not trained."""
        return any(a <= step <= b for a, b in self.skip_steps)

    def skipped_in(self, first: int, last: int) -> list[int]:
        """The skipped steps of ``[first, last]``."""
        return [s for a, b in self.skip_steps for s in range(max(a, first), min(b, last) + 1)]

    def union(self, other: Surgery) -> Surgery:
        skips = _merged(list(self.skip_steps) + list(other.skip_steps))
        exclusions: dict[int, dict[str, list[np.ndarray]]] = {}
        for source in (self.exclusions, other.exclusions):
            for step, docs in source.items():
                for folder, numbers in docs.items():
                    exclusions.setdefault(step, {}).setdefault(folder, []).append(numbers)
        return Surgery(skips, _normalised({s: {f: np.concatenate(a) for f, a in d.items()}
                                           for s, d in exclusions.items()}), {**other.names, **self.names})

    def excluded_by(self, step: int) -> Documents:
        """The documents excluded from ``step`` or earlier."""
        out: dict[str, list[np.ndarray]] = {}
        for first, docs in self.exclusions.items():
            if first <= step:
                for folder, numbers in docs.items():
                    out.setdefault(folder, []).append(numbers)
        return {f: sorted_unique(np.concatenate(a)) for f, a in out.items()}

    def count(self, step: int | None = None) -> dict[str, int]:
        """Excluded documents per folder (of the exclusions from ``step``; default all)."""
        out: dict[str, int] = {}
        for first, docs in self.exclusions.items():
            if step is None or first == step:
                for folder, numbers in docs.items():
                    out[folder] = out.get(folder, 0) + len(numbers)
        return out

    def _content(self) -> dict:
        return {"skip_steps": [f"{a}:{b}" for a, b in self.skip_steps],
                "exclusions": [{"from_step": s, "documents": {f: docs[f].tolist() for f in sorted(docs)}}
                               for s, docs in sorted(self.exclusions.items())]}

    def to_json(self) -> dict:
        """``{"skip_steps": ["A:B", ...], "exclusions": [{"from_step": N, "documents": {KEY: [DOC, ...]}}]}`` and,
        with exclusions, ``"datasets": {KEY: FOLDER}``: the folder each key of content was named by (display only)."""
        out = self._content()
        keys = {k for docs in self.exclusions.values() for k in docs}
        if keys:
            out["datasets"] = {k: self.shown(k) for k in sorted(keys)}
        return out

    @staticmethod
    def from_json(d: dict | None, where: str = "surgery") -> Surgery:
        if not d:
            return Surgery()
        skips = [parse_step_range(s, f"{where}.skip_steps") for s in d.get("skip_steps", [])]
        names = dict(d.get("datasets", {}))
        exclusions = {}
        for e in d.get("exclusions", []):
            exclusions[int(e["from_step"])] = _by_folder({f: np.array(docs, dtype=np.int64)
                                                          for f, docs in e["documents"].items()}, names)
        return Surgery(_merged(skips), _normalised(exclusions), names)

    def describe(self) -> list[str]:
        """Lines for a log or ``--check``: the steps skipped, the documents excised from which step."""
        out = []
        if self.skip_steps:
            out.append("skips steps " + ", ".join(f"{a}-{b}" if a != b else f"{a}" for a, b in self.skip_steps)
                       + " (read, not trained)")
        for step in sorted(self.exclusions):
            out.append(f"excises {sum(self.count(step).values())} document(s) from step {step}")
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


def _by_folder(documents: dict[str, np.ndarray], names: dict[str, str]) -> Documents:
    """Folder → indices as dataset key → indices (two spellings or copies of one dataset merged), indices sorted
    unique; ``names`` gets the folder each new key was named by."""
    out: dict[str, list[np.ndarray]] = {}
    for folder, docs in documents.items():
        key, location = dataset_key(folder)
        names.setdefault(key, location)
        out.setdefault(key, []).append(np.asarray(docs, dtype=np.int64))
    return {f: sorted_unique(np.concatenate(a)) for f, a in out.items()}


def _normalised(exclusions: dict[int, Documents]) -> dict[int, Documents]:
    """A document excluded from two steps counts from the first; steps sorted, none empty, indices sorted unique."""
    seen: dict[str, np.ndarray] = {}
    out = {}
    for step in sorted(exclusions):
        docs = {}
        for folder in sorted(exclusions[step]):
            numbers = sorted_unique(np.asarray(exclusions[step][folder], dtype=np.int64))
            if folder in seen:
                numbers = numbers[~np.isin(numbers, seen[folder])]
                seen[folder] = sorted_unique(np.concatenate([seen[folder], numbers]))
            else:
                seen[folder] = numbers
            if len(numbers):
                docs[folder] = numbers
        if docs:
            out[step] = docs
    return out


def surgery_of(skip_steps: list[str], documents: dict[str, np.ndarray], from_step: int, where: str,
               names: dict[str, str] | None = None) -> Surgery:
    """A surgery of step ranges and documents (folder or dataset key → indices; keyed by content here) excluded
    from ``from_step``; ``names``: the folders that keys given already were named by."""
    skips = [parse_step_range(s, f"{where}.skip_steps") for s in skip_steps]
    names = dict(names or {})
    exclusions = {from_step: _by_folder(documents, names)} if documents else {}
    return Surgery(_merged(skips), _normalised(exclusions), names)


def config_surgery(config) -> Surgery:
    """The config's ``surgery:`` section as a ``Surgery`` (its documents file read here)."""
    s = config.surgery
    listed = documents_of([parse_document(t, "surgery.exclude_documents") for t in s.exclude_documents])
    from_file = (read_documents_file(s.exclude_documents_file, "surgery.exclude_documents_file")
                 if s.exclude_documents_file is not None else {})
    documents = {f: np.concatenate([listed.get(f, np.zeros(0, dtype=np.int64)),
                                    from_file.get(f, np.zeros(0, dtype=np.int64))]) for f in {*listed, *from_file}}
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
                          f"{last_step}; a skip must start after the step resumed: {_earlier(a, last_step)}")
    for step in sorted(surgery.exclusions):
        if step > last_step:
            break
        earlier = past.excluded_by(step)
        for folder, numbers in sorted(surgery.exclusions[step].items()):
            new = numbers[~np.isin(numbers, earlier.get(folder, np.zeros(0, dtype=np.int64)))]
            if len(new):
                raise ConfigError(f"{checkpoint}: surgery excludes {total.shown(folder)}:{int(new[0])} from step "
                                  f"{step}, but this checkpoint trained steps up to {last_step}; an exclusion must "
                                  f"start after the step resumed: {_earlier(step, last_step)}")
    return total


def _earlier(first: int, last_step: int) -> str:
    """How to apply a surgery from step ``first`` to a run trained up to ``last_step``: a rewind, or (from step 1,
    which no checkpoint precedes) a new run."""
    if first <= 1:
        return (f"no checkpoint comes before step 1, so start a new run with it (another general.run_dir), or make "
                f"it start after step {last_step}")
    return f"rewind to an earlier checkpoint (nanoset train --rewind-to STEP with STEP < {first})"
