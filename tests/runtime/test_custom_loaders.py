"""Custom loaders on resume are advanced or refused, never replayed from sample 0."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from runtime.config import ConfigError
from runtime.data.loading.sources import loader_from_source
from tests.support import ROOT
from tests.support.configs import small_config
from tests.support.harness import metrics, torchrun, train_one


class Countdown:
    """A loader object that starts at ``consumed_train_samples`` (the protocol's attribute)."""

    def __init__(self, n: int) -> None:
        self.n = n
        self.consumed_train_samples = 0

    def __iter__(self):
        return iter(range(self.consumed_train_samples, self.n))


def test_loader_objects_and_factories_start_where_the_run_is():
    assert list(loader_from_source(Countdown(6), 4, "stage 's'", 3)) == [4, 5]  # advanced through the attribute
    assert list(loader_from_source(lambda consumed_train_samples: range(consumed_train_samples, 6), 2, "x", 2)) == [
        2, 3, 4, 5]
    assert list(loader_from_source(lambda: Countdown(3), 1, "x", 2)) == [1, 2]
    assert loader_from_source([7, 8], 0, "x", 1) == [7, 8]  # nothing consumed: any object, as is
    assert list(loader_from_source(lambda: [7, 8], 0, "x", 1)) == [7, 8]
    for source in ([7, 8], lambda: [7, 8]):
        with pytest.raises(ConfigError) as e:
            loader_from_source(source, 8, "stage 'pretrain'", 5)
        assert str(e.value) == (
            "stage 'pretrain': resuming at step 5 with 8 of its samples already consumed, but its loader (list) cannot "
            "be advanced and would replay them from sample 0; pass a callable taking consumed_train_samples that "
            "builds the loader from there, or give the loader a consumed_train_samples attribute")


SCRIPT = '''
import sys
sys.path.insert(0, {root!r})
from torch.utils.data import DataLoader
from runtime.data import StageDataset, get_sampler
from runtime.data.loading.collator import DataCollatorForCLM
from runtime.trainer import Trainer

trainer = Trainer(sys.argv[sys.argv.index("--config") + 1])
ctx, cfg = trainer.parallel_context, trainer.config
stage = trainer.plan.stages[0]
ds = StageDataset(trainer.plan, stage)
sampler = get_sampler(ds, dl_rank=0, dl_ranks_size=1, micro_batch_size=cfg.tokens.micro_batch_size)
collator = DataCollatorForCLM(stage.sequence_length, 0, 0, ctx)
trainer.train_dataloader = DataLoader(ds, batch_size=cfg.tokens.micro_batch_size, sampler=sampler,
                                      collate_fn=collator)
try:
    trainer.fit()
except Exception as e:
    print(f"error: {{e}}", file=sys.stderr)
    sys.exit(1)
finally:
    trainer.close()
'''


def test_a_loader_object_is_refused_on_resume(shards, tmp_path):
    """Nanotron's `trainer.train_dataloader = loader` style, resumed after a kill: one clear error, no replay."""
    script = tmp_path / "custom.py"
    script.write_text(SCRIPT.format(root=str(ROOT)))
    run = tmp_path / "run"
    cfg = small_config(tmp_path, run, dp=1, steps=6, interval=2, single_stage=True, positions=False)
    killed = torchrun(cfg, 1, cwd=shards, script=script, env={"NANOSET_FAULT_KILL_AT_STEP": "3"}, check=False)
    assert killed.returncode != 0 and [r["step"] for r in metrics(run)] == [1, 2, 3]
    again = torchrun(cfg, 1, cwd=shards, script=script, check=False)
    assert again.returncode != 0
    assert ("error: the run's data loader: resuming at step 3 with 4 of its samples already consumed, but its loader "
            "(DataLoader) cannot be advanced") in again.stderr
    assert [r["step"] for r in metrics(run)] == [1, 2]  # nothing trained on replayed samples


FACTORIES = '''
import sys
sys.path.insert(0, {root!r})
from runtime.data import StageDataset, get_train_dataloader
from runtime.trainer import Trainer

trainer = Trainer(sys.argv[sys.argv.index("--config") + 1])
ctx, cfg = trainer.parallel_context, trainer.config

def factory(consumed_train_samples):
    print(f"factory called with {{consumed_train_samples}}", flush=True)
    stage = trainer.plan.stages[-1]
    return get_train_dataloader(StageDataset(trainer.plan, stage), stage.sequence_length, ctx, 0, 0,
                                cfg.tokens.micro_batch_size, consumed_train_samples=0)

try:
    trainer.train(dataloader_or_dls={{"pretrain": factory}})
finally:
    trainer.close()
'''


def test_a_stage_split_by_a_new_batch_size_tells_its_factory_every_sample_consumed(shards, tmp_path):
    """A resume with another global batch size mid-stage (allow_data_change) splits the stage in two parts;
    the stage's factory is told the samples of both (4 at G=2, then 2 steps at G=4), not the new part's 0."""
    script = tmp_path / "factories.py"
    script.write_text(FACTORIES.format(root=str(ROOT)))
    run = tmp_path / "run"
    first = small_config(tmp_path, run, dp=1, steps=2, interval=2, single_stage=True, positions=False)
    assert "factory called with 0" in torchrun(first, 1, cwd=shards, script=script).stdout
    bigger = dict(checkpoints={"allow_data_change": True})
    second = small_config(tmp_path, run, dp=1, accum=2, steps=4, interval=2, single_stage=True, positions=False,
                          **bigger)
    assert "factory called with 4\n" in torchrun(second, 1, cwd=shards, script=script).stdout
    third = small_config(tmp_path, run, dp=1, accum=2, steps=6, interval=2, single_stage=True, positions=False,
                         **bigger)
    assert "factory called with 12\n" in torchrun(third, 1, cwd=shards, script=script).stdout
    assert [r["step"] for r in metrics(run)] == [1, 2, 3, 4, 5, 6]


WRONG_BATCHES = '''
import sys, torch
sys.path.insert(0, {root!r})
from nanoset.errors import report_user_errors
from runtime.trainer import Trainer

shape, dtype = {shape!r}, getattr(torch, {dtype!r})
def batches():
    while True:
        yield {{"input_ids": torch.zeros(shape, dtype=dtype), "label_ids": torch.zeros(shape, dtype=dtype),
               "label_mask": torch.ones(shape, dtype=torch.bool)}}

trainer = Trainer(sys.argv[sys.argv.index("--config") + 1])
try:
    sys.exit(report_user_errors(lambda: trainer.train(dataloader_or_dls=batches()) and 0))
finally:
    trainer.close()
'''


@pytest.mark.parametrize("shape, dtype, line", [
    ((4, 32), "int64", "input_ids has shape [4, 32], expected [micro_batch_size, sequence_length] = [2, 32]"),
    ((2, 16), "int64", "input_ids has shape [2, 16], expected [micro_batch_size, sequence_length] = [2, 32]"),
    ((2, 32), "int32", "input_ids is torch.int32, expected torch.int64"),
])
def test_a_custom_loaders_batches_of_another_shape_are_refused(shards, tmp_path, shape, dtype, line):
    """A loader yielding [4, 128] for micro_batch_size 2 trained silently (label_tokens doubled, the checkpoint
    recorded half the samples read): every micro-batch is checked against the contract."""
    script = tmp_path / "wrong.py"
    script.write_text(WRONG_BATCHES.format(root=str(ROOT), shape=shape, dtype=dtype))
    cfg = small_config(tmp_path, tmp_path / "run", dp=1, steps=2, single_stage=True, positions=False)
    proc = subprocess.run([sys.executable, str(script), "--config", str(cfg)], capture_output=True, text=True,
                          cwd=shards)
    assert proc.returncode == 1
    assert proc.stderr == f"error: stage 'pretrain' step 1 micro-batch 0: the data loader's {line}\n"


PP2 = dict(parallelism={"dp": 1, "pp": 2, "pp_engine": "afab"}, tokens={"batch_accumulation_per_replica": 2})


def docs_script() -> str:
    """The custom-loader script of docs/parallelism.md, as written there."""
    text = (ROOT / "docs" / "parallelism.md").read_text()
    start = text.index('```python\n"""my_train.py') + len("```python\n")
    return text[start:text.index("```\n", start)]


def run_docs_script(tmp_path, shards, script: str, name: str):
    path = tmp_path / f"{name}.py"
    path.write_text(script)
    run = tmp_path / name
    cfg = small_config(tmp_path, run, dp=1, steps=2, single_stage=True, name=f"{name}.yaml", **PP2)
    proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
                           str(path), str(cfg)], capture_output=True, text=True, cwd=shards, timeout=300,
                          env={**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)})
    return run, cfg, proc


