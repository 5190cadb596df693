"""The trainer end to end with real torchrun processes (gloo, CPU): stages, kills, resume, injection."""

from __future__ import annotations

import shutil
import sys

import pytest

from runtime.config.load import load_config
from runtime.data import DataPlan
from tests.support import ROOT
from tests.support.configs import small_config
from tests.support.harness import metrics, torchrun, train_one


@pytest.fixture(scope="module")
def reference(two_stage_run):
    """An uninterrupted two-stage run: dp=2, 12 steps, anneal from step 8."""
    return two_stage_run.config, two_stage_run.run_dir, two_stage_run.rows, two_stage_run.stdout


def plan_of(cfg, shards, monkeypatch):
    monkeypatch.chdir(shards)
    return DataPlan(load_config(cfg))


def losses(rows):
    return [r["loss"] for r in rows]


def test_two_stage_run_switches_and_learns(reference, shards, monkeypatch):
    cfg, run, rows, stdout = reference
    assert [r["step"] for r in rows] == list(range(1, 13))
    assert [r["stage"] for r in rows] == ["pretrain"] * 7 + ["anneal"] * 5
    assert "stage 'pretrain' at step 1 (steps 1-7)" in stdout
    assert "stage 'anneal' at step 8 (steps 8-12): datasets sft: shards/sft (1), sequence length 16" in stdout
    plan = plan_of(cfg, shards, monkeypatch)
    assert [r["data_hash"] for r in rows] == [plan.data_hash(s) for s in range(1, 13)]  # = runtime.explain
    for step in range(8, 13):  # stage-2 batches come only from stage-2 datasets
        _, loc = plan.global_batch(step)
        assert {plan.datasets[d].folder for d in loc.dataset} == {"shards/sft"}
    assert rows[6]["loss"] < rows[0]["loss"] - 0.3  # the loss falls on the fixture corpus
    assert all(r["lr"] > 0 and r["tokens_per_s"] > 0 and r["data_wait_ms"] >= 0 for r in rows)
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == ["latest", "step-000006", "step-000009",
                                                                         "step-000012"]
    assert "final loss per stage: pretrain" in stdout and "step-000012" in stdout


def test_sigkill_then_resume_is_bit_identical(reference, shards, tmp_path):
    """Killed mid-stage (5), then, resumed, just after the stage boundary (9: anneal starts at 8), then inside
    stage 2 (10): each resume continues from the last checkpoint, and the run ends bit-identical to one never
    killed (each resumed segment's rows stay in the metrics: steps 4-6, 7-9 and 10-12)."""
    _, _, ref_rows, _ = reference
    run = tmp_path / "run"
    cfg = small_config(tmp_path, run)
    resumed_from = None
    for kill_at, last_checkpoint in [(5, 3), (9, 6), (10, 9)]:
        killed = torchrun(cfg, 2, cwd=shards, env={"NANOSET_FAULT_KILL_AT_STEP": str(kill_at)}, check=False)
        assert killed.returncode != 0
        if resumed_from is not None:
            assert f"step-{resumed_from:06d} at step {resumed_from}" in killed.stdout
        # a checkpointing step's row waits for its checkpoint (it carries the save's time): killed before it, 9's
        # row is lost with the step, which the resumed run repeats
        assert [r["step"] for r in metrics(run)][-1] == (kill_at - 1 if kill_at % 3 == 0 else kill_at)
        resumed_from = last_checkpoint
    resumed = torchrun(cfg, 2, cwd=shards)
    assert f"step-{resumed_from:06d} at step {resumed_from}" in resumed.stdout
    rows = metrics(run)
    assert [r["step"] for r in rows] == list(range(1, 13))
    assert losses(rows) == losses(ref_rows)  # bit-identical
    assert [r["data_hash"] for r in rows] == [r["data_hash"] for r in ref_rows]


def test_resume_with_a_different_dp(reference, shards, tmp_path):
    _, _, ref_rows, _ = reference
    run = tmp_path / "run"
    cfg2 = small_config(tmp_path, run, dp=2, accum=1)
    torchrun(cfg2, 2, cwd=shards, env={"NANOSET_FAULT_KILL_AT_STEP": "7"}, check=False)
    cfg1 = small_config(tmp_path, run, dp=1, accum=2, name="dp1.yaml")  # same global batch of 4
    train_one(cfg1, cwd=shards)
    rows = metrics(run)
    assert [r["data_hash"] for r in rows] == [r["data_hash"] for r in ref_rows]
    assert losses(rows)[:7] == losses(ref_rows)[:7]
    assert losses(rows)[7:] == pytest.approx(losses(ref_rows)[7:], abs=1e-4)


