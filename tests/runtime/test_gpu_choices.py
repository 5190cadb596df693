"""The choices the engine makes for a GPU, tested on the CPU: which SDPA path grouped-query K/V take, FSDP's
resharding and gradient sync, the MFU peak table, dynamo's recompile limit, RoPE in fp32, and the tp/cp
broadcast's one asynchronous copy per tensor kind."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
import torch

from runtime.data.loading.tp_broadcast import on_device
from runtime.models.document_attention import attend, sdpa_reads_grouped_kv
from runtime.models.llama import apply_rope, rope_tables
from runtime.observe.metrics import peak_flops_of
from runtime.parallel.parallelize import compile_variants, reshards_after_forward, set_recompile_limit
from tests.support.configs import TINY, build, merged, tiny_config
from tests.support.harness import run_distributed


def _q(device: str, dtype: torch.dtype, head: int = 64):
    return SimpleNamespace(device=torch.device(device), dtype=dtype, shape=(2, 8, 128, head))


def test_sdpa_reads_grouped_kv_only_where_the_flash_kernel_takes_them():
    assert sdpa_reads_grouped_kv(_q("cuda", torch.bfloat16), None)
    assert sdpa_reads_grouped_kv(_q("cuda", torch.float16, 128), None)
    assert not sdpa_reads_grouped_kv(_q("cuda", torch.float32), None)  # memory-efficient kernel: no GQA
    assert not sdpa_reads_grouped_kv(_q("cuda", torch.bfloat16), torch.zeros(1, dtype=torch.bool))  # a mask
    assert not sdpa_reads_grouped_kv(_q("cuda", torch.bfloat16, 512), None)  # past flash's head sizes
    assert not sdpa_reads_grouped_kv(_q("cpu", torch.bfloat16), None)  # 5-9x slower grouped on CPU


def test_grouped_kv_attention_on_cpu_equals_the_repeated_heads():
    gen = torch.Generator().manual_seed(0)
    q = torch.randn(2, 4, 16, 8, generator=gen)
    k, v = torch.randn(2, 2, 16, 8, generator=gen), torch.randn(2, 2, 16, 8, generator=gen)
    expected = torch.nn.functional.scaled_dot_product_attention(
        q, k.repeat_interleave(2, dim=1), v.repeat_interleave(2, dim=1), is_causal=True)
    torch.testing.assert_close(attend(q, k, v, None), expected, rtol=0, atol=0)


def test_fsdp_reshards_after_forward_only_over_several_ranks_and_not_the_last_layer():
    assert [reshards_after_forward(i, 4, 1) for i in range(4)] == [False] * 4  # dp·cp 1: the bf16 cast only
    assert [reshards_after_forward(i, 4, 8) for i in range(4)] == [True, True, True, False]


@pytest.mark.parametrize("name, peak", [
    ("NVIDIA H100 80GB HBM3", 989e12), ("NVIDIA H100 PCIe", 756e12), ("NVIDIA H100 NVL", 835e12),
    ("NVIDIA H200", 989e12), ("NVIDIA H200 NVL", 835e12), ("NVIDIA B200", 2250e12), ("NVIDIA H800", 989e12),
    ("NVIDIA A100-SXM4-80GB", 312e12), ("NVIDIA GeForce RTX 3090", None),
])
def test_mfu_peak_table(name, peak):
    assert peak_flops_of(name) == peak


def test_recompile_limit_covers_a_runs_variants_and_fails_loudly():
    import torch._dynamo.config as dynamo

    saved = dynamo.recompile_limit, dynamo.fail_on_recompile_limit_hit
    try:
        # two stage lengths × train/validation × recomputed checkpointed layers
        assert compile_variants({2048, 8192}, checkpointing=True) == 8
        assert compile_variants({2048, 8192, 32768}, checkpointing=True) == 12
        dynamo.recompile_limit = 8
        assert set_recompile_limit(12) == 12
        assert dynamo.recompile_limit == 12 and dynamo.fail_on_recompile_limit_hit is True
        assert set_recompile_limit(4) == 12  # never lowered
    finally:
        dynamo.recompile_limit, dynamo.fail_on_recompile_limit_hit = saved


def test_rope_in_fp32_rotates_in_fp32_and_is_recorded_in_the_config():
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(1, 64, 2, 16, generator=gen).to(torch.bfloat16)
    pos = torch.arange(64)[None] * 500  # long-context positions, where bf16 angles lose most
    cos32, sin32 = rope_tables(pos, 16, 10000.0, torch.float32)
    cos16, sin16 = rope_tables(pos, 16, 10000.0, torch.bfloat16)
    x1, x2 = x.float().chunk(2, dim=-1)
    exact = torch.cat((x1 * cos32 - x2 * sin32, x2 * cos32 + x1 * sin32), dim=-1)
    fp32 = apply_rope(x, cos32, sin32)
    bf16 = apply_rope(x, cos16, sin16)
    assert fp32.dtype == bf16.dtype == torch.bfloat16
    torch.testing.assert_close(fp32, exact.to(torch.bfloat16), rtol=0, atol=0)
    assert (bf16.float() - exact).abs().max() > (fp32.float() - exact).abs().max()
    config = tiny_config(rope_fp32=True)
    assert config.model.rope_fp32 is True and config.to_dict()["model"]["rope_fp32"] is True  # in checkpoints
    assert tiny_config().model.rope_fp32 is False  # default: as Hugging Face rotates


def test_broadcast_batches_copy_each_tensor_kind_once(monkeypatch):
    batches = [{"input_ids": torch.full((2, 4), i), "label_ids": torch.full((2, 4), 10 + i)} for i in range(3)]
    copies = []
    to = torch.Tensor.to

    def recorded(self, *a, **k):
        copies.append((tuple(self.shape), k.get("non_blocking"), self.is_pinned()))
        return to(self, *a, **k)

    monkeypatch.setattr(torch.Tensor, "to", recorded)
    out = on_device(batches, ["input_ids", "label_ids"], torch.int64, (3, 2, 4), torch.device("cpu"))
    assert copies == [((2, 3, 2, 4), True, False)]  # one asynchronous copy (pinned on CUDA), not six
    assert out[0, :, 0, 0].tolist() == [0, 1, 2] and out[1, :, 0, 0].tolist() == [10, 11, 12]


def gradient_syncs(rank: int, world: int, mode: str, out_path: str) -> None:
    """Record what the micro-batch loop asks FSDP for: reduce-scatter after each micro-batch or not."""
    from runtime.engine import Engine
    from runtime.parallel.context import ParallelContext
    from tests.support.engine_workers import rank_batches

    ctx = ParallelContext()
    config = build(merged(TINY, parallelism={"gradient_sync": mode}, tokens={"batch_accumulation_per_replica": 3},
                          model={"dtype": "bfloat16"}))  # bf16: FSDP even at dp 1
    engine = Engine(config, ctx)
    asked = []
    chunk = engine.chunks[0]
    setter = chunk.set_requires_gradient_sync
    chunk.set_requires_gradient_sync = lambda flag, **k: (asked.append(flag), setter(flag, **k))
    engine.train_step(rank_batches(0, ctx, 3))
    with open(out_path, "w") as f:
        json.dump(asked, f)
    ctx.destroy()


@pytest.mark.parametrize("mode, asked", [("every_micro_batch", [True, True, True]),
                                         ("last_micro_batch", [False, False, True])])
def test_gradient_sync_per_micro_batch_by_default(tmp_path, mode, asked):
    out = tmp_path / "asked.json"
    run_distributed(1, gradient_syncs, mode, str(out))
    assert json.loads(out.read_text()) == asked
    assert tiny_config().parallelism.gradient_sync == "every_micro_batch"


def test_a_bad_gradient_sync_is_one_line():
    from runtime.config import ConfigError

    with pytest.raises(ConfigError) as e:
        build(merged(TINY, parallelism={"gradient_sync": "never"}))
    assert str(e.value) == ("parallelism.gradient_sync: 'never' is not one of ['every_micro_batch', "
                            "'last_micro_batch']")
