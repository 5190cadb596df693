"""The rules of adaptive mixing: from a block's per-source statistics to the weights of a later block.

A rule sees only numbers every rank holds bit for bit (the step's reduced per-source sums, added up
in float64 in step order) and its own state (plain floats, recorded with every decision), so every
rank decides the same weights with no collective. Python floats throughout: IEEE arithmetic in a
fixed order, the same on every machine. The formulas are in docs/data-order.md ("Adaptive mixing").
"""

from __future__ import annotations

import math
import numbers
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from nanoset.errors import ConfigError
from runtime.config.parsers import user_rule_function

ODM_SMOOTHING = 0.9  # odm's default smoothing of the reward (loss_proportional's is 0)


@dataclass
class BlockStats:
    """One block's per-source sums over its steps: samples, label tokens and Σ token loss (float64)."""

    samples: list[int]
    label_tokens: list[int]
    loss_sum: list[float]

    @staticmethod
    def empty(num_sources: int) -> BlockStats:
        return BlockStats([0] * num_sources, [0] * num_sources, [0.0] * num_sources)

    def add(self, step_sources: Sequence[tuple[int, int, float]]) -> None:
        """Add one step's (samples, label tokens, Σ loss) per source; a source whose loss is not finite there (a
        skipped step) adds nothing, so the block's mean stays finite."""
        for i, (n, tokens, loss) in enumerate(step_sources):
            if math.isfinite(loss):
                self.samples[i] += int(n)
                self.label_tokens[i] += int(tokens)
                self.loss_sum[i] += float(loss)

    def loss(self) -> list[float | None]:
        """Each source's loss per label token in the block; None where it had no label token."""
        return [s / n if n else None for s, n in zip(self.loss_sum, self.label_tokens)]

    def to_json(self) -> dict:
        return {"samples": list(self.samples), "label_tokens": list(self.label_tokens), "loss_sum": list(self.loss_sum)}

    @staticmethod
    def from_json(d: dict) -> BlockStats:
        return BlockStats([int(x) for x in d["samples"]], [int(x) for x in d["label_tokens"]],
                          [float(x) for x in d["loss_sum"]])


@dataclass
class BlockRecord:
    """A finished block: its number (1-based in the stage), the weights it was trained with and its statistics."""

    block: int
    weights: list[float]
    stats: BlockStats


@dataclass
class MixingHistory:
    """What a rule may read: every finished block of the stage so far (the last is the one deciding) and the
    stage's options. A user rule is a pure function of it."""

    options: Any  # the stage's AdaptiveMixingArgs
    num_sources: int
    blocks: list[BlockRecord] = field(default_factory=list)


def floor_weights(weights: Sequence[float], min_weight: float) -> list[float]:
    """``w`` normalised, then ``w_i = max(w_i, m)`` renormalised until stable, as its limit: the sources below
    the floor are set to ``m`` and the others share ``1 − |S|·m`` in proportion to ``w``, growing ``S`` until no
    other falls below ``m`` (at most ``k`` rounds; needs ``k·m < 1``)."""
    w = [float(x) for x in weights]
    top = max(w)
    if top > sys.float_info.max / len(w):  # their sum would overflow: the same ratios, scaled down
        w = [x / top for x in w]
    total = math.fsum(w)
    w = [x / total for x in w]
    if min_weight <= 0.0:
        return w
    floored: set[int] = set()
    while True:
        free = [i for i in range(len(w)) if i not in floored]
        rest = math.fsum(w[i] for i in free)
        share = 1.0 - len(floored) * min_weight
        out = [min_weight if i in floored else w[i] / rest * share for i in range(len(w))]
        low = {i for i in free if out[i] < min_weight}
        if not low:
            return out
        floored |= low


def _previous_loss(history: MixingHistory, state: dict, key: str) -> list[float | None]:
    prev = state.get(key)
    return list(prev) if prev is not None else [None] * history.num_sources


def loss_proportional(history: MixingHistory, state: dict) -> tuple[list[float], dict]:
    """``ℓ_i`` the block's loss per label token (smoothed: ``s·ℓ_prev + (1 − s)·ℓ``; a source without samples keeps
    its previous ``ℓ``), ``w_i ∝ ℓ_i ** temperature``; a source never seen gets the mean of those seen."""
    o = history.options
    s = o.smoothing if o.smoothing is not None else 0.0
    prev = _previous_loss(history, state, "loss")
    now = history.blocks[-1].stats.loss()
    ell = [p if x is None else (x if p is None else s * p + (1.0 - s) * x) for p, x in zip(prev, now)]
    seen = [x for x in ell if x is not None]
    if not seen:
        return list(history.blocks[-1].weights), {"loss": ell}
    fill = math.fsum(seen) / len(seen)
    top = max(seen)  # ℓ / max ≤ 1: the same ratios, and no overflow at a high temperature
    raw = [((fill if x is None else x) / top) ** o.temperature for x in ell]
    if not math.fsum(raw) > 0.0:
        return list(history.blocks[-1].weights), {"loss": ell}
    return raw, {"loss": ell}