def test_kill_during_checkpoint_save_keeps_the_previous_one(reference, shards, tmp_path):
    _, _, ref_rows, _ = reference
    run = tmp_path / "run"
    cfg = small_config(tmp_path, run)
    torchrun(cfg, 2, cwd=shards, env={"NANOSET_FAULT_KILL_IN_CHECKPOINT": "6"}, check=False)
    ckpts = run / "checkpoints"
    assert (ckpts / "latest").read_text().strip() == "step-000003"
    assert (ckpts / ".tmp-step-000006").is_dir() and not (ckpts / "step-000006").exists()
    resumed = torchrun(cfg, 2, cwd=shards)
    assert "step-000003 at step 3" in resumed.stdout
    assert not (ckpts / ".tmp-step-000006").exists()
    assert losses(metrics(run)) == losses(ref_rows)


CUSTOM = '''
import sys
import numpy as np
from torch.utils.data import DataLoader
from runtime.data import StageDataset, TensorPointer, get_sampler
from runtime.trainer import Trainer

class MyCustomCollator:
    """The seed's custom collator: TensorPointers on ranks that do not own the data."""
    def __init__(self, seq_len, input_pp_rank, output_pp_rank, parallel_context):
        self.seq_len, self.input_pp_rank, self.output_pp_rank = seq_len, input_pp_rank, output_pp_rank
        self.pp_rank = parallel_context.pp_rank
    def __call__(self, examples):
        import torch
        batch = np.vstack([ex["input_ids"] for ex in examples])
        out = {"input_ids": TensorPointer(self.input_pp_rank), "input_mask": TensorPointer(self.input_pp_rank),
               "label_ids": TensorPointer(self.output_pp_rank), "label_mask": TensorPointer(self.output_pp_rank)}
        if self.pp_rank == self.input_pp_rank:
            out["input_ids"] = torch.from_numpy(batch[:, :-1])
            out["input_mask"] = torch.ones((len(batch), self.seq_len), dtype=torch.bool)
        if self.pp_rank == self.output_pp_rank:
            out["label_ids"] = torch.from_numpy(batch[:, 1:])
            out["label_mask"] = torch.ones((len(batch), self.seq_len), dtype=torch.bool)
        return out

trainer = Trainer(sys.argv[sys.argv.index("--config") + 1])
ctx, cfg = trainer.parallel_context, trainer.config

def make_loader(stage):
    ds = StageDataset(trainer.plan, stage)
    sampler = get_sampler(ds, dl_rank=ctx.dp_pg.rank(), dl_ranks_size=ctx.dp_pg.size(), seed=42, drop_last=True,
                          shuffle=False, micro_batch_size=cfg.tokens.micro_batch_size)
    collator = MyCustomCollator(stage.sequence_length, 0, ctx.pp_pg.size() - 1, ctx)
    return DataLoader(ds, batch_size=cfg.tokens.micro_batch_size, sampler=sampler, collate_fn=collator)

if "--dict" in sys.argv:
    trainer.train(dataloader_or_dls={s.name: (lambda s=s: make_loader(s)) for s in trainer.plan.stages})
else:
    trainer.train_dataloader = make_loader(trainer.plan.stages[0])
    trainer.fit()
trainer.close()
'''


@pytest.mark.parametrize("style", ["dict", "fit"])
def test_custom_dataloader_injection(reference, shards, tmp_path, style):
    """Nanotron-style custom loaders (get_sampler + a TensorPointer collator) train exactly like the config's."""
    _, _, ref_rows, _ = reference
    script = tmp_path / "custom_train.py"
    script.write_text(f"import sys; sys.path.insert(0, {str(ROOT)!r}); sys.argv.append('--{style}')\n" + CUSTOM)
    run = tmp_path / "run"
    if style == "dict":
        cfg = small_config(tmp_path, run, positions=False)  # the seed's collator has no position ids
        torchrun(cfg, 2, cwd=shards, script=script)
        custom = metrics(run)
        shutil.rmtree(run)
        torchrun(cfg, 2, cwd=shards)  # the same config with the loaders built from it
        built = metrics(run)
        assert [r["stage"] for r in custom] == [r["stage"] for r in ref_rows]
        assert all(r["data_hash"] is None for r in custom)
        assert all("sources" not in r for r in custom) and all("sources" in r for r in built)  # no source ids
        assert losses(custom) == losses(built) and custom[6]["loss"] < custom[0]["loss"]
    else:
        cfg = small_config(tmp_path, run, steps=6, single_stage=True)
        torchrun(cfg, 2, cwd=shards, script=script)
        rows = metrics(run)
        assert [r["step"] for r in rows] == list(range(1, 7)) and rows[-1]["loss"] < rows[0]["loss"]


