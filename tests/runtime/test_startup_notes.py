"""The notes a run prints once at start-up: a resume in another layout or batch, a recomputed learning-rate
schedule, samples that repeat, packing that loses tokens; nothing when there is nothing to say."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

from runtime.data.order.plan import DataPlan
from runtime.startup import RunStart, Startup, startup_notes, startup_warnings
from tests.support.configs import make_config

STAGE = {"name": "sft", "start_training_step": 1, "data": {"dataset": {"dataset_folder": "shards/sft"}}}


def notes(config, metadata=None):
    # the parts of a CheckpointRecord the notes read (the test gives only the fields that matter)
    record = SimpleNamespace(config=metadata["config"], lr_schedule=metadata.get("lr_schedule", {}),
                             extensions=metadata.get("extensions", {}),
                             training=SimpleNamespace(**metadata["training"]),
                             last_step=metadata["training"]["last_train_step"]) if metadata else None
    start = RunStart(Path("ck/step-000010") if metadata else None, record)
    return startup_notes(Startup(config, DataPlan(config), start, []))


def test_nothing_to_say(shards, monkeypatch):
    monkeypatch.chdir(shards)
    assert notes(make_config(train_steps=40)) == []


def test_a_resume_in_another_layout_and_a_recomputed_schedule(shards, monkeypatch):
    monkeypatch.chdir(shards)
    c = make_config(dp=2, accum=1, train_steps=40)  # global batch 4
    saved = {"training": {"last_train_step": 10, "global_batch_size": 4},
             "config": {"parallelism": {"dp": 1},
                        "tokens": {"micro_batch_size": 2, "batch_accumulation_per_replica": 2}},
             "lr_schedule": {"train_steps": 10}}
    assert notes(c, saved) == [
        "resuming ck/step-000010 in another layout (dp 1 → 2, batch_accumulation_per_replica 2 → 1): global batch 4 "
        "as before: the same samples in the same order, losses equal to float rounding (not to the bit)",
        "tokens.train_steps is 40, the checkpoint's learning-rate schedule was for 10: it is recomputed for 40 steps "
        "from step 11"]


def test_samples_that_repeat_and_packing_that_drops_tokens(shards, monkeypatch):
    monkeypatch.chdir(shards)
    many = make_config(train_steps=600, seq=64, stages=[STAGE])  # 600 steps × 2 samples of the 1,125 windows
    assert notes(many) == ["stage 'sft' reads shards/sft up to 1.07 epochs: its samples repeat (add data, or fewer "
                           "steps or a lower weight for it)"]
    packed = dict(STAGE, data={"packing": "documents", "drop_long_documents": True, "use_position_ids": True,
                               "dataset": {"dataset_folder": "shards/sft"}})
    (line,) = notes(make_config(train_steps=2, seq=24, stages=[packed]))
    assert line == ("packing shards/sft at sequence length 24: 37.6% of its tokens are in documents longer than 25 "
                    "tokens and dropped; raise the stage's sequence_length to train on them")


def test_a_dataset_read_more_than_ten_epochs_in_a_stage_is_a_warning_not_a_note(shards, monkeypatch):
    monkeypatch.chdir(shards)
    config = make_config(train_steps=6000, seq=64, stages=[STAGE])  # 12,000 samples of the 1,125 windows
    assert notes(config) == []
    assert startup_warnings(Startup(config, DataPlan(config), RunStart(None, None), [])) == [
        "stage 'sft' reads shards/sft 10.7 epochs (more than 10): each of its samples is trained about 11 times; add "
        "data, or fewer steps or a lower weight for it"]
    ten = make_config(train_steps=5625, seq=64, stages=[STAGE])  # exactly 10 epochs: a note
    assert startup_warnings(Startup(ten, DataPlan(ten), RunStart(None, None), [])) == []
    assert notes(ten) == ["stage 'sft' reads shards/sft up to 10.00 epochs: its samples repeat (add data, or fewer "
                          "steps or a lower weight for it)"]


def test_a_resume_at_another_cp_is_a_layout_change(shards, monkeypatch):
    """cp is part of the layout like dp, tp and pp: a checkpoint of cp 2 resumed at cp 1 (and one saved before
    cp existed, which is cp 1, resumed at cp 2) gets the note, with the same global batch."""
    monkeypatch.chdir(shards)
    saved = {"training": {"last_train_step": 10, "global_batch_size": 2},
             "config": {"parallelism": {"dp": 1, "cp": 2},
                        "tokens": {"micro_batch_size": 2, "batch_accumulation_per_replica": 1}}}
    assert notes(make_config(train_steps=40), saved) == [
        "resuming ck/step-000010 in another layout (cp 2 → 1): global batch 2 as before: the same samples in the "
        "same order, losses equal to float rounding (not to the bit)"]
    at_cp2 = make_config(train_steps=40)
    at_cp2.parallelism.cp = 2
    del saved["config"]["parallelism"]["cp"]
    assert notes(at_cp2, saved) == [
        "resuming ck/step-000010 in another layout (cp 1 → 2): global batch 2 as before: the same samples in the "
        "same order, losses equal to float rounding (not to the bit)"]


def test_the_check_report_names_a_schedule_not_its_first_weights(shards, monkeypatch):
    """nanoset train --check: a scheduled stage's datasets show their weights at the stage's first and last steps
    (a ramp 0.9 → 0.2 drew 11 of 20 samples, not the 18 'weight 0.9' would)."""
    from runtime.cli.launch import plan_report

    monkeypatch.chdir(shards)
    stage = {"name": "ramp", "start_training_step": 1, "data": {"dataset": {
        "dataset_folder": ["shards/web", "shards/code"],
        "dataset_weights": [{"step": 1, "weights": [0.9, 0.1]}, {"step": 10, "weights": [0.2, 0.8]}]}}}
    assert plan_report(DataPlan(make_config(train_steps=10, stages=[stage]))) == [
        "stage 'ramp': steps 1-10 (10 steps), sequence length 128, global batch 2: 20 samples, 2,560 tokens",
        "  shards/web (weight 0.9 → 0.2 by schedule): 11 of its 2,659 samples, 1,408 tokens, 0.00 epochs",
        "  shards/code (weight 0.1 → 0.8 by schedule): 9 of its 953 samples, 1,152 tokens, 0.01 epochs"]


def test_a_resume_with_another_global_batch_says_from_which_step(shards, monkeypatch):
    """A layout change that also changes the global batch (micro_batch_size 1 → 2) is not 'as before': the note
    says the old and new batch and the first step that trains on the new one."""
    monkeypatch.chdir(shards)
    saved = {"training": {"last_train_step": 10, "global_batch_size": 1},
             "config": {"parallelism": {"dp": 1},
                        "tokens": {"micro_batch_size": 1, "batch_accumulation_per_replica": 1}}}
    assert notes(make_config(train_steps=40, mbs=2), saved) == [
        "resuming ck/step-000010 in another layout (micro_batch_size 1 → 2): global batch 1 → 2 from step 11"]


def test_packing_that_truncates_long_documents_says_truncated(shards, monkeypatch):
    """drop_long_documents false keeps the first tokens of a long document: the note says truncated, and the share
    lost is that of the cut-off tails (2.8%), not of the long documents' tokens (37.6%, lost when dropped)."""
    monkeypatch.chdir(shards)
    packed = dict(STAGE, data={"packing": "documents", "drop_long_documents": False, "use_position_ids": True,
                               "dataset": {"dataset_folder": "shards/sft"}})
    from nanoset import open_dataset

    sft = open_dataset("shards/sft")
    lengths = [len(sft.document(i)) for i in range(sft.num_documents)]
    tails = sum(n - 25 for n in lengths if n > 25) / sum(lengths)  # the tokens past a sample's 25
    assert f"{100 * tails:.1f}" == "2.8"
    assert notes(make_config(train_steps=2, seq=24, stages=[packed])) == [
        "packing shards/sft at sequence length 24: 2.8% of its tokens are the tails cut off documents longer than 25 "
        "tokens (truncated); raise the stage's sequence_length to train on them"]