def odm(history: MixingHistory, state: dict) -> tuple[list[float], dict]:
    """EXP3 as Online Data Mixing uses it (Albalak et al., 2023), a block as one round: every source ``i`` drawn
    in the block gets the reward ``ℓ_i / π_i`` (its loss per label token, importance-weighted by the weight ``π_i``
    the block drew with) into ``R̂_i ← α·R̂_i + (1 − α)·ℓ_i/π_i``; then, round ``t`` (this decision's number, from
    1), ``ε_t = min(1/k, √(ln k / (k·t)))`` (or the fixed ``exploration``) and
    ``π_i = (1 − k·ε_t)·exp(ε_{t−1}·R̂_i) / Σ_j exp(ε_{t−1}·R̂_j) + ε_t`` (``ε_0 = 1/k``)."""
    o, k = history.options, history.num_sources
    alpha = o.smoothing if o.smoothing is not None else ODM_SMOOTHING
    t = int(state.get("round", 0)) + 1
    reward = [float(x) for x in state.get("reward", [0.0] * k)]
    last = history.blocks[-1]
    for i, ell in enumerate(last.stats.loss()):
        if ell is not None and last.weights[i] > 0.0:
            reward[i] = alpha * reward[i] + (1.0 - alpha) * ell / last.weights[i]

    def rate(r: int) -> float:
        if o.exploration is not None:
            return float(o.exploration)
        return 1.0 / k if r == 0 else min(1.0 / k, math.sqrt(math.log(k) / (k * r)))

    eps, before = rate(t), rate(t - 1)
    top = max(before * x for x in reward)
    exp = [math.exp(before * x - top) for x in reward]  # shifted by the largest: the same ratios, no overflow
    total = math.fsum(exp)
    weights = [(1.0 - k * eps) * e / total + eps for e in exp]
    return weights, {"round": t, "reward": reward, "epsilon": eps}


def user_rule(function: Callable[[MixingHistory], Sequence[float]]) -> Callable[[MixingHistory, dict],
                                                                                  tuple[list[float], dict]]:
    """A user's ``function(history) -> weights`` as a rule: stateless, its history is its input (``decide``
    checks what it returns)."""
    def rule(history: MixingHistory, state: dict) -> tuple[list[float], dict]:
        return function(history), {}

    return rule


RULES: dict[str, Callable[[MixingHistory, dict], tuple[list[float], dict]]] = {
    "loss_proportional": loss_proportional, "odm": odm}


def resolve_rule(name: str, key: str) -> Callable[[MixingHistory, dict], tuple[list[float], dict]]:
    """The rule ``name`` names (a built-in, or ``module:function`` importable from here), or one line saying why not."""
    if name in RULES:
        return RULES[name]
    return user_rule(user_rule_function(name, key))


def decide(rule: Callable[[MixingHistory, dict], tuple[list[float], dict]], history: MixingHistory, state: dict,
           where: str) -> tuple[list[float], dict]:
    """The rule's weights, checked (one finite weight ≥ 0 per source, not all zero), then floored at
    ``min_weight`` and normalised; its new state. A user's rule that raises is one ``ConfigError`` naming it."""
    name = history.options.rule
    try:
        returned, new_state = rule(history, state)
    except Exception as e:
        if name in RULES:  # a built-in rule's failure is the runtime's bug: its traceback is wanted
            raise
        raise ConfigError(f"{where}: the rule {name!r} raised {type(e).__name__}: {' '.join(str(e).split())[:200]}; "
                          f"fix the function (it decides from its history alone)") from None
    k = history.num_sources
    numbers_given = isinstance(returned, (list, tuple)) or (hasattr(returned, "tolist") and getattr(returned, "ndim",
                                                                                                    0) == 1)
    weights = [float(w) for w in returned] if numbers_given and all(
        isinstance(w, numbers.Real) and not isinstance(w, bool) for w in returned) else None
    if (weights is None or len(weights) != k or any(not (math.isfinite(w) and w >= 0.0) for w in weights)
            or not any(w > 0.0 for w in weights)):
        got = " ".join(repr(returned).split())[:200]
        raise ConfigError(f"{where}: the rule {name!r} returned {got}; a rule must return a list of "
                          f"{k} finite weights ≥ 0, not all zero")
    return floor_weights(weights, history.options.min_weight), new_state