def test_the_docs_custom_loader_script_trains_with_pp2_as_the_config_loaders_do(shards, tmp_path):
    """The snippet runs as written (imports, factories by stage, the DataLoader) and trains the config's samples:
    the same losses and label tokens as `runtime.train` on the config (one process), without a data_hash."""
    run, cfg, proc = run_docs_script(tmp_path, shards, docs_script(), "docs")
    assert proc.returncode == 0, proc.stderr[-3000:]
    reference = tmp_path / "reference"  # one process: every layout gives the same loss to float rounding
    train_one(small_config(tmp_path, reference, dp=1, steps=2, single_stage=True, name="reference.yaml",
                           tokens={"batch_accumulation_per_replica": 2}), cwd=shards)
    mine, theirs = metrics(run), metrics(reference)
    assert [(r["step"], r["label_tokens"], r["data_hash"]) for r in mine] == [
        (r["step"], r["label_tokens"], None) for r in theirs]
    assert [r["loss"] for r in mine] == pytest.approx([r["loss"] for r in theirs], abs=1e-5, rel=0)


def test_a_batch_only_the_last_pipeline_rank_finds_wrong_is_one_line_from_every_rank(shards, tmp_path):
    """The docs script with its labels collated onto pipeline rank 0 (the last rank gets TensorPointers for
    label_ids): only rank 1 finds it, rank 0's inputs are right. Rank 0 went on into the pipeline and died
    with a gloo traceback; now both ranks agree before the step and the error is one line, said once."""
    script = docs_script().replace("stage.sequence_length, 0, ctx.pp_size - 1, ctx)",
                                   "stage.sequence_length, 0, 0, ctx)")
    assert script != docs_script()
    run, cfg, proc = run_docs_script(tmp_path, shards, script, "labels")
    assert proc.returncode != 0
    assert [line for line in proc.stderr.splitlines() if line.startswith("error:")] == [
        "error: stage 'pretrain' step 1 micro-batch 0 on rank 1: the data loader's batch has no tensor 'label_ids' "
        "(TensorPointer); the batches of this pipeline rank hold label_ids, label_mask (see docs/parallelism.md)"]
    assert not [line for line in proc.stderr.splitlines() if line.startswith("[rank")]  # no worker traceback
    assert not (run / "metrics.jsonl").exists() or metrics(run) == []


