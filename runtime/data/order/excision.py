"""A dataset's draws with excised samples passed over: draw number → epoch position, and back, in O(log E).

Without surgery, draw ``k`` of a dataset of ``n`` samples is position ``k`` of its position stream:
epoch ``k // n``, position ``k % n`` of that epoch's permutation. An exclusion that takes effect at
draw ``k0`` (the dataset's draws before the exclusion's first step) adds samples ``X`` to the
passed-over set from there on: the stream is walked as before, and every position whose permuted
sample is in ``X`` is passed over (skip forward). So nothing repeats within an epoch, a draw before
``k0`` is unchanged, and the positions passed over still count (the next stage that shares the
dataset starts after them).

Per epoch ``e`` the passed-over positions are ``E_e = sort(perm_e⁻¹(X))`` (``|X|`` inverse permutations
and a sort, once per epoch, cached). The ``t``-th kept position of an epoch is ``t + #{i : E_i - i ≤ t}``
(a binary search), and a position's rank among the kept ones is ``q - #{E_i < q}`` (another one).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from nanoset.errors import ConfigError
from runtime.data.order.permutation import FeistelPermutation
from runtime.data.order.sample_space import SampleSpace


@dataclass
class _Segment:
    """Draws from ``first_draw`` on, at positions from ``first_position`` on, passing over ``excluded``."""

    first_draw: int
    first_position: int
    excluded: np.ndarray  # sorted sample ids
    rank_base: int = 0  # kept positions (under ``excluded``) before first_position


class DrawIndex:
    """Draw numbers ↔ positions of one dataset's stream, passing over excised samples from given draws on.

    ``exclusions``: (first draw, sample ids) pairs, the first draws ascending; a later pair adds to the earlier
    ones' samples. ``permutation(epoch)`` is the dataset's permutation of that epoch (the plan's, cached there)."""

    def __init__(self, num_samples: int, permutation: Callable[[int], FeistelPermutation],
                 exclusions: list[tuple[int, np.ndarray]]) -> None:
        self.n = num_samples
        self._permutation = permutation
        self._passed: dict[tuple[int, int], tuple[np.ndarray, np.ndarray]] = {}  # (segment, epoch) → (E, E - i)
        self.segments: list[_Segment] = []
        excluded = np.zeros(0, dtype=np.int64)
        for first_draw, samples in exclusions:
            excluded = sorted_unique(np.concatenate([excluded, np.asarray(samples, dtype=np.int64)]))
            if len(excluded) >= num_samples:
                raise ValueError("every sample is excluded")
            if self.segments:
                prev = self.segments[-1]
                taken = first_draw - prev.first_draw
                position = int(self._select(len(self.segments) - 1, np.array([prev.rank_base + taken - 1]))[0]) + 1 \
                    if taken > 0 else prev.first_position
            else:
                position = first_draw
            segment = _Segment(first_draw, position, excluded)
            self.segments.append(segment)
            segment.rank_base = int(self._rank(len(self.segments) - 1, np.array([position]))[0])

    @property
    def excised(self) -> bool:
        return bool(self.segments)

    def excluded_samples(self) -> np.ndarray:
        """Every sample passed over by the latest exclusion (sorted)."""
        return self.segments[-1].excluded if self.segments else np.zeros(0, dtype=np.int64)

    # ------------------------------------------------------------------ per epoch ----------------

    def _epoch(self, g: int, epoch: int) -> tuple[np.ndarray, np.ndarray]:
        """The sorted positions in ``epoch`` of segment ``g``'s excluded samples, and ``E_i - i``."""
        key = (g, epoch)
        if key not in self._passed:
            if len(self._passed) > 16:  # a long run walks its epochs in order: keep memory bounded
                self._passed.clear()
            excluded = self.segments[g].excluded
            passed = np.sort(self._permutation(epoch).inverse(excluded)) if len(excluded) else excluded
            self._passed[key] = (passed, passed - np.arange(len(passed), dtype=np.int64))
        return self._passed[key]

    def _rank(self, g: int, positions: np.ndarray) -> np.ndarray:
        """Kept positions (under segment ``g``) before each stream position."""
        kept = self.n - len(self.segments[g].excluded)
        epoch, pos = np.divmod(positions, self.n)
        out = epoch * kept
        for e in np.unique(epoch).tolist():
            m = epoch == e
            out[m] += pos[m] - np.searchsorted(self._epoch(g, e)[0], pos[m], side="left")
        return out

    def _select(self, g: int, ranks: np.ndarray) -> np.ndarray:
        """The stream position of each kept rank (under segment ``g``)."""
        kept = self.n - len(self.segments[g].excluded)
        epoch, t = np.divmod(ranks, kept)
        out = epoch * self.n + t
        for e in np.unique(epoch).tolist():
            m = epoch == e
            out[m] += np.searchsorted(self._epoch(g, e)[1], t[m], side="right")
        return out

    # ------------------------------------------------------------------ lookups -----------------

    def positions(self, draws: np.ndarray) -> np.ndarray:
        """The stream position of each draw number (int64 array in, same shape out)."""
        draws = np.asarray(draws, dtype=np.int64)
        if not self.segments:
            return draws
        out = draws.copy()
        starts = np.array([s.first_draw for s in self.segments], dtype=np.int64)
        which = np.searchsorted(starts, draws, side="right") - 1
        for g in np.unique(which[which >= 0]).tolist():
            m = which == g
            s = self.segments[g]
            out[m] = self._select(g, s.rank_base + draws[m] - s.first_draw)
        return out

    def stream_position(self, draws: int) -> int:
        """The position in the stream after the first ``draws`` draws (passed-over samples counted)."""
        if draws <= 0 or not self.excised:
            return max(draws, 0)
        return int(self.positions(np.array([draws - 1]))[0]) + 1

    def draws(self, positions: np.ndarray, samples: np.ndarray) -> np.ndarray:
        """The draw number of each stream position (whose sample is ``samples``), -1 where it is passed over."""
        positions = np.asarray(positions, dtype=np.int64)
        if not self.segments:
            return positions.copy()
        out = positions.copy()
        starts = np.array([s.first_position for s in self.segments], dtype=np.int64)
        which = np.searchsorted(starts, positions, side="right") - 1
        for g in np.unique(which[which >= 0]).tolist():
            m = which == g
            s = self.segments[g]
            passed = np.isin(samples[m], s.excluded)
            out[m] = np.where(passed, -1, s.first_draw + self._rank(g, positions[m]) - s.rank_base)
        return out


def draw_indexes(exclusions: dict[int, dict[str, np.ndarray]], datasets: list[SampleSpace],
                 named: Callable[[str, str, str], list[int]], shown: Callable[[str], str],
                 draws_before: Callable[[int], dict[int, int]],
                 permutation: Callable[[int, int], FeistelPermutation],
                 known: Callable[[int], bool] = lambda step: True) -> list[DrawIndex]:
    """Each dataset's draw index under a surgery's ``exclusions`` (first step → dataset key → documents): from
    each one's first step on, the dataset's draws pass over the samples that hold a token of an excluded document
    (a dataset without exclusions keeps its plain stream). ``named(key, where, shown)``: the datasets a key names;
    ``shown(key)``: its folder; ``draws_before(step)``: each dataset's draws by the steps before ``step``;
    ``permutation(dataset, epoch)``: the plan's permutations; ``known(step)``: whether the draws before ``step``
    are known (an exclusion from a step whose are not is checked, and left out until they are)."""
    by_dataset: dict[int, dict[int, np.ndarray]] = {}  # dataset → first step → documents
    for step, docs in sorted(exclusions.items()):
        for folder, numbers in sorted(docs.items()):
            for d in named(folder, "surgery", shown(folder)):
                n = datasets[d].reader.num_documents
                bad = numbers[(numbers < 0) | (numbers >= n)]
                if len(bad):
                    raise ConfigError(f"surgery: {shown(folder)}:{int(bad.min())}: {shown(folder)} has {n} documents; "
                                      f"give an index in [0, {n})")
                if not known(step):
                    continue
                of_step = by_dataset.setdefault(d, {})
                of_step[step] = np.concatenate([of_step.get(step, np.zeros(0, dtype=np.int64)), numbers])
    indexes = []
    for d, w in enumerate(datasets):
        starts = [(draws_before(step).get(d, 0), excised_samples(w, docs))
                  for step, docs in sorted(by_dataset.get(d, {}).items())]
        try:
            indexes.append(DrawIndex(w.num_samples, functools.partial(permutation, d), starts))
        except ValueError:
            raise ConfigError(f"surgery: every sample of {w.folder} (sequence length {w.sequence_length}) holds a "
                              f"token of an excluded document, so nothing of it is left to train on; exclude "
                              f"fewer of its documents or remove it from the stages") from None
    return indexes


def excised_samples(windows: SampleSpace, documents: np.ndarray) -> np.ndarray:
    """The samples of ``windows`` (windows or packed samples) holding any token of ``documents`` (sorted, unique):
    one vectorised pass, so 100,000 documents cost milliseconds."""
    documents = sorted_unique(np.asarray(documents, dtype=np.int64))
    if not len(documents):
        return documents
    ends = windows.reader.document_ends
    stops = ends[documents]
    starts = np.where(documents > 0, ends[np.maximum(documents - 1, 0)], 0)
    keep = stops > starts
    starts, stops = starts[keep], stops[keep]
    if windows.packing == "window":
        L = windows.sequence_length
        first = np.maximum(0, (starts - L - 1) // L + 1)  # i·L + L + 1 > start
        last = np.minimum(windows.num_samples - 1, (stops - 1) // L)  # i·L < stop
    else:
        first = np.searchsorted(windows.stops, starts, side="right")  # stops[i] > start
        last = np.searchsorted(windows.starts, stops, side="left") - 1  # starts[i] < stop
    counts = np.maximum(last - first + 1, 0)
    if not counts.sum():
        return np.zeros(0, dtype=np.int64)
    offsets = np.repeat(np.cumsum(counts) - counts, counts)
    samples = np.repeat(first, counts) + np.arange(int(counts.sum()), dtype=np.int64) - offsets
    return sorted_unique(samples)


def sorted_unique(values: np.ndarray) -> np.ndarray:
    """``np.unique`` of int64 values by a sort (numpy's hash-based unique is several times slower on 10⁵ ids)."""
    values = np.sort(values)
    if len(values) < 2:
        return values
    return values[np.concatenate(([True], values[1:] != values[:-1]))]
