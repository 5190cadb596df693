"""Checks that need a CUDA device (pytest -m cuda; tools/gpu_check.sh runs them). Skipped on CPU."""

from __future__ import annotations

import json

import pytest
import torch

from tests.support.harness import run_distributed

pytestmark = [pytest.mark.cuda,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]


def test_fsdp_mixed_precision_fused_adamw_and_no_host_sync_in_the_micro_batch_loop(tmp_path):
    from tests.support.speed_workers import cuda_mixed_precision

    out = tmp_path / "cuda.json"
    run_distributed(1, cuda_mixed_precision, str(out))
    r = json.loads(out.read_text())
    assert r["fsdp"] is True and r["compute"] == "torch.bfloat16"
    assert r["params"] == ["torch.float32"] and r["grads"] == ["torch.float32"]  # fp32 master weights, reduce
    assert r["fused"] == [True, True]
    assert r["losses"][-1] < r["losses"][0]


def test_prefetch_thread_pins_the_batches():
    from torch.utils.data import DataLoader

    from runtime.data.loading.prefetch import PrefetchLoader

    data = [{"input_ids": torch.full((4,), i)} for i in range(6)]
    loader = PrefetchLoader(DataLoader(data, batch_size=2, pin_memory=True), 2)
    batches = list(loader)
    assert [b["input_ids"][:, 0].tolist() for b in batches] == [[0, 1], [2, 3], [4, 5]]
    assert all(b["input_ids"].is_pinned() for b in batches)


def _packed_positions(length: int, generator: torch.Generator) -> torch.Tensor:
    pos = torch.empty(1, length, dtype=torch.int64)
    i = 0
    while i < length:
        n = min(int(torch.randint(1, 300, (), generator=generator)), length - i)
        pos[0, i : i + n] = torch.arange(n)
        i += n
    return pos


@pytest.mark.parametrize("cp,attention", [(2, "causal"), (4, "document")])  # each compiles its own kernels
def test_flex_forward_and_backward_of_simulated_cp_ranks_equal_full_attention(cp, attention):
    """One GPU plays every cp rank: each rank's queries (head and tail chunks) attend through the compiled
    flex_attention to the keys of all ranks in the gather's order, with the block mask of global positions
    (and document ids), with grouped-query heads as the model has them; indexing one K/V leaf per rank makes
    the backward sum dK/dV over the ranks, as the gather's reduce-scatter does. Outputs and dQ/dK/dV equal
    full attention over the whole sequence (fp32; the kernels sum in another order)."""
    from runtime.models.document_attention import attend, document_ids, document_mask, sequence_mask, use_flex
    from runtime.parallel.context_parallel import chunk_positions

    device, length, dim = torch.device("cuda"), 1024, 64
    assert use_flex(device, dim)
    g = torch.Generator().manual_seed(2)
    q, w = (torch.randn(1, 4, length, dim, generator=g).to(device) for _ in range(2))
    k, v = (torch.randn(1, 2, length, dim, generator=g).to(device) for _ in range(2))  # grouped-query: 2 kv heads
    pos = _packed_positions(length, g).to(device)
    doc = document_ids(pos) if attention == "document" else None

    def grads(loss):
        leaves = [t.detach().requires_grad_() for t in (q, k, v)]
        out = loss(*leaves)
        (out * w).sum().backward()
        return out.detach(), [t.grad for t in leaves]

    full, full_grads = grads(lambda q, k, v: attend(q, k, v, document_mask(pos, dim) if doc is not None else None))
    kv_pos = torch.cat([chunk_positions(length, cp, r, device) for r in range(cp)])

    def simulated(q, k, v):
        out = torch.empty_like(q)
        for rank in range(cp):
            q_pos = chunk_positions(length, cp, rank, device)
            docs = (None, None) if doc is None else (doc[:, q_pos], doc[:, kv_pos])
            mask = sequence_mask(q_pos, kv_pos, *docs, flex=True)
            out[:, :, q_pos] = attend(q[:, :, q_pos], k[:, :, kv_pos], v[:, :, kv_pos], mask)
        return out

    parts, part_grads = grads(simulated)
    torch.testing.assert_close(parts, full, atol=1e-4, rtol=1e-4)
    for name, got, expected in zip("qkv", part_grads, full_grads):
        torch.testing.assert_close(got, expected, atol=1e-4, rtol=1e-4, msg=f"d{name}")


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two CUDA devices")
def test_cp2_on_two_gpus_trains_like_one(tmp_path):
    """Real cp = 2 (NCCL, flex on a head size of 64) against one GPU: the same losses and first gradients."""
    from tests.support.engine_workers import train_and_dump

    model = {"hidden_size": 128, "num_attention_heads": 2, "num_key_value_heads": 1, "dtype": "float32"}
    run_distributed(1, train_and_dump, model, str(tmp_path / "one"))
    run_distributed(2, train_and_dump, {"cp": 2, **model}, str(tmp_path / "cp2"))
    one, cp2 = (torch.load(tmp_path / f"{name}.pp0") for name in ("one", "cp2"))
    torch.testing.assert_close(torch.tensor(cp2["losses"]), torch.tensor(one["losses"]), atol=1e-4, rtol=0)
    for name, grad in one["grads"].items():
        torch.testing.assert_close(cp2["grads"][name].cpu(), grad.cpu(), atol=1e-5, rtol=1e-3, msg=name)