def test_bad_configs_fail_before_processes_start(shards, tmp_path):
    run = tmp_path / "run"
    cfg = small_config(tmp_path, run)
    text = cfg.read_text().replace("shards/sft", "shards/missing")
    cfg.write_text(text)
    proc = torchrun(cfg, 2, cwd=shards, check=False)
    assert proc.returncode != 0
    assert "error: " in proc.stderr and "shards/missing: no such dataset folder" in proc.stderr
    assert not run.exists()  # nothing started: no run folder, no process group
    good = small_config(tmp_path, run, name="good.yaml")
    import subprocess
    one = subprocess.run([sys.executable, "-m", "runtime.train", "--config", str(good)], capture_output=True,
                         text=True, cwd=shards)
    assert one.returncode == 1 and one.stderr.strip().splitlines() == [
        f"error: {good}: parallelism tp 1 × pp 1 × dp 2 = 2 processes, but 1 were launched; "
        "use torchrun --nproc_per_node=2"]


def test_resume_refuses_changed_data_or_batch(reference, shards, tmp_path):
    import subprocess
    run = tmp_path / "run"
    cfg = small_config(tmp_path, run, dp=1, steps=12, interval=3)
    train_one(cfg, cwd=shards, env={"NANOSET_FAULT_KILL_AT_STEP": "4"}, check=False)
    shutil.copytree(shards / "shards" / "web", tmp_path / "web2")
    (tmp_path / "web2" / "nanoset.json").write_text((tmp_path / "web2" / "nanoset.json").read_text().replace(
        '"ds": "', '"ds": "0'))
    changed = cfg.read_text().replace("shards/web", str(tmp_path / "web2"))
    (tmp_path / "changed.yaml").write_text(changed)
    proc = subprocess.run([sys.executable, "-m", "runtime.train", "--config", str(tmp_path / "changed.yaml")],
                          capture_output=True, text=True, cwd=shards)
    assert proc.returncode == 1 and "the data changed since this checkpoint" in proc.stderr
    bigger = small_config(tmp_path, run, dp=1, accum=2, name="bigger.yaml")
    proc = subprocess.run([sys.executable, "-m", "runtime.train", "--config", str(bigger)], capture_output=True,
                          text=True, cwd=shards)
    assert proc.returncode == 1 and "global batch size changed mid-stage (2 → 4)" in proc.stderr


@pytest.mark.parametrize("nproc,layout", [(2, {"tp": 2}), (2, {"pp": 2, "pp_engine": "1f1b"}),
                                          (4, {"tp": 2, "pp": 2, "pp_engine": "afab"})])
def test_other_layouts_replay_the_same_data(reference, shards, tmp_path, nproc, layout):
    """tp and pp runs (only tp rank 0 reads, others get the batch by broadcast; middle pipeline ranks
    read nothing) see the same samples as the dp=2 reference, with the same losses."""
    _, _, ref_rows, _ = reference
    run = tmp_path / "run"
    cfg = small_config(tmp_path, run, dp=1, accum=2, parallelism=layout)  # the same global batch of 4
    torchrun(cfg, nproc, cwd=shards)
    rows = metrics(run)
    assert [r["data_hash"] for r in rows] == [r["data_hash"] for r in ref_rows]
    assert losses(rows) == pytest.approx(losses(ref_rows), abs=1e-4)


def test_four_stage_pipeline_switches_sequence_length(reference, shards, tmp_path):
    """pp=4: the two middle ranks hold only TensorPointers and still follow the anneal stage's shorter
    sequence (a new schedule per shape)."""
    _, _, ref_rows, _ = reference
    run = tmp_path / "run"
    cfg = small_config(tmp_path, run, dp=1, accum=2, parallelism={"pp": 4, "pp_engine": "afab"},
                       model={"num_hidden_layers": 4})
    torchrun(cfg, 4, cwd=shards)
    rows = metrics(run)
    assert [r["data_hash"] for r in rows] == [r["data_hash"] for r in ref_rows]
    assert rows[6]["loss"] < rows[0]["loss"] and [r["stage"] for r in rows][7] == "anneal"
