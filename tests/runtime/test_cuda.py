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
