"""The decisions of an adaptive stage during a run: per-step statistics summed into blocks, a decision at each
block's last step, the state a checkpoint keeps.

Every rank runs one ``StageMixer`` per adaptive stage on the same numbers (the step's per-source sums, already
reduced and read back on every rank), so every rank decides the same weights and adds them to its own plan: no
collective, no clock, nothing rank-local. Global rank 0 also appends each decision to ``mixing.jsonl``.
"""

from __future__ import annotations

from collections.abc import Sequence

from runtime.config.schema import AdaptiveMixingArgs
from runtime.data.order.mixing_rules import BlockRecord, BlockStats, MixingHistory, decide, resolve_rule
from runtime.data.order.plan import DataPlan, StagePlan


class StageMixer:
    """The block statistics, rule state and history of one adaptive stage part."""

    def __init__(self, plan: DataPlan, stage: StagePlan, saved: dict | None = None) -> None:
        assert stage.adaptive is not None, "a mixer of a stage whose weights are not adaptive"
        self.plan, self.stage, self.blend = plan, stage, stage.blend
        self.options = AdaptiveMixingArgs(**stage.adaptive)
        self.where = f"stage {stage.name!r} dataset_weights.adaptive.rule"
        self.rule = resolve_rule(self.options.rule, self.where)
        k = len(stage.dataset_ids)
        self.history = MixingHistory(self.options, k)
        self.state: dict = {}
        self.current = BlockStats.empty(k)
        if saved is not None:
            self.state = saved["state"]
            self.current = BlockStats.from_json(saved["current"])
            self.history.blocks = [BlockRecord(b["block"], b["weights"], BlockStats.from_json(b["stats"]))
                                   for b in saved["blocks"]]

    def observe(self, step: int, sources: Sequence[tuple[int, int, float]] | None) -> dict | None:
        """Add ``step``'s per-source sums (None: the batches carried no sources); at a block's last step, decide the
        block two later and return its log row (None otherwise, or when no block is left to decide)."""
        if sources is not None:
            self.current.add(sources)
        blend = self.blend
        b = blend.block_of(step)
        if step != blend.block_steps(b)[1]:
            return None
        self.history.blocks.append(BlockRecord(b, list(blend.block_weights[b - 1]), self.current))
        stats, self.current = self.current, BlockStats.empty(self.history.num_sources)
        if b + 2 > blend.num_blocks:
            return None
        assert len(blend.block_weights) == b + 1, "decisions out of order"
        weights, self.state = decide(self.rule, self.history, self.state, f"{self.where} at step {step}")
        self.plan.decide(self.stage, weights)
        first, last = blend.block_steps(b + 2)
        return {"stage": self.stage.name, "step": step, "block": b, "decides_block": b + 2, "steps": [first, last],
                "rule": self.options.rule, "datasets": [self.plan.datasets[d].folder for d in self.stage.dataset_ids],
                "inputs": {**stats.to_json(), "loss": stats.loss()}, "used": list(blend.block_weights[b - 1]),
                "weights": weights, "state": self.state}

    def weights_at(self, step: int) -> list[float]:
        """The weights the blend draws with at ``step``."""
        return list(self.blend.block_weights[self.blend.block_of(step) - 1])

    def saved(self) -> dict:
        """What a checkpoint keeps: the rule's state, the block in progress and the finished blocks (a user rule's
        input); the decisions themselves are in the data record."""
        return {"state": self.state, "current": self.current.to_json(),
                "blocks": [{"block": r.block, "weights": r.weights, "stats": r.stats.to_json()}
                           for r in self.history.blocks]}
