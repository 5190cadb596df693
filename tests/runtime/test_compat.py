"""Nanotron's names (``runtime.compat``) are thin wrappers: each gives exactly what the runtime's own name gives."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np

from runtime.compat import NanotronCallStyles, get_train_dataloader
from runtime.data import DataPlan, StageDataset
from runtime.data.loading.dataloader import TensorPointerLoader, build_loader
from runtime.parallel.tensor_pointer import TensorPointer
from tests.support.configs import make_config


def test_get_train_dataloader_is_the_runtime_loader_with_nanotrons_arguments(shards, monkeypatch):
    """Same samples from the same consumed count; Nanotron's pipeline ranks become the loader's pipeline ends."""
    monkeypatch.chdir(shards)
    plan = DataPlan(make_config(mbs=2, accum=1))
    stage = plan.stages[0]
    dataset = StageDataset(plan, stage)
    ctx = SimpleNamespace(dp_rank=1, dp_size=2, pp_rank=0, pp_size=1)
    theirs = iter(get_train_dataloader(dataset, stage.sequence_length, ctx, 0, 0, 2, consumed_train_samples=8,
                                       use_position_ids=stage.use_position_ids))
    ours = iter(build_loader(dataset, stage.sequence_length, ctx, 2, 8, use_position_ids=stage.use_position_ids))
    for _ in range(3):
        a, b = next(theirs), next(ours)
        assert sorted(a) == sorted(b) and "input_ids" in a
        for key in a:
            assert np.array_equal(a[key].numpy(), b[key].numpy()), key
    # from sample 8 on, the global micro-batch is stage samples [8, 12); dp rank 1 of 2 holds its rows 10 and 11
    first = next(iter(build_loader(dataset, stage.sequence_length, ctx, 2, 8)))["input_ids"].numpy()
    rows = dataset.__getitems__([10, 11])
    assert first.tolist() == [r["input_ids"][:-1].tolist() for r in rows]

    middle = SimpleNamespace(dp_rank=0, dp_size=1, pp_rank=1)  # a pipeline rank between inputs (0) and labels (2)
    pointers = get_train_dataloader(dataset, stage.sequence_length, middle, 0, 2, 2)
    assert isinstance(pointers, TensorPointerLoader) and len(pointers) == stage.num_samples // 2
    batch = next(iter(pointers))
    assert batch["input_ids"] == TensorPointer(group_rank=0) and batch["label_ids"] == TensorPointer(group_rank=2)


def test_the_trainers_two_nanotron_call_styles_are_run():
    """``train(dataloader_or_dls=...)`` passes what it is given to ``run``; ``fit()`` passes ``train_dataloader``
    (None until set: the config's stages)."""

    class Recorder(NanotronCallStyles):
        def __init__(self) -> None:
            self.calls: list = []

        def run(self, loaders=None):
            self.calls.append(loaders)
            return len(self.calls)

    trainer = Recorder()
    loaders = {"stable": [1], "anneal": [2]}
    assert trainer.train(dataloader_or_dls=loaders) == 1
    assert trainer.train() == 2
    assert trainer.fit() == 3
    trainer.train_dataloader = "a loader"
    assert trainer.fit() == 4
    assert trainer.calls == [loaders, None, None, "a loader"]


def test_the_trainer_takes_the_call_styles_from_compat():
    """One home for Nanotron's call styles: the Trainer inherits them and does not define them again."""
    from runtime.trainer import Trainer

    assert issubclass(Trainer, NanotronCallStyles)
    assert Trainer.train is NanotronCallStyles.train and Trainer.fit is NanotronCallStyles.fit
