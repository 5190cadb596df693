"""Per-sample loss: each sample's summed token loss and label tokens, a by-product of the step; they add up to the
step's loss and are the same in every layout (dp, tp, pp, cp)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from runtime.sample_losses import IGNORE_INDEX, SampleLosses, global_rows, row_sums, scatter
from tests.support.engine_workers import GLOBAL_BATCH, global_batch
from tests.support.harness import run_distributed
from tests.support.sample_loss_workers import STEPS, train_and_dump_samples


def test_global_rows_follow_the_samplers_rule():
    # dp 2, micro-batches of 2 rows, 3 micro-batches: rank 1 holds [2, 3], [6, 7], [10, 11]
    assert global_rows(3, 2, 1, 2).tolist() == [2, 3, 6, 7, 10, 11]
    assert global_rows(2, 3, 0, 1).tolist() == [0, 1, 2, 3, 4, 5]


def test_row_sums_and_scatter_count_only_label_tokens():
    targets = torch.tensor([[5, IGNORE_INDEX, 7], [IGNORE_INDEX, IGNORE_INDEX, IGNORE_INDEX]])
    token_losses = torch.tensor([1.5, 0.0, 2.25, 0.0, 0.0, 0.0])
    sums = row_sums(token_losses, targets)
    assert sums.dtype == torch.float64 and sums.tolist() == [[3.75, 2.0], [0.0, 0.0]]
    flat = scatter(torch.tensor([3, 0]), sums, 4)
    assert flat.tolist() == [0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 3.75, 2.0]
    samples = SampleLosses.from_flat(flat.tolist())
    assert samples.label_tokens.tolist() == [0, 0, 0, 2]
    assert samples.ranked() == [3, 0, 1, 2]  # the only sample with labels first, the rest by position
    assert np.isnan(samples.per_token()[0]) and samples.per_token()[3] == 1.875


def run_layout(tmp_path, world, **layout):
    out = tmp_path / "dump"
    run_distributed(world, train_and_dump_samples, layout, str(out))
    return [torch.load(f"{out}.{r}") for r in range(world)]


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    return run_layout(tmp_path_factory.mktemp("ref"), 1)[0]


def test_samples_add_up_to_the_step_loss(reference):
    mask = global_batch(0)["label_mask"]
    for step in reference:
        assert step["sample_tokens"].tolist() == mask.sum(1).tolist()  # the fixed batch's labels per row
        assert int(step["sample_tokens"].sum()) == step["label_tokens"]
        # float32 micro-batch sums against float64 per-sample sums: rounding of ~100 terms of size ~5
        assert float(step["sample_loss"].sum()) / step["label_tokens"] == pytest.approx(step["loss"], rel=1e-6)
        assert len(step["sample_loss"]) == GLOBAL_BATCH and bool((step["sample_loss"] > 0).all())
    assert not torch.equal(reference[0]["sample_loss"], reference[1]["sample_loss"])  # the model learnt


LAYOUTS = {
    "dp2": (2, {"dp": 2, "accum": 2}),
    "tp2": (2, {"tp": 2}),
    "pp2-1f1b": (2, {"pp": 2, "engine": "1f1b"}),
    "cp2": (2, {"cp": 2}),
}


@pytest.mark.parametrize("name", list(LAYOUTS))
def test_samples_are_the_same_in_every_layout_on_every_rank(tmp_path, reference, name):
    world, layout = LAYOUTS[name]
    ranks = run_layout(tmp_path, world, **layout)
    for rank in ranks:
        assert len(rank) == STEPS
        for step, ref in zip(rank, reference):
            assert torch.equal(step["sample_tokens"], ref["sample_tokens"])
            # the same float32 token losses summed in another order (tp: vocab-split softmax; cp: halves of rows)
            torch.testing.assert_close(step["sample_loss"], ref["sample_loss"], atol=1e-4, rtol=1e-5)