def test_the_micro_batch_check_names_a_missing_key_and_a_batch_that_is_no_dict():
    """The branches the loaders above do not reach: a key left out, a tensor where a dict belongs, a
    TensorPointer-free middle pipeline rank (it checks only that it got a dict)."""
    import torch

    from runtime.data.loading.contract import check_micro_batch

    ids, mask = torch.zeros((2, 8), dtype=torch.int64), torch.ones((2, 8), dtype=torch.bool)
    with pytest.raises(ConfigError) as e:
        check_micro_batch({"input_ids": ids, "label_ids": ids}, True, True, 2, 8, "stage 's' step 3 micro-batch 1")
    assert str(e.value) == ("stage 's' step 3 micro-batch 1: the data loader's batch has no tensor 'label_mask' (no "
                            "such key); the batches of this pipeline rank hold input_ids, label_ids, label_mask, "
                            "position_ids (see docs/parallelism.md)")
    with pytest.raises(ConfigError) as e:
        check_micro_batch(ids, False, True, 2, 8, "stage 's' step 1 micro-batch 0 on rank 1")
    assert str(e.value) == ("stage 's' step 1 micro-batch 0 on rank 1: the data loader yielded a Tensor, not a batch "
                            "dict of input_ids, input_mask, label_ids, label_mask (see docs/parallelism.md)")
    with pytest.raises(ConfigError) as e:  # a middle pipeline rank owns no key, but still needs a dict
        check_micro_batch([ids, mask], False, False, 2, 8, "w")
    assert str(e.value).startswith("w: the data loader yielded a list, not a batch dict")
    check_micro_batch({"label_ids": ids, "label_mask": mask}, False, True, 2, 8, "w")  # the last rank's keys: fine
    check_micro_batch({}, False, False, 2, 8, "w")  # a middle rank's (TensorPointers or nothing): fine
