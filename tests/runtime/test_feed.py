"""The feed: the one way a step's micro-batches reach the engine, for training, validation and evaluate."""

from __future__ import annotations

import ast
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from nanoset.errors import ConfigError
from runtime.data.loading.feed import StepFeed
from runtime.data.loading.sources import DataSource
from runtime.parallel.tensor_pointer import TensorPointer

ROOT = Path(__file__).resolve().parents[2]
LOADING = "runtime.data.loading"


def imported_modules(path: Path) -> set[str]:
    """Every module ``path`` imports, at its top or inside a function (``from A import b`` counts as ``A``)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            found.add(node.module)
            if node.module == LOADING:  # from runtime.data.loading import feed
                found.update(f"{LOADING}.{alias.name}" for alias in node.names)
    return found


@pytest.mark.parametrize("module", ["runtime/trainer.py", "runtime/validation.py", "runtime/cli/validate.py"])
def test_training_and_validation_take_batches_only_from_the_feed(module):
    """The trainer, the validator and runtime.evaluate reach loaders, broadcasts and workers only through the feed
    (and name the batch contract's keys): a second path for a step's micro-batches would drift from the first."""
    from_loading = {m for m in imported_modules(ROOT / module) if m == LOADING or m.startswith(LOADING + ".")}
    assert from_loading <= {f"{LOADING}.feed", f"{LOADING}.contract"}, from_loading


class Stages(DataSource):
    """Two stages of steps 1-2 and 3-4; each stage's loader yields ``(stage, n)`` rows and records its life."""

    def __init__(self, from_config: bool, one_loader: bool = False) -> None:
        self.from_config, self.one_loader = from_config, one_loader
        self.stages = [SimpleNamespace(name=name, start_step=s, end_step=s + 2, sequence_length=4,
                                       use_position_ids=False) for name, s in (("a", 1), ("b", 3))]
        self.events: list[str] = []

    def stage_for(self, step):
        return self.stages[(step - 1) // 2]

    def same_loader_for(self, stage):
        return self.one_loader

    def describe(self, stage, step):
        return [f"stage {stage.name} at step {step}"]

    def loader(self, stage, step):
        self.events.append(f"build {stage.name} at {step}")

        def rows():
            try:
                for n in range(100):
                    yield {"input_ids": torch.full((2, 4), n), "label_ids": torch.full((2, 4), 10 * n),
                           "label_mask": torch.ones((2, 4), dtype=torch.bool), "stage": stage.name}
            finally:
                self.events.append(f"release {stage.name}")
        return rows()


def ctx_of(pp_rank: int = 0, pp_size: int = 1) -> SimpleNamespace:
    return SimpleNamespace(dp_rank=0, dp_size=1, pp_rank=pp_rank, pp_size=pp_size, tp_rank=0, tp_size=1, cp_rank=0,
                           cp_size=1, world_rank=pp_rank, device=torch.device("cpu"))


@pytest.mark.parametrize("from_config", [True, False])
def test_a_stage_start_releases_the_last_loader_builds_the_next_and_logs_it(from_config):
    source, lines = Stages(from_config), []
    feed = StepFeed(source, ctx_of(), micro_batch_size=2, accumulation=2, log=lines.append)
    got = [[(b["stage"], int(b["input_ids"][0, 0])) for b in feed.batches(step)] for step in (1, 2, 3, 4)]
    assert got == [[("a", 0), ("a", 1)], [("a", 2), ("a", 3)], [("b", 0), ("b", 1)], [("b", 2), ("b", 3)]]
    # the generator's finally runs when its loader is dropped: before the next stage's is built
    assert source.events == ["build a at 1", "release a", "build b at 3"]
    assert lines == ["stage a at step 1", "stage b at step 3"]
    feed.close()
    assert source.events[-1] == "release b" and feed.stage is None


def test_one_loader_for_the_run_serves_every_stage():
    source = Stages(from_config=False, one_loader=True)
    feed = StepFeed(source, ctx_of(), micro_batch_size=2, accumulation=1)
    assert [int(feed.batches(step)[0]["input_ids"][0, 0]) for step in (1, 2, 3, 4)] == [0, 1, 2, 3]
    assert source.events == ["build a at 1"]


def test_a_middle_pipeline_rank_reads_nothing_of_the_runtime_but_runs_a_users_loader():
    """The runtime's loaders give a rank that owns no data TensorPointers without reading; a user's loader runs on
    every rank (it gives its own pointers there) and is only checked to give dicts."""
    runtime, user = Stages(from_config=True), Stages(from_config=False)
    (batch,) = StepFeed(runtime, ctx_of(1, 3), micro_batch_size=2, accumulation=1).batches(1)
    assert runtime.events == [] and batch == {"input_ids": TensorPointer(0), "input_mask": TensorPointer(0),
                                              "label_ids": TensorPointer(2), "label_mask": TensorPointer(2)}
    feed = StepFeed(user, ctx_of(1, 3), micro_batch_size=2, accumulation=1)
    (batch,) = feed.batches(1)
    assert user.events == ["build a at 1"] and batch["stage"] == "a"


def test_a_batch_against_the_contract_names_the_stage_step_and_micro_batch():
    source = Stages(from_config=True)
    source.stages[1].sequence_length = 8  # the loader gives 4 tokens a row
    feed = StepFeed(source, ctx_of(), micro_batch_size=2, accumulation=2)
    feed.batches(1)
    with pytest.raises(ConfigError) as e:
        feed.batches(3)
    assert str(e.value) == ("stage 'b' step 3 micro-batch 0: the data loader's input_ids has shape [2, 4], expected "
                            "[micro_batch_size, sequence_length] = [2, 8]")
