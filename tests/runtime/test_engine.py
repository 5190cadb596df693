"""The engine: identical losses and weights after 3 steps in every parallel layout (gloo, CPU)."""

from __future__ import annotations

import pytest
import torch

from tests.support.configs import TINY
from tests.support.engine_workers import STEPS, train_and_dump
from tests.support.harness import run_distributed


def run_layout(tmp_path, world, **layout):
    out = tmp_path / "dump"
    run_distributed(world, train_and_dump, layout, str(out))
    pp = layout.get("pp", 1)
    parts = [torch.load(f"{out}.pp{r}") for r in range(pp)]
    weights, grads = {}, {}
    for part in parts:
        weights.update(part["weights"])
        grads.update(part["grads"])
    return parts[-1]["losses"], weights, [p["losses"] for p in parts], grads


def assert_same_training(losses, weights, grads, reference):
    """Losses and the gradients before the first optimizer step are the same arithmetic in another order: equal
    to float rounding. Weights after AdamW steps are compared with the tolerance AdamW allows: its first update
    is lr · g / (|g| + eps), about ±lr for any |g| ≫ eps, so a gradient within rounding of zero (whose sign the
    reduction order decides) may move its weight by up to 2 · lr a step; every other weight agrees to 1e-5."""
    ref_losses, ref_weights, _, ref_grads = reference
    torch.testing.assert_close(torch.tensor(losses), torch.tensor(ref_losses), atol=1e-5, rtol=0)
    assert sorted(weights) == sorted(ref_weights) == sorted(grads) == sorted(ref_grads)
    for k in ref_grads:
        torch.testing.assert_close(grads[k], ref_grads[k], atol=1e-7, rtol=1e-4, msg=k)
    lr = TINY["optimizer"]["learning_rate"]
    for k in ref_weights:
        diff = (weights[k] - ref_weights[k]).abs()
        off = int((diff > 1e-5).sum())
        assert off <= max(1, diff.numel() // 1000), (k, off, diff.numel())  # at most a few near-zero gradients
        assert float(diff.max()) <= 2 * lr * STEPS, (k, float(diff.max()))


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    return run_layout(tmp_path_factory.mktemp("ref"), 1)


LAYOUTS = {
    "dp2": (2, {"dp": 2, "accum": 2}),
    "tp2": (2, {"tp": 2}),
    "pp2-afab": (2, {"pp": 2, "engine": "afab"}),
    "pp2-1f1b-4mb": (2, {"pp": 2, "engine": "1f1b"}),
    "pp2-interleaved": (2, {"pp": 2, "engine": "interleaved-1f1b"}),
    "pp1-interleaved": (1, {"engine": "interleaved-1f1b"}),  # pp = 1: the engine is irrelevant, one chunk
    "pp4-1f1b": (4, {"pp": 4, "engine": "1f1b"}),  # two middle ranks whose batch dicts raise if read
    "dp2-pp2": (4, {"dp": 2, "pp": 2, "accum": 2}),
    "dp2-tp2": (4, {"dp": 2, "tp": 2, "accum": 2}),
    "tp2-pp2": (4, {"tp": 2, "pp": 2}),
    # context parallel: each cp rank trains on its head and tail chunks of every row (windows whose
    # position ids restart mid-row, inside a chunk), attention gathers K/V over the cp group; with tp and
    # pp in tests/runtime/test_context_parallel.py (whole runs) and test_document_attention.py
    "cp2": (2, {"cp": 2}),
    "cp2-dp2": (4, {"cp": 2, "dp": 2, "accum": 2}),  # FSDP over the 4 ranks of dp × cp
    # compiled layers run the gather inside their graph; checkpointed ones run it again in the backward pass
    "cp2-compile-checkpointing": (2, {"cp": 2, "compile": True, "activation_checkpointing": "full"}),
}


@pytest.mark.parametrize("name", list(LAYOUTS))
def test_layout_matches_single_process(tmp_path, reference, name):
    world, layout = LAYOUTS[name]
    losses, weights, per_stage, grads = run_layout(tmp_path, world, **layout)
    assert len(losses) == STEPS
    assert all(stage_losses == losses for stage_losses in per_stage)  # every rank reports the same loss
    assert_same_training(losses, weights, grads, reference)


def test_reference_learns(reference):
    losses = reference[0]
    assert losses[0] > losses[-1]  # three steps on fixed data lower the loss
    assert abs(losses[0] - torch.log(torch.tensor(128.0)).item()) < 0.1  # starts near uniform: ln(vocab)


@pytest.fixture(scope="module")
def tied_reference(tmp_path_factory):
    return run_layout(tmp_path_factory.mktemp("tied"), 1, tie_word_embeddings=True)


TIED_LAYOUTS = {  # tp alone is inside dp2-tp2 and tp2-pp2
    "dp2-tp2": (4, {"dp": 2, "tp": 2, "accum": 2}),
    "pp2-afab": (2, {"pp": 2, "engine": "afab"}),
    "pp2-interleaved": (2, {"pp": 2, "engine": "interleaved-1f1b"}),
    "pp4-1f1b": (4, {"pp": 4, "engine": "1f1b"}),  # the pair skips the middle ranks
    "dp2-pp2": (4, {"dp": 2, "pp": 2, "accum": 2}),
    "tp2-pp2": (4, {"tp": 2, "pp": 2}),
    "cp2-pp2": (4, {"cp": 2, "pp": 2, "engine": "afab"}),  # a tied pair per cp rank; each stage gathers its K/V
}


@pytest.mark.parametrize("name", list(TIED_LAYOUTS))
def test_tied_embeddings_match_single_process(tmp_path, tied_reference, name):
    """Tied: with tp the vocabulary-split embedding and head share one DTensor; with pp the last stage's
    head is a copy whose gradient is summed with the embedding's, so both stay equal to the bit."""
    world, layout = TIED_LAYOUTS[name]
    ref_weights = tied_reference[1]
    assert "lm_head.weight" not in ref_weights and "embed_tokens.weight" in ref_weights  # one parameter
    losses, weights, _, grads = run_layout(tmp_path, world, tie_word_embeddings=True, **layout)
    assert_same_training(losses, weights, grads, tied_reference)
    pp = layout.get("pp", 1)
    if pp > 1:
        first, last = (torch.load(tmp_path / f"dump.pp{r}")["weights"] for r in (0, pp - 1))
        assert "lm_head.weight" not in last  # the copy is named after the embedding
        assert torch.equal(first["embed_tokens.weight"], last["embed_tokens.weight"])


@pytest.mark.parametrize("world,layout,fragment", [
    (2, {"dp": 1, "accum": 4}, "tp 1 × pp 1 × dp 1 = 1 processes, but WORLD_SIZE is 2"),
    (2, {"tp": 2, "num_attention_heads": 4, "num_key_value_heads": 1}, "parallelism.tp 2 must divide"),
    (2, {"pp": 2, "num_hidden_layers": 1}, "model.num_hidden_layers 1 < 2 pipeline stages"),
])
def test_layout_errors_are_clear(tmp_path, world, layout, fragment):
    from tests.support.engine_workers import build_expecting_error

    run_distributed(world, build_expecting_error, layout, fragment)


def test_bf16_on_cpu_and_device_copies_of_loader_tensors():
    from tests.support.engine_workers import bf16_and_host_copies

    run_distributed(1, bf16_and_host_copies)


def test_only_the_current_sequence_lengths_schedule_is_kept():
    from tests.support.engine_workers import schedule_per_length

    run_distributed(2, schedule_per_length)


def test_pp1_ignores_the_pipeline_engine():
    """pp = 1: interleaved-1f1b asks for no virtual stages, so one layer is enough (one chunk)."""
    from runtime.parallel.pipeline import chunks_of_rank, num_chunks
    from tests.support.configs import tiny_config

    config = tiny_config(engine="interleaved-1f1b", num_hidden_layers=1)
    assert config.parallelism.pp == 1
    assert (num_chunks(1, "interleaved-1f1b", 2), chunks_of_rank(0, 1, "interleaved-1f1b", 2)) == (1, [0])
    assert (num_chunks(2, "interleaved-1f1b", 2), chunks_of_rank(1, 2, "interleaved-1f1b", 2)) == (4, [1, 3])


@pytest.mark.parametrize("world,layout", [(2, {"dp": 2, "accum": 2}), (2, {"tp": 2})], ids=["dp2-fsdp", "tp2"])
def test_no_rank_materialises_the_whole_model(tmp_path, world, layout):
    """Built on the meta device, sharded, then allocated: a rank's added memory is about its half of the
    model (≈ 0.7× here: its half, one full weight while it is initialised, allocator slack), not the whole
    model first (was ≥ 1.15× it)."""
    from tests.support.engine_workers import construction_memory

    run_distributed(world, construction_memory, layout, str(tmp_path / "m"))
    for rank in range(world):
        m = torch.load(tmp_path / f"m.{rank}")
        assert m["full"] == 8 * 3 * 256 * 16384 * 4 + 8 * 4 * 256 * 256 * 4 + 2 * 128 * 256 * 4 + 17 * 256 * 4
        assert m["added"] < 0.9 * m["full"], (m["added"] / 2**20, m["full"] / 2**20)


@pytest.mark.parametrize("shape", [(1001, 37), (50, 3), (17, 1), (4099, 16), (300,), (64, 6, 5)])
def test_blockwise_init_draws_the_whole_tensors_values(shape):
    """A shard of a weight drawn in blocks of rows equals that shard of the weight drawn whole, bit for
    bit, for any block size and part (so the initialisation is the same in every layout)."""
    from runtime.models.llama import draw_normal_part

    whole = torch.empty(shape).normal_(0.0, 0.02, generator=torch.Generator().manual_seed(11))
    rows = shape[0]
    parts = [(0, rows), (0, 1), (rows // 3, rows // 2 + 1), (rows - 1, rows), (rows // 2, rows)]
    for block_values in (16, 48, 100, 1 << 22):
        for a, b in parts:
            part = (slice(a, b),) + tuple(slice(n // 4, n) for n in shape[1:])
            got = torch.full(whole[part].shape, float("nan"))
            draw_normal_part(got, shape, 0.02, torch.Generator().manual_seed(11), part, block_values)
            assert torch.equal(got, whole[part]), (shape, block_values, a, b)