def packed_sft(seq: int, train_steps: int = 1):
    """shards/sft (72,002 tokens) packed at ``seq`` by a model with positions for it."""
    from tests.support.configs import TWO_STAGE

    stage = dict(STAGE, data={"packing": "documents", "use_position_ids": True,
                              "dataset": {"dataset_folder": "shards/sft"}})
    return make_config(train_steps=train_steps, seq=seq, stages=[stage],
                       model={**TWO_STAGE["model"], "max_position_embeddings": seq})


def test_packing_that_is_mostly_padding_says_so_with_a_shorter_length(shards, monkeypatch):
    """shards/sft at 65,536 packs into 2 samples holding 72,002 of 131,074 tokens: 45.1% padding, a note that says
    so and the longest power of two that pads under 12.5% (16,384: 5 samples, 12.1%); at 256 (5.4% padding)
    no note."""
    monkeypatch.chdir(shards)
    assert notes(packed_sft(65536)) == [
        "packing shards/sft at sequence length 65536: 45.1% of its samples' tokens are padding, computed but never "
        "learned from (2 samples of 65,537 tokens hold its 72,002); a stage sequence_length of 16384 would pad 12.1%"]
    assert notes(packed_sft(256)) == []


def test_the_check_report_and_the_stage_line_give_a_packed_datasets_padding(shards, monkeypatch):
    """nanoset train --check's line of a packed dataset and the trainer's stage line (the dataset's describe())
    say its padding share: 160 samples of 2 at 65,536 are 10,485,760 tokens, 45.1% of them padding."""
    from runtime.cli.launch import plan_report

    monkeypatch.chdir(shards)
    plan = DataPlan(packed_sft(65536, train_steps=80))
    assert plan_report(plan)[1] == ("  shards/sft (weight 1): 160 of its 2 samples, 10,485,760 tokens (45.1% of them "
                                    "padding), 80.00 epochs; repeats: epoch 80.00 by the stage's end")
    assert plan.datasets[0].describe() == ("shards/sft: 2 packed samples of whole documents (≤ 65537 tokens, 45.1% of "
                                           "them padding); 0 longer documents truncated")
