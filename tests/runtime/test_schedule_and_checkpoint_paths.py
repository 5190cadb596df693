"""LR schedules (exact values) and how checkpoints.resume picks a checkpoint."""

from __future__ import annotations

import math

import pytest

from runtime.checkpoint.store import CheckpointManager
from runtime.config import LRSchedulerArgs
from runtime.lr_schedule import LRSchedule


def lrs(style, steps=10, warmup=2, min_lr=0.1, **kw):
    s = LRSchedule(LRSchedulerArgs(warmup_steps=warmup, decay_style=style, min_lr=min_lr, **kw), 1.0, steps)
    return [round(s.lr_at(t), 6) for t in range(1, steps + 1)]


def test_warmup_then_decay_styles():
    assert lrs("constant") == [0.5, 1.0] + [1.0] * 8
    assert lrs("linear") == [0.5, 1.0, 0.8875, 0.775, 0.6625, 0.55, 0.4375, 0.325, 0.2125, 0.1]
    cos = lrs("cosine")
    assert cos[:2] == [0.5, 1.0] and cos[-1] == 0.1
    assert cos[5] == round(0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * 4 / 8)), 6)
    # wsd: stable at the peak, then linear decay over the last quarter of the post-warm-up steps
    assert lrs("wsd", wsd_decay_fraction=0.25) == [0.5, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 0.55, 0.1]
    assert lrs("cosine", warmup=0)[0] == round(0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi / 10)), 6)


def test_resume_resolution(tmp_path):
    m = CheckpointManager(tmp_path, keep_last=2, is_writer=True)
    assert m.resolve(None) is None and m.resolve("latest") is None  # nothing saved yet: a fresh start
    (tmp_path / "step-000004").mkdir()
    (tmp_path / "step-000004" / "metadata.json").write_text("{}")
    (tmp_path / "latest").write_text("step-000004\n")
    assert m.resolve("latest") == tmp_path / "step-000004"
    assert m.resolve(str(tmp_path / "step-000004")) == tmp_path / "step-000004"
    (tmp_path / ".tmp-step-000008").mkdir()
    with pytest.raises(FileNotFoundError, match="not a complete checkpoint"):
        m.resolve(str(tmp_path / ".tmp-step-000008"))
