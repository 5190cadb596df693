"""Data order: DP sharding, elastic resumption, resume, stages, explain — exact sample identities."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from runtime.cli.explain import explain_step
from runtime.config import ConfigError
from runtime.config.load import load_config
from runtime.data import (
    DataPlan,
    StageDataset,
    TensorPointer,
    compute_remain_train_steps_of_a_data_stage_from_ckp,
    get_consumed_train_samples_of_a_data_stage_from_ckp,
    get_stage_for_step,
    training_metadata,
)
from tests.support import CONFIGS
from tests.support.configs import make_config
from tests.support.data import global_batches, stage_loader


@pytest.fixture(autouse=True)
def in_shards(shards, monkeypatch):
    monkeypatch.chdir(shards)


def one_stage(folders, weights=None, seq=None, name="s", start=1, positions=False):
    ds = {"dataset_folder": folders}
    if weights:
        ds["dataset_weights"] = weights
    st = {"name": name, "start_training_step": start, "data": {"dataset": ds, "use_position_ids": positions}}
    if seq:
        st["sequence_length"] = seq
    return st


def expected_tokens(plan, step):
    stage, loc = plan.global_batch(step)
    return np.stack([plan.datasets[d].tokens(np.array([s]))[0] for d, s in zip(loc.dataset, loc.sample)])


def test_loader_batches_equal_the_plan(in_shards):
    c = make_config(dp=2, accum=2, mbs=2, train_steps=12, stages=[one_stage(["shards/web", "shards/code"], [0.7, 0.3])])
    plan = DataPlan(c)
    got = global_batches(plan, plan.stages[0], 12)
    for t in range(12):
        np.testing.assert_array_equal(got[t], expected_tokens(plan, t + 1))


def test_dp_ranks_are_disjoint_and_cover_the_global_batch(in_shards):
    c = make_config(dp=4, accum=1, mbs=2, train_steps=5, stages=[one_stage(["shards/web", "shards/code"], [0.5, 0.5])])
    plan = DataPlan(c)
    stage = plan.stages[0]
    per_rank = [[b["input_ids"].numpy() for b in list(stage_loader(plan, stage, r, 4))[:5]] for r in range(4)]
    for t in range(5):
        rows = [per_rank[r][t] for r in range(4)]
        keys = [tuple(row) for r in rows for row in r]
        assert len(set(keys)) == 8  # disjoint
        np.testing.assert_array_equal(np.concatenate(rows), expected_tokens(plan, t + 1)[:, :-1])


def test_elastic_layouts_give_identical_global_batches(in_shards):
    stages = [one_stage(["shards/web", "shards/code"], [0.7, 0.3], seq=32)]
    runs = []
    for dp, accum in ((1, 4), (2, 2), (4, 1)):
        plan = DataPlan(make_config(dp=dp, accum=accum, mbs=2, train_steps=100, stages=stages))
        runs.append(global_batches(plan, plan.stages[0], 100))
    for t in range(100):
        np.testing.assert_array_equal(runs[0][t], runs[1][t])
        np.testing.assert_array_equal(runs[0][t], runs[2][t])


def test_resume_from_consumed_samples_equals_continuous(in_shards):
    c = make_config(dp=2, accum=2, mbs=2, train_steps=20, stages=[one_stage(["shards/web", "shards/code"], [0.7, 0.3])])
    plan = DataPlan(c)
    full = global_batches(plan, plan.stages[0], 20)
    resumed = global_batches(plan, plan.stages[0], 13, consumed=7 * c.global_batch_size)
    for t in range(13):
        np.testing.assert_array_equal(resumed[t], full[7 + t])
    with pytest.raises(ValueError, match="not a multiple of"):
        stage_loader(plan, plan.stages[0], 0, 2, consumed=3)


def test_locate_takes_a_scalar_or_an_array(in_shards):
    plan = DataPlan(make_config(stages=[one_stage(["shards/web", "shards/code"], [0.7, 0.3])]))
    stage = plan.stages[0]
    many = plan.locate(stage, np.arange(10))
    one = [plan.locate(stage, j) for j in range(10)]
    assert [(int(o.dataset), int(o.sample), int(o.epoch)) for o in one] == list(zip(
        many.dataset.tolist(), many.sample.tolist(), many.epoch.tolist()))
    assert plan.locate(stage, [[0, 1]]).sample.shape == (1, 2)


def test_loader_workers_give_the_same_batches(in_shards):
    c = make_config(dp=1, accum=1, mbs=4, train_steps=6, stages=[one_stage(["shards/web", "shards/code"], [0.7, 0.3],
                                                                             positions=True)])
    plan = DataPlan(c)
    a = global_batches(plan, plan.stages[0], 6, workers=0)
    b = global_batches(plan, plan.stages[0], 6, workers=2)
    for x, y in zip(a, b):
        np.testing.assert_array_equal(x, y)


def test_no_repeats_across_stages_sharing_a_dataset(in_shards):
    stages = [one_stage("shards/web", name="a", start=1), one_stage(["shards/web", "shards/code"], [0.5, 0.5], name="b",
                                                                     start=21)]
    plan = DataPlan(make_config(dp=2, accum=4, mbs=4, train_steps=40, stages=stages))  # G = 32
    web = plan.stages[0].dataset_ids[0]
    assert plan.stages[1].dataset_ids[0] == web  # the same dataset object: its draws continue
    assert plan.stages[1].draw_offsets.tolist() == [20 * 32, 0]
    seen = []
    for step in range(1, 41):
        _, loc = plan.global_batch(step)
        seen += [s for d, s in zip(loc.dataset, loc.sample) if d == web]
    n_web = plan.datasets[web].num_samples
    assert len(seen) == 20 * 32 + 20 * 16 < n_web and len(set(seen)) == len(seen)
    # past the end of the data, the next epoch starts and is a new order over the whole dataset
    _, loc = plan.global_batch(40)
    assert set(loc.epoch.tolist()) == {0}
    perm0, perm1 = plan.permutation(web, 0), plan.permutation(web, 1)
    assert sorted(perm1(np.arange(n_web)).tolist()) == list(range(n_web))
    assert not np.array_equal(perm0(np.arange(50)), perm1(np.arange(50)))


def test_epochs_continue_when_a_dataset_is_exhausted(in_shards):
    plan = DataPlan(make_config(dp=1, accum=1, mbs=8, train_steps=200, seq=256, stages=[one_stage("shards/sft")]))
    n = plan.datasets[0].num_samples  # 281 windows of 257 tokens
    draws = np.concatenate([plan.global_batch(t)[1].sample for t in range(1, 200)])
    epochs = np.concatenate([plan.global_batch(t)[1].epoch for t in range(1, 200)])
    for e in range(3):
        assert sorted(draws[epochs == e].tolist()) == list(range(n))
    assert not np.array_equal(draws[:n], draws[n : 2 * n])


def test_per_stage_sequence_length(in_shards):
    plan = DataPlan(load_config(CONFIGS / "two-stage.yaml"))
    anneal = plan.stages[1]
    assert anneal.sequence_length == 64 and anneal.start_step == 31
    batch = next(iter(stage_loader(plan, anneal, 0, 2)))
    assert batch["input_ids"].shape == (2, 64) and batch["label_ids"].dtype == torch.int64
    pre = next(iter(stage_loader(plan, plan.stages[0], 0, 2)))
    assert pre["input_ids"].shape == (2, 128) and pre["position_ids"].shape == (2, 128)
    assert pre["input_mask"].dtype == pre["label_mask"].dtype == torch.bool
    _, loc = plan.global_batch(31)
    assert {plan.datasets[d].folder for d in loc.dataset} == {"shards/sft"}


def test_label_mask_hides_the_first_token_of_a_new_document(in_shards):
    plan = DataPlan(load_config(CONFIGS / "two-stage.yaml"))
    b = next(iter(stage_loader(plan, plan.stages[0], 0, 1)))
    eos = plan.datasets[0].reader.tokenizer.eos_id
    pos, mask, inputs = b["position_ids"], b["label_mask"], b["input_ids"]
    assert (pos[:, 1:][inputs[:, :-1] == eos] == 0).all()  # after every EOS, positions restart
    np.testing.assert_array_equal(mask.numpy(), (inputs != eos).numpy())
    assert (~mask).sum() > 0


@pytest.mark.parametrize("pp", [1, 2, 4])
def test_tensor_pointer_placement(in_shards, pp):
    plan = DataPlan(load_config(CONFIGS / "two-stage.yaml"))
    stage = plan.stages[0]
    for rank in range(pp):
        loader = stage_loader(plan, stage, 0, 2, pp_rank=rank, pp=pp)
        b = next(iter(loader))
        for k in ("input_ids", "input_mask", "position_ids"):
            assert (b[k] == TensorPointer(0)) if rank != 0 else b[k].shape == (2, 128), (rank, k)
        for k in ("label_ids", "label_mask"):
            assert (b[k] == TensorPointer(pp - 1)) if rank != pp - 1 else b[k].shape == (2, 128), (rank, k)
        if rank not in (0, pp - 1):
            assert type(loader).__name__ == "TensorPointerLoader"
            assert len(loader) == len(stage_loader(plan, stage, 0, 2))


def test_explain_cli_matches_the_plan(in_shards):
    plan = DataPlan(load_config(CONFIGS / "two-stage.yaml"))
    proc = subprocess.run([sys.executable, "-m", "runtime.explain", "--config", str(CONFIGS / "two-stage.yaml"),
                           "--step", "31", "--json"], capture_output=True, text=True, check=True)
    rows = json.loads(proc.stdout)
    _, loc = plan.global_batch(31)
    assert [r["stage"] for r in rows] == ["anneal"] * 8 and [r["sample"] for r in rows] == loc.sample.tolist()
    assert [r["dataset"] for r in rows] == ["shards/sft"] * 8 and [r["epoch"] for r in rows] == [0] * 8
    r0 = rows[0]
    reader = plan.datasets[loc.dataset[0]].reader
    assert r0["tokens"] == [r0["sample"] * 64, r0["sample"] * 64 + 65]
    first, last = (int(np.searchsorted(reader.token_offsets, t, side="right")) - 1 for t in (r0["tokens"][0],
                                                                                              r0["tokens"][1] - 1))
    assert r0["shards"] == [reader.shards[i].name for i in range(first, last + 1)]
    assert r0["documents"] == reader.document_ids(*r0["tokens"]).tolist()
    assert any(len(r["shards"]) == 2 for s in range(1, 41) for r in explain_step(plan, s))  # windows cross shards
    assert rows == explain_step(plan, 31)
    text = subprocess.run([sys.executable, "-m", "runtime.explain", "--config", str(CONFIGS / "two-stage.yaml"),
                           "--step", "1"], capture_output=True, text=True, check=True).stdout
    assert text.startswith(f"step 1: stage 'pretrain', 8 samples, data_hash {plan.data_hash(1)}")
    bad = subprocess.run([sys.executable, "-m", "runtime.explain", "--config", str(CONFIGS / "two-stage.yaml"),
                          "--step", "41"], capture_output=True, text=True)
    assert bad.returncode == 1 and bad.stderr.strip() == "error: step 41 is outside [1, tokens.train_steps=40]"


def test_data_hash_is_layout_independent(in_shards):
    stages = [one_stage(["shards/web", "shards/code"], [0.7, 0.3])]
    a = DataPlan(make_config(dp=1, accum=4, train_steps=10, stages=stages))
    b = DataPlan(make_config(dp=4, accum=1, train_steps=10, stages=stages))
    assert [a.data_hash(t) for t in range(1, 11)] == [b.data_hash(t) for t in range(1, 11)]
    assert len({a.data_hash(t) for t in range(1, 11)}) == 10


def test_resume_helpers_mid_stage(in_shards):
    c = load_config(CONFIGS / "two-stage.yaml")
    plan = DataPlan(c)
    pre, anneal = c.data_stages
    assert get_stage_for_step(c, 30) is pre and get_stage_for_step(c, 31) is anneal
    for last, remain, consumed in ((0, (30, 10), (0, 0)), (12, (18, 10), (96, 0)), (30, (0, 10), (240, 0)),
                                   (35, (0, 5), (240, 40)), (40, (0, 0), (240, 80))):
        meta = training_metadata(plan, last)
        assert compute_remain_train_steps_of_a_data_stage_from_ckp(pre, c, meta) == remain[0]
        assert compute_remain_train_steps_of_a_data_stage_from_ckp(anneal, c, meta) == remain[1]
        assert get_consumed_train_samples_of_a_data_stage_from_ckp(pre, meta) == consumed[0]
        assert get_consumed_train_samples_of_a_data_stage_from_ckp(anneal, meta) == consumed[1]
    meta = training_metadata(plan, 35)
    assert meta.last_stage_idx == 1 and meta.consumed_train_samples == 280
    assert meta.draws_per_dataset == {f"{Path.cwd() / 'shards' / name}": n for name, n in (
        ("web@128", 168), ("code@128", 72), ("sft@64", 40))}


def test_stage_dataset_bounds(in_shards):
    plan = DataPlan(load_config(CONFIGS / "two-stage.yaml"))
    ds = StageDataset(plan, plan.stages[1])
    assert len(ds) == 80
    with pytest.raises(IndexError, match="outside"):
        ds[80]


def test_hf_dataset_stage_is_tokenized_once_into_a_cache(in_shards, tmp_path, tokenizer, eos_id):
    datasets = pytest.importorskip("datasets")
    from runtime.data.hf_datasets import resolve_stage_folders
    from tests.support import TOKENIZER

    texts = [f"question {i}: what is {i} plus {i}? answer: {2 * i}." for i in range(300)]
    datasets.DatasetDict({"train": datasets.Dataset.from_dict({"instruction": texts}),
                          "validation": datasets.Dataset.from_dict({"instruction": ["held out"]})}
                         ).save_to_disk(str(tmp_path / "hf"))
    stage = {"name": "sft", "start_training_step": 1, "data": {"dataset": {
        "hf_dataset_or_datasets": str(tmp_path / "hf"), "hf_dataset_splits": "train",
        "text_column_name": "instruction"}}}
    c = make_config(train_steps=4, seq=32, stages=[stage], tokenizer={"tokenizer_name_or_path": str(TOKENIZER)})
    c.general.cache_dir = str(tmp_path / "cache")
    folders = resolve_stage_folders(c)
    plan = DataPlan(c, folders)
    reader = plan.datasets[0].reader
    expected = [tokenizer.encode(t).ids + [eos_id] for t in texts]
    assert reader.num_documents == 300 and reader.document(7).tolist() == expected[7]
    manifest = next((tmp_path / "cache").glob("hf-*")) / "nanoset.json"
    mtime = manifest.stat().st_mtime_ns
    assert resolve_stage_folders(c) == folders and manifest.stat().st_mtime_ns == mtime  # reused, not rebuilt


def test_one_folder_under_two_spellings_is_one_dataset(in_shards, tmp_path):
    """One folder under two spellings is one dataset: compared by resolved path in the plan, the fingerprint and
    across stages."""
    link = tmp_path / "web-link"
    link.symlink_to(Path.cwd() / "shards" / "web")
    with pytest.raises(ConfigError) as e:
        DataPlan(make_config(stages=[one_stage(["shards/web", str(link)])]))
    assert str(e.value) == (f"data_stages[0] (s).data.dataset.dataset_folder: 'shards/web' and '{link}' are the same "
                            f"dataset ({Path.cwd() / 'shards' / 'web'}); list it once and merge the weights")
    relative = DataPlan(make_config(stages=[one_stage(["shards/web", "shards/code"], [0.7, 0.3])]))
    absolute = DataPlan(make_config(stages=[one_stage([str(Path.cwd() / "shards/web"), "./shards/code"], [0.7, 0.3])]))
    assert relative.fingerprint == absolute.fingerprint
    assert [relative.data_hash(t) for t in (1, 2, 40)] == [absolute.data_hash(t) for t in (1, 2, 40)]
    two = DataPlan(make_config(dp=1, mbs=4, train_steps=20, stages=[
        one_stage("shards/web", name="a"), one_stage(str(link), name="b", start=11)]))
    assert len(two.datasets) == 1 and two.stages[1].dataset_ids == two.stages[0].dataset_ids
    assert two.stages[1].draw_offsets.tolist() == [40]  # stage b continues where stage a left the folder
    drawn = [s for t in range(1, 21) for s in two.global_batch(t)[1].sample.tolist()]
    assert len(set(drawn)) == 80


def test_a_later_stage_reading_a_copy_of_a_dataset_continues_its_draws(in_shards, tmp_path):
    """A dataset is its content: a later stage naming a copy of an earlier stage's dataset (another folder, the same
    fingerprint) continues its draws as if it named the folder itself, instead of reading the same samples again."""
    import shutil

    copy = tmp_path / "web-copy"
    shutil.copytree(Path.cwd() / "shards" / "web", copy)
    plans = [DataPlan(make_config(dp=1, mbs=4, train_steps=8, seq=16, stages=[
        one_stage(["shards/web", "shards/code"], [0.5, 0.5], name="a"), one_stage(later, name="b", start=5)]))
        for later in ("shards/web", str(copy))]
    same, copied = ([p.data_hash(s) for s in range(1, 9)] for p in plans)
    assert copied == same
    plan = plans[1]
    assert plan.stages[1].dataset_ids == plan.stages[0].dataset_ids[:1] and plan.stages[1].draw_offsets.tolist() == [8]
    locs = [plan.global_batch(step)[1] for step in range(1, 9)]
    web = [s for loc in locs for d, s in zip(loc.dataset.tolist(), loc.sample.tolist()) if d == 0]
    assert len(web) == 8 + 16 == len(set(web))  # nothing read twice
    assert plan.datasets_named(str(copy)) == plan.datasets_named("shards/web") == [0]
    alone = DataPlan(make_config(dp=1, mbs=4, train_steps=8, seq=16, stages=[one_stage("shards/web")]))
    assert alone.datasets_named(str(copy)) == [0]  # a copy not listed at all: what a surgery naming it excises


def test_a_copy_of_a_dataset_listed_next_to_it_is_refused(in_shards, tmp_path):
    """A copy has the same fingerprint, hence the same sample order: blended with its original, every
    sample would come twice (the same dataset through a copy instead of a second spelling)."""
    import shutil

    copy = tmp_path / "web-copy"
    shutil.copytree(Path.cwd() / "shards" / "web", copy)
    with pytest.raises(ConfigError) as e:
        DataPlan(make_config(stages=[one_stage(["shards/web", str(copy)])]))
    fingerprint = DataPlan(make_config(stages=[one_stage("shards/web")])).datasets[0].reader.fingerprint
    assert str(e.value) == (f"data_stages[0] (s).data.dataset.dataset_folder: 'shards/web' and '{copy}' hold the same "
                            f"data (fingerprint {fingerprint}), so every sample would be read twice; list one of them "
                            f"and merge the weights")
