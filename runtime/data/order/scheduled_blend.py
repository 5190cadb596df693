"""Blending by a weight schedule: weights given at global steps, linear in between, constant after the last.

The weights of step ``t`` are the schedule's linear interpolation at ``t``, normalised after
interpolating. Step ``t`` draws ``G`` samples (the part's global batch), and dataset ``d``'s
cumulative target after step ``s`` is ``T_d(s) = Σ_{t ≤ s} G(t) · w_d(t)``. Each step hands its
``G`` samples out one at a time, always to the dataset furthest below its target at the end of
the step among those whose share there is not 0 (water-filling; ties to the lower dataset index).
No step's count is negative, and while every share is positive, with ``e_d = T_d − C_d`` (target
minus samples drawn) every set ``S`` of ``m`` of the ``k`` datasets keeps
``Σ_S e ≤ m·(H_k − H_m)`` at every step boundary (``H`` the harmonic numbers; induction over the
steps: if ``S`` got at least its target this step, its sum did not grow; otherwise a dataset ``j``
outside ``S`` got a sample, its last one going to the largest remaining deficit, so every ``e`` of
``S`` is at most ``e_j + 1``, and the bound for ``S ∪ {those j}`` gives the bound for ``S``). Hence

    −(1 − 1/k) ≤ T_d(s) − C_d(s) ≤ H_k − 1:   within 1/2 for two datasets, 5/6 for three,
                                               H_k − 1 for more (1.08 for four, 1.93 for ten).

A dataset whose share at a step is 0 bids nothing there, however far behind it is: a weight of 0
means no draw, and its deviation waits unchanged until its weight is positive again. The induction
above needs every dataset of ``S`` among the bidders; with waiting ones (``S_z``, ``m_z`` of them, the
bidders of ``S`` being ``S_a``, ``m_a`` of them) it still bounds ``S_a`` by ``e_j + 1`` and ``S_z`` by the
step before, which gives ``Σ_S e ≤ m·(k − m)/2`` (the bound for ``S ∪ {j}`` and ``Σ_{S_z} e ≤ m_z(k − m_z)/2``
give ``(m_z(k − m_z)/2 + m_a((m + 1)(k − m − 1)/2 + 1)) / (m_a + 1) ≤ m(k − m)/2``), hence, once a share has
been 0 in the stage,

    |T_d(s) − C_d(s)| ≤ (k − 1)/2:   1/2 for two datasets (as before), 1 for three, 3/2 for four.

It is the supremum: moving the weight between two datasets at a time (the others at 0), one sample a
step, approaches it; weight 0 on a dataset that is behind forces the draws onto the others.

The rule is causal (step ``s`` depends on the weights and batch sizes up to ``s`` only), so a
resume that changes only the schedule's future, or the global batch, keeps every step trained so
far. No causal rule can promise 1 for ``k ≥ 4``: with one sample a step and equal weight on the
datasets not yet served, one of four ends 1/4 + 1/3 + 1/2 = 1.08 behind (and this rule reaches
``H_k − 1`` so). Inside a step the datasets are interleaved:
dataset ``d``'s ``m``-th sample of the step sits at ``(m + ½) / n_d`` of the step (ties to the lower
index), so a sample's position and its (dataset, draw) map both ways in O(k).

The per-step counts are computed once per part (for two datasets the rounding of one cumulative
sum, under a second per million steps; for more a sequential pass, seconds per million steps) and,
for long parts, cached (``nanoset.cache``, under ``general.cache_dir/blend/``).
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from nanoset.cache import DerivedCache

CACHE_VERSION = 2  # 2: a share of 0 draws nothing (tables of schedules with zeros from 1 are wrong)
CACHE_MIN_STEPS = 4096  # shorter parts are computed in milliseconds: no file
ALLOCATION_BLOCK = 1 << 16  # steps whose shares and counts are computed at once (the rest of the part waits)
MAX_GLOBAL_BATCH = 1 << 24  # in-step positions compare (2m + 1) / 2n as float64 exactly below this


def deviation_bound(num_datasets: int, zero_shares: bool = False) -> float:
    """The largest ``|T_d(s) − C_d(s)|`` the rule allows for ``num_datasets`` datasets: 1/2, 5/6, H_k − 1 while
    every share has been positive, ``(k − 1)/2`` once one has been 0 (``zero_shares``)."""
    k = num_datasets
    if zero_shares:
        return (k - 1) / 2
    return max(sum(1.0 / i for i in range(2, k + 1)), 1.0 - 1.0 / k) if k > 1 else 0.0


@dataclass(frozen=True)
class WeightSchedule:
    """Raw weights at global steps (as the config gives them): ``steps`` increasing, one row per step."""

    steps: tuple[int, ...]
    weights: tuple[tuple[float, ...], ...]

    @staticmethod
    def from_entries(entries: list) -> WeightSchedule:
        """From ``[{step, weights}]`` (the config's or the record's form) or objects with those attributes."""
        def get(e, key):
            return e[key] if isinstance(e, dict) else getattr(e, key)

        return WeightSchedule(tuple(int(get(e, "step")) for e in entries),
                              tuple(tuple(float(w) for w in get(e, "weights")) for e in entries))

    def to_json(self) -> list[dict]:
        return [{"step": s, "weights": list(w)} for s, w in zip(self.steps, self.weights)]

    @property
    def num_datasets(self) -> int:
        return len(self.weights[0])

    def describe(self) -> str:
        return " → ".join(f"step {s} [{', '.join(f'{x:g}' for x in w)}]" for s, w in zip(self.steps, self.weights))

    def shares(self, steps: np.ndarray) -> np.ndarray:
        """``[len(steps), k]`` float64: the normalised weights of each global step.

        Element-wise numpy operations only (no fused or reordered sums), so every platform computes the
        same bits: the data order must not depend on the machine a run resumes on."""
        t = np.asarray(steps, dtype=np.int64).reshape(-1)
        at = np.asarray(self.steps, dtype=np.int64)
        w = np.asarray(self.weights, dtype=np.float64)
        seg = np.clip(np.searchsorted(at, t, side="right") - 1, 0, len(at) - 1)
        nxt = np.minimum(seg + 1, len(at) - 1)
        span = (at[nxt] - at[seg]).astype(np.float64)
        frac = np.where(span > 0, (t - at[seg]) / np.where(span > 0, span, 1.0), 0.0)
        frac = np.clip(frac, 0.0, 1.0)[:, None]
        raw = w[seg] + (w[nxt] - w[seg]) * frac
        total = raw[:, 0].copy()
        for col in range(1, raw.shape[1]):
            total += raw[:, col]
        return raw / total[:, None]

    def same_past(self, other: WeightSchedule, resume_step: int) -> bool:
        """Whether ``other`` gives every step before ``resume_step`` and the segment ``resume_step`` lies in the
        same weights: the entries up to and including the first one after ``resume_step`` are equal."""
        idx = int(np.searchsorted(np.asarray(self.steps), resume_step, side="right"))
        return self._entries()[: idx + 1] == other._entries()[: idx + 1]

    def _entries(self) -> list[tuple[int, tuple[float, ...]]]:
        return list(zip(self.steps, self.weights))


def allocate(shares: np.ndarray, global_batch: int, deviation: np.ndarray,
             running: object = None) -> tuple[np.ndarray, np.ndarray, object]:
    """The per-step counts of the rule: ``[n, k]`` int64 for ``n`` steps of ``shares``, the deviation ``T − C``
    after the last step (start: ``deviation``), and what a next block of the same part continues from
    (``running``: None at the part's start), so a long part is computed block by block to the same bits.

    Each step takes the ``G`` largest "bids" ``x_d − j`` (``x = e + G·w``, ``j = 0, 1, …``; ties to the lower
    index): all bids ≥ 1 first, then single bids added or removed until ``G`` are taken. Plain Python
    floats, one step after the other: IEEE arithmetic, the same on every machine. For two datasets the
    rule is the rounding of the first one's cumulative target, ``C_0(s) = ⌊T_0(s) + ½⌋``: one cumulative
    sum (sequential, so as reproducible), no loop. The two float evaluations agree except where a target
    lies within rounding of a tie (``T_0`` about ``m + ½``): there the float sums decide, not the tie order,
    and the two-dataset order is the cumulative sum's."""
    if shares.shape[1] == 2:
        return _round_two(shares, global_batch, deviation, running)
    counts, after = _water_fill(shares, global_batch, deviation if running is None else running)
    return counts, after, after


def _round_two(shares: np.ndarray, global_batch: int, deviation: np.ndarray,
               running: tuple[float, int, int] | None = None) -> tuple[np.ndarray, np.ndarray, tuple[float, int, int]]:
    """The rule for two datasets: the bids' tie order makes it ``C_0(s) = ⌊T_0(s) + ½⌋`` (``T_0`` the float64
    cumulative sum, so a target within its rounding of ``m + ½`` goes the way that sum rounds). ``running``:
    the earlier blocks' last ``T_0``, last ``⌊T_0 + ½⌋`` and samples of dataset 0 (the sum goes on from them)."""
    n, g = shares.shape[0], int(global_batch)
    total, rounded, drawn = running if running is not None else (float(deviation[0]), 0, 0)
    if not n:
        last = float(np.float64(total) - drawn) if running is not None else float(deviation[0])
        return np.zeros((0, 2), dtype=np.int64), np.array([last, -last], dtype=np.float64), (total, rounded, drawn)
    target = np.cumsum(np.concatenate([[total], shares[:, 0] * float(g)]))[1:]
    first = np.floor(target + 0.5).astype(np.int64)
    per_step = np.clip(np.diff(first, prepend=rounded), 0, g)  # never below 0 or above G (a guard against rounding)
    drawn += int(per_step.sum())
    last = float(target[-1] - drawn)
    counts = np.stack([per_step, g - per_step], axis=1).astype(np.int64)
    return counts, np.array([last, -last], dtype=np.float64), (float(target[-1]), int(first[-1]), drawn)


HEAP_DATASETS = 12  # from this many datasets a step's picks come from a heap (O(k log k)) instead of scans (O(k²))


def _water_fill(shares: np.ndarray, global_batch: int, deviation: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The rule step by step: the ``G`` largest bids of each step, among the datasets whose share is not 0 (a
    dataset at weight 0 bids nothing, whatever it is behind, so its deviation waits unchanged)."""
    n, k = shares.shape
    g = int(global_batch)
    targets = (shares * float(g)).tolist()
    every = (shares > 0.0).all(axis=1).tolist()
    everyone = list(range(k))
    e = [float(v) for v in deviation]
    rows: list[list[int]] = [[]] * n
    settle = _settle_by_heap if k >= HEAP_DATASETS else _settle_by_scan
    for t in range(n):
        x = [a + b for a, b in zip(e, targets[t])]
        a = [int(v) if v >= 1.0 else 0 for v in x]  # the bids ≥ 1 of each dataset: floor(x)
        live = everyone
        if not every[t]:
            live = [d for d, w in enumerate(targets[t]) if w > 0.0]
            a = [v if w > 0.0 else 0 for v, w in zip(a, targets[t])]
        total = sum(a)
        if total != g:
            settle(x, a, total, g, live)
        e = [p - q for p, q in zip(x, a)]
        rows[t] = a
    counts = np.array(rows, dtype=np.int64).reshape(n, k)
    return counts, np.array(e, dtype=np.float64)


def _settle_by_scan(x: list[float], a: list[int], total: int, g: int, live: list[int] | None = None) -> None:
    """Bids of the ``live`` datasets (default: all) added (the highest ``x_d − a_d`` first, ties to the lower
    index) or given back (the lowest taken, ``x_d − a_d + 1``; ties: the higher index gives it back) until ``a``
    sums to ``g``; a scan per bid."""
    live = range(len(x)) if live is None else live
    while total < g:
        best = live[0]
        value = x[best] - a[best]
        for i in live:
            v = x[i] - a[i]
            if v > value:
                best, value = i, v
        a[best] += 1
        total += 1
    while total > g:
        worst, value = -1, 0.0
        for i in live:
            if a[i]:
                v = x[i] - a[i]
                if worst < 0 or v <= value:
                    worst, value = i, v
        a[worst] -= 1
        total -= 1


def _settle_by_heap(x: list[float], a: list[int], total: int, g: int, live: list[int] | None = None) -> None:
    """``_settle_by_scan``'s picks, in its order and with its ties, from a heap of the bids: the same values
    (``x_d − a_d`` computed afresh after each pick), ordered by (value, index) as the scans compare them."""
    live = range(len(x)) if live is None else live
    if total < g:
        heap = [(-(x[i] - a[i]), i) for i in live]  # -(x_i - a_i): the highest bid first, then the lower index
        heapq.heapify(heap)
        while total < g:
            i = heapq.heappop(heap)[1]
            a[i] += 1
            total += 1
            heapq.heappush(heap, (-(x[i] - a[i]), i))
        return
    heap = [(x[i] - a[i], -i) for i in live if a[i]]  # the lowest bid taken first, then the higher index
    heapq.heapify(heap)
    while total > g:
        i = -heapq.heappop(heap)[1]
        a[i] -= 1
        total -= 1
        if a[i]:
            heapq.heappush(heap, (x[i] - a[i], -i))


def step_orders(counts: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """In-step interleave of steps with ``counts`` ``[u, k]`` (each row sums to ``G``): ``(dataset, m)`` of
    every position, ``[u, G]`` each; dataset ``d``'s ``m``-th sample sits at ``(2m + 1) / 2n_d``."""
    counts = np.asarray(counts, dtype=np.int64)
    u, k = counts.shape
    g = int(counts[0].sum()) if u else 0
    flat = counts.reshape(-1)
    dataset = np.repeat(np.tile(np.arange(k, dtype=np.int64), u), flat)
    row = np.repeat(np.arange(u, dtype=np.int64), g)
    starts = np.repeat(np.cumsum(flat) - flat, flat)
    m = np.arange(u * g, dtype=np.int64) - starts
    key = (2 * m + 1) / (2.0 * np.repeat(flat, flat))
    order = np.lexsort((dataset, key, row))
    return dataset[order].reshape(u, g), m[order].reshape(u, g)


def positions_in_step(counts: np.ndarray, dataset: np.ndarray, m: np.ndarray) -> np.ndarray:
    """The in-step position of dataset ``d``'s ``m``-th sample (the inverse of ``step_orders``) with exact
    integer counting: samples ``(d', m')`` with ``(2m' + 1)·n_d < (2m + 1)·n_d'``, plus ties of lower index."""
    counts = np.asarray(counts, dtype=np.int64)  # [h, k]: the counts of each hit's step
    dataset = np.asarray(dataset, dtype=np.int64)
    n_d = counts[np.arange(len(dataset)), dataset][:, None]  # [h, 1]
    a = (2 * np.asarray(m, dtype=np.int64) + 1)[:, None] * counts  # [h, k]
    ceil = -(-a // n_d)
    before = np.minimum(counts, ceil // 2)
    lower = np.arange(counts.shape[1])[None, :] < dataset[:, None]
    tie = lower & (a % n_d == 0) & ((a // n_d) % 2 == 1) & (counts > 0)
    return (before + tie).sum(axis=1)


class ScheduledBlend:
    """Maps part sample ``j`` to (dataset index, draw number within the part), and back, for one part.

    ``start_step`` is the part's first global step, ``num_steps`` its length, ``global_batch`` its
    ``G``; ``deviation`` the ``T − C`` the stage had before the part (zeros for a stage's first part)."""

    kind = "scheduled"
    options = None

    def __init__(self, schedule: WeightSchedule, start_step: int, num_steps: int, global_batch: int,
                 deviation: np.ndarray | None = None, cache_dir: str | Path | None = None) -> None:
        if not 0 < global_batch < MAX_GLOBAL_BATCH:
            raise ValueError(f"a scheduled blend needs a global batch in [1, {MAX_GLOBAL_BATCH}), got {global_batch}")
        self.schedule = schedule
        self.start_step = start_step
        self.num_steps = num_steps
        self.global_batch = global_batch
        k = schedule.num_datasets
        self.initial_deviation = np.zeros(k) if deviation is None else np.asarray(deviation, dtype=np.float64)
        cumulative, self.deviation = _cached_allocation(self, cache_dir)
        self.cumulative = cumulative  # [num_steps + 1, k]: draws of each dataset after each step of the part
        self.weights = schedule.shares(np.array([start_step]))[0].tolist()

    @property
    def num_datasets(self) -> int:
        return self.schedule.num_datasets

    def weights_at(self, step: int) -> list[float]:
        return self.schedule.shares(np.array([step]))[0].tolist()

    def weights_shown(self) -> list[str]:
        """The weights at the part's first and last steps (``0.9 → 0.2 by schedule``)."""
        first, last = self.schedule.shares(np.array([self.start_step, self.start_step + self.num_steps - 1]))
        return [f"{a:g} by schedule" if f"{a:g}" == f"{b:g}" else f"{a:g} → {b:g} by schedule"
                for a, b in zip(first, last)]

    def decided_samples(self, num_samples: int) -> int:
        return num_samples

    def record(self, last_step: int) -> dict:
        return {"weights": None, "blend": self.kind, "schedule": self.schedule.to_json(), "adaptive": None,
                "decisions": None}

    def step_counts(self, t: np.ndarray | int) -> np.ndarray:
        """Samples each dataset gets in part step ``t`` (0-based): ``[*shape, k]``."""
        t = np.asarray(t, dtype=np.int64)
        return self.cumulative[t + 1] - self.cumulative[t]

    def _check(self, j: np.ndarray) -> None:
        if j.size and (int(j.min()) < 0 or int(j.max()) >= self.num_steps * self.global_batch):
            bad = int(j.min()) if int(j.min()) < 0 else int(j.max())
            raise IndexError(f"blended sample {bad} outside [0, {self.num_steps * self.global_batch}) of the part")

    def locate(self, j: np.ndarray | int) -> tuple[np.ndarray, np.ndarray]:
        """(dataset index, draw number within the part) of part samples ``j`` (scalar or array)."""
        j = np.asarray(j, dtype=np.int64)
        shape = j.shape
        j = j.reshape(-1)
        self._check(j)
        t, p = np.divmod(j, self.global_batch)
        steps, row = np.unique(t, return_inverse=True)
        order_d, order_m = step_orders(self.step_counts(steps))
        d = order_d[row, p]
        draw = self.cumulative[t, d] + order_m[row, p]
        return d.reshape(shape), draw.reshape(shape)

    def draws(self, num_samples: int) -> np.ndarray:
        """How many samples of each dataset the part's first ``num_samples`` samples take."""
        q, r = divmod(int(num_samples), self.global_batch)
        out = self.cumulative[q].copy()
        if r:
            order_d, _ = step_orders(self.step_counts(np.array([q])))
            out += np.bincount(order_d[0, :r], minlength=self.num_datasets)
        return out

    def position(self, dataset: np.ndarray, draw: np.ndarray) -> np.ndarray:
        """Part sample ``j`` of draw ``draw`` of dataset ``dataset`` (arrays; each draw in the part's range)."""
        dataset = np.asarray(dataset, dtype=np.int64).reshape(-1)
        draw = np.asarray(draw, dtype=np.int64).reshape(-1)
        t = np.empty(len(draw), dtype=np.int64)
        for d in np.unique(dataset).tolist():
            sel = dataset == d
            t[sel] = np.searchsorted(self.cumulative[:, d], draw[sel], side="right") - 1
        if len(t) and (t.min() < 0 or t.max() >= self.num_steps):
            raise IndexError("a draw outside the part")
        m = draw - self.cumulative[t, dataset]
        return t * self.global_batch + positions_in_step(self.step_counts(t), dataset, m)


def _cached_allocation(blend: ScheduledBlend, cache_dir: str | Path | None) -> tuple[np.ndarray, np.ndarray]:
    """The part's cumulative counts ``[n + 1, k]`` and final deviation: for long parts from the cache
    ``cache_dir/blend/`` (None: computed, not cached). Cached: int64 ``[n + 2, k]``, row 0 the deviation's bits."""
    n, k = blend.num_steps, blend.num_datasets
    if cache_dir is not None and n >= CACHE_MIN_STEPS:
        key = [CACHE_VERSION, blend.schedule.to_json(), blend.start_step, n, blend.global_batch,
               [float(x).hex() for x in blend.initial_deviation]]
        table = DerivedCache("blend", cache_dir).array(key, lambda: _allocation_table(blend),
                                                       lambda t: t.shape == (n + 2, k) and t.dtype == np.int64)
    else:
        table = _allocation_table(blend)
    return table[1:], np.array(table[0]).view(np.float64)


def _allocation_table(blend: ScheduledBlend) -> np.ndarray:
    """The part's counts as the cache keeps them: int64 ``[n + 2, k]``, row 0 the final deviation's bits, then
    the cumulative counts after each of the part's steps (row 1: zeros, before the first)."""
    n, k = blend.num_steps, blend.num_datasets
    table = np.zeros((n + 2, k), dtype=np.int64)
    deviation, running = blend.initial_deviation, None
    for lo in range(0, n, ALLOCATION_BLOCK) if n else [0]:  # block by block: memory O(block · k) beyond the table
        hi = min(n, lo + ALLOCATION_BLOCK)
        steps = np.arange(blend.start_step + lo, blend.start_step + hi, dtype=np.int64)
        counts, deviation, running = allocate(blend.schedule.shares(steps), blend.global_batch,
                                              blend.initial_deviation, running)
        np.cumsum(counts, axis=0, out=table[2 + lo : 2 + hi])
        table[2 + lo : 2 + hi] += table[1 + lo]
    table[0] = deviation.view(np.int64)
    return table

