"""Context parallelism (``parallelism.cp``): the sequence sharding, the one mask definition on both kernels,
the config rules, and whole runs as a user launches them (torchrun, gloo, CPU) in every layout cp composes
with, resumed at another cp, with validation."""

from __future__ import annotations

import warnings

import pytest
import torch

from runtime.config import ConfigError
from runtime.config.load import config_from_data
from runtime.models.document_attention import document_ids, sequence_mask
from runtime.parallel.context_parallel import chunk_positions
from tests.support import ROOT, one_line_error
from tests.support.configs import TINY, long_context_config, merged
from tests.support.harness import metrics, torchrun, train_one

# ---------------------------------------------------------------- sharding and masks ---------------


def test_head_tail_chunks():
    """L = 16, cp = 2: chunks of 4, rank 0 holds chunks 0 and 3, rank 1 chunks 1 and 2; cp = 4: chunks of 2."""
    assert chunk_positions(16, 2, 0).tolist() == [0, 1, 2, 3, 12, 13, 14, 15]
    assert chunk_positions(16, 2, 1).tolist() == [4, 5, 6, 7, 8, 9, 10, 11]
    assert [chunk_positions(16, 4, r).tolist() for r in range(4)] == [
        [0, 1, 14, 15], [2, 3, 12, 13], [4, 5, 10, 11], [6, 7, 8, 9]]
    # every token exactly once, and the causal work (keys a rank's queries may see) is the same on every rank
    for cp in (2, 4, 8):
        held = torch.cat([chunk_positions(64, cp, r) for r in range(cp)])
        assert sorted(held.tolist()) == list(range(64))
        work = {int((chunk_positions(64, cp, r) + 1).sum()) for r in range(cp)}
        assert len(work) == 1, (cp, work)
    with pytest.raises(ValueError, match="sequence length 18 is not divisible by 2 × cp = 4"):
        chunk_positions(18, 2, 0)


def packed_positions(length: int, generator: torch.Generator, rows: int = 2) -> torch.Tensor:
    """Position ids of rows packed with documents of 1-20 tokens."""
    pos = torch.empty(rows, length, dtype=torch.int64)
    for r in range(rows):
        i = 0
        while i < length:
            n = min(int(torch.randint(1, 21, (), generator=generator)), length - i)
            pos[r, i : i + n] = torch.arange(n)
            i += n
    return pos


@pytest.mark.parametrize("cp", [2, 4])
@pytest.mark.parametrize("attention", ["causal", "document"])
def test_the_mask_drives_flex_and_sdpa_alike_for_every_cp_rank(cp, attention):
    """One process plays every cp rank: its queries (head and tail chunks) against the keys of all ranks in
    the gather's order, masked by global positions (and document ids). flex_attention's forward (torch runs
    it on CPU, uncompiled) and SDPA with the boolean mask both equal full attention over the whole sequence
    at those queries."""
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    g = torch.Generator().manual_seed(5)
    length, heads, dim = 64, 2, 16
    q, k, v = (torch.randn(2, heads, length, dim, generator=g) for _ in range(3))
    pos = packed_positions(length, g)
    doc = document_ids(pos) if attention == "document" else None
    # the whole sequence's mask, written out: earlier or same token, and (document) the same document
    allowed = torch.ones(length, length, dtype=torch.bool).tril().expand(2, -1, -1)
    if doc is not None:
        allowed = allowed & (doc[:, :, None] == doc[:, None, :])
    full = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=allowed[:, None])
    kv_pos = torch.cat([chunk_positions(length, cp, r) for r in range(cp)])
    for rank in range(cp):
        q_pos = chunk_positions(length, cp, rank)
        q_doc, kv_doc = (None, None) if doc is None else (doc[:, q_pos], doc[:, kv_pos])
        dense = sequence_mask(q_pos, kv_pos, q_doc, kv_doc, flex=False)
        assert dense.shape == ((1 if doc is None else 2), 1, length // cp, length)
        assert torch.equal(dense[:, 0].expand(2, -1, -1), allowed[:, q_pos][:, :, kv_pos])
        sdpa = torch.nn.functional.scaled_dot_product_attention(q[:, :, q_pos], k[:, :, kv_pos], v[:, :, kv_pos],
                                                                attn_mask=dense)
        block = sequence_mask(q_pos, kv_pos, q_doc, kv_doc, flex=True, create_block_mask=create_block_mask)
        with warnings.catch_warnings():  # uncompiled flex: torch's reference path, said once
            warnings.simplefilter("ignore", UserWarning)
            flex = flex_attention(q[:, :, q_pos], k[:, :, kv_pos], v[:, :, kv_pos], block_mask=block)
        torch.testing.assert_close(sdpa, full[:, :, q_pos], atol=1e-6, rtol=0)
        torch.testing.assert_close(flex, full[:, :, q_pos], atol=1e-6, rtol=0)


# ---------------------------------------------------------------- config ---------------------------


def cp_config(cp: int, sequence_length: int = 16, stage_lengths: tuple[int | None, ...] = (None,)):
    """The tiny model with ``cp`` and a stage per entry of ``stage_lengths`` (None: tokens.sequence_length)."""
    d = merged(TINY, parallelism={"cp": cp}, tokens={"sequence_length": sequence_length})
    d["data_stages"] = [{"name": f"s{i}", "start_training_step": 1 + i, "data": {"dataset": {"dataset_folder": "x"}},
                         **({} if n is None else {"sequence_length": n})} for i, n in enumerate(stage_lengths)]
    return config_from_data(d)


def test_every_stage_length_must_split_into_two_chunks_per_cp_rank():
    config = cp_config(2)
    assert config.parallelism.world_size == 2 and config.global_batch_size == 8  # cp adds no samples
    assert config.parallelism.describe() == "tp 1 × cp 2 × pp 1 × dp 1 = 2 processes"
    assert cp_config(1).parallelism.describe() == "tp 1 × pp 1 × dp 1 = 1 processes"
    assert cp_config(4, 20, (8, 64)).to_dict()["parallelism"]["cp"] == 4  # only the stages' lengths count
    with pytest.raises(ConfigError) as e:
        cp_config(4, 20)  # 20 = 4 × 5: not two chunks per rank
    assert str(e.value) == (
        "tokens.sequence_length (of data_stages[0] (s0)) 20 is not divisible by 2 × parallelism.cp = 8: context "
        "parallelism cuts each sample into 2·cp chunks, two per cp rank; use a multiple of 8 or another cp")
    with pytest.raises(ConfigError, match=r"^data_stages\[1\] \(s1\)\.sequence_length 60 is not divisible by 2 × "
                                          r"parallelism\.cp = 8: "):
        cp_config(4, 16, (None, 60))  # the later, longer stage
    with pytest.raises(ConfigError, match=r"^parallelism\.cp: must be > 0, got 0$"):
        cp_config(0)


def test_metrics_count_each_token_once_and_mfu_divides_by_every_gpu():
    from runtime.observe.metrics import flops_per_token, model_flops_utilization, tokens_per_second

    one, cp2 = cp_config(1), cp_config(2)
    assert tokens_per_second(cp2, 16, 2.0) == tokens_per_second(one, 16, 2.0) == 8 * 16 / 2.0
    peak = 100e12
    mfu_one, mfu_cp2 = (model_flops_utilization(1000.0, c, 16, peak) for c in (one, cp2))
    assert mfu_one == 1000.0 * flops_per_token(one.model, 16) / peak
    assert mfu_cp2 == pytest.approx(mfu_one / 2, rel=1e-12)  # the same tokens/s from two GPUs
    assert model_flops_utilization(1000.0, cp2, 16, None) is None  # no known peak (CPU)


def test_a_bad_length_for_cp_is_one_line_before_start_up(shards, tmp_path):
    """The long-context stage at 130 tokens with cp 2 (not a multiple of 4): one line, nothing started."""
    cfg = long_context_config(tmp_path, tmp_path / "run", {"cp": 2}, model={"max_position_embeddings": 256})
    cfg.write_text(cfg.read_text().replace("sequence_length: 128", "sequence_length: 130"))
    proc = train_one(cfg, shards, check=False)
    one_line_error(proc, "data_stages[1] (long-context).sequence_length 130 is not divisible by 2 × parallelism.cp "
                         "= 4")
    assert not (tmp_path / "run").exists()


# ---------------------------------------------------------------- whole runs -----------------------


def train_rows(rows):
    return [r for r in rows if "val" not in r]


def val_rows(rows):
    return [r for r in rows if "val" in r]


def assert_same_run(rows, ref_rows):
    """The same steps, stages and samples (data_hash), label tokens counted once, losses to float rounding;
    the same validation rows (steps, tokens, loss)."""
    got, ref = train_rows(rows), train_rows(ref_rows)
    for key in ("step", "stage", "data_hash", "label_tokens"):
        assert [r[key] for r in got] == [r[key] for r in ref], key
    assert [r["loss"] for r in got] == pytest.approx([r["loss"] for r in ref], abs=1e-5, rel=0)
    got, ref = val_rows(rows), val_rows(ref_rows)
    assert [(r["step"], r["stage"], r["val"]["web"]["tokens"]) for r in got] == [
        (r["step"], r["stage"], r["val"]["web"]["tokens"]) for r in ref]
    assert [r["val"]["web"]["loss"] for r in got] == pytest.approx([r["val"]["web"]["loss"] for r in ref],
                                                                   abs=1e-5, rel=0)


@pytest.fixture(scope="module")
def reference(shards, tmp_path_factory):
    """One process, cp 1: 3 steps at seq 32, then 3 at seq 128; validation at both stage ends."""
    folder = tmp_path_factory.mktemp("cp-ref")
    run = folder / "run"
    train_one(long_context_config(folder, run, {"cp": 1}), shards)
    rows = metrics(run)
    assert [(r["step"], r["stage"]) for r in val_rows(rows)] == [(3, "pretrain"), (6, "long-context")]
    assert [r["step"] for r in train_rows(rows)] == [1, 2, 3, 4, 5, 6]
    return run, rows


@pytest.fixture(scope="module")
def cp2_run(shards, tmp_path_factory):
    folder = tmp_path_factory.mktemp("cp2")
    run = folder / "run"
    proc = torchrun(long_context_config(folder, run, {"cp": 2}), 2, cwd=shards)
    return run, metrics(run), proc.stdout


def test_cp2_run_equals_one_process(reference, cp2_run):
    run, rows, stdout = cp2_run
    assert_same_run(rows, reference[1])
    assert "stage 'long-context' at step 4 (steps 4-6): datasets web: shards/web (0.7), code: shards/code (0.3), " \
           "sequence length 128" in stdout
    assert train_rows(rows)[2]["loss"] < train_rows(rows)[0]["loss"]


@pytest.mark.parametrize("name,nproc,layout,accum", [
    ("cp2-tp2", 4, {"cp": 2, "tp": 2}, 2),
    ("cp2-pp2", 4, {"cp": 2, "pp": 2, "pp_engine": "1f1b"}, 2),
    ("cp2-dp2", 4, {"cp": 2, "dp": 2}, 1),  # the same global batch of 4 samples
])
def test_cp2_composes_with_every_layout(reference, shards, tmp_path, name, nproc, layout, accum):
    """One rank of each replica's cp × tp group reads and broadcasts the full-length batches; middle
    pipeline ranks read nothing; the loss and validation are the same as one process's."""
    run = tmp_path / "run"
    torchrun(long_context_config(tmp_path, run, layout, accum=accum), nproc, cwd=shards)
    assert_same_run(metrics(run), reference[1])


def test_a_cp2_checkpoint_resumes_at_cp1_and_back(reference, cp2_run, shards, tmp_path):
    """DCP reshards the weights and AdamW state (FSDP over dp × cp) to the other layout; the data order does
    not depend on cp, so steps 4-6 are those of the uninterrupted run."""
    ref_rows = reference[1]
    later = [r for r in ref_rows if r["step"] > 3]
    for cp, nproc, source in ((1, 1, cp2_run[0]), (2, 2, reference[0])):
        run = tmp_path / f"at-cp{cp}"
        checkpoint = source / "checkpoints" / "step-000003"
        cfg = long_context_config(tmp_path, run, {"cp": cp}, name=f"cp{cp}.yaml",
                                  checkpoints={"resume": str(checkpoint)})
        proc = train_one(cfg, shards) if nproc == 1 else torchrun(cfg, nproc, cwd=shards)
        assert f"resumed from {checkpoint} at step 3" in proc.stdout
        assert f"note: resuming {checkpoint} in another layout (cp {3 - cp} → {cp}): global batch 4 as before" in \
            proc.stdout
        assert_same_run(metrics(run), later)


# ---------------------------------------------------------------- custom loaders -------------------

CUSTOM_LOADER_SCRIPT = '''
import os
import sys
sys.path.insert(0, {root!r})
from torch.utils.data import DataLoader, DistributedSampler
from nanoset.errors import print_error, report_user_errors
from runtime.data import StageDataset, get_sampler
from runtime.data.loading.collator import DataCollatorForCLMWithPositionIds
from runtime.trainer import Trainer

trainer = Trainer(sys.argv[sys.argv.index("--config") + 1])
ctx, cfg = trainer.parallel_context, trainer.config
mbs = cfg.tokens.micro_batch_size


def factory(stage):
    def loader(consumed_train_samples):
        ds = StageDataset(trainer.plan, stage)
        if os.environ["SHARD_BY"] == "world":  # torch's idiom: each process its share of the samples
            sampler = DistributedSampler(ds, shuffle=False)
        else:  # the batch contract's: each replica its share
            sampler = get_sampler(ds, dl_rank=ctx.dp_rank, dl_ranks_size=ctx.dp_size, micro_batch_size=mbs,
                                  consumed_train_samples=consumed_train_samples)
        collate = DataCollatorForCLMWithPositionIds(stage.sequence_length, 0, ctx.pp_size - 1, ctx)
        return DataLoader(ds, batch_size=mbs, sampler=sampler, collate_fn=collate)
    return loader


try:
    sys.exit(report_user_errors(
        lambda: trainer.train(dataloader_or_dls={{s.name: factory(s) for s in trainer.plan.stages}}).exit_status,
        report=lambda message: trainer.is_main and print_error(message)))
finally:
    trainer.close()
'''


def custom_loader_run(tmp_path, shards, shard_by: str):
    script = tmp_path / "custom.py"
    script.write_text(CUSTOM_LOADER_SCRIPT.format(root=str(ROOT)))
    run = tmp_path / "run"
    proc = torchrun(long_context_config(tmp_path, run, {"cp": 2}), 2, cwd=shards, script=script,
                    env={"SHARD_BY": shard_by}, check=False)
    return run, proc


def test_a_custom_loader_of_the_replica_trains_at_cp2_like_one_process(reference, shards, tmp_path):
    """A custom loader runs on both cp ranks and gives each the replica's full-length batches: the run is the
    config's (the same losses, label tokens and validation; no data_hash, the data order is the loader's)."""
    run, proc = custom_loader_run(tmp_path, shards, "replica")
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows, ref = metrics(run), reference[1]
    assert [(r["step"], r["stage"], r["label_tokens"], r["data_hash"]) for r in train_rows(rows)] == [
        (r["step"], r["stage"], r["label_tokens"], None) for r in train_rows(ref)]
    assert [r["loss"] for r in train_rows(rows)] == pytest.approx([r["loss"] for r in train_rows(ref)], abs=1e-5,
                                                                  rel=0)
    assert [r["val"]["web"]["loss"] for r in val_rows(rows)] == pytest.approx(
        [r["val"]["web"]["loss"] for r in val_rows(ref)], abs=1e-5, rel=0)


def test_a_custom_loader_that_gives_cp_ranks_other_samples_is_one_line(shards, tmp_path):
    """torch's DistributedSampler shards by the world rank: cp rank 1 would get other samples than cp rank 0
    and attention would mix the keys of both (a silently wrong step). Refused before the first step."""
    from tests.support.harness import error_lines

    run, proc = custom_loader_run(tmp_path, shards, "world")
    assert proc.returncode != 0
    assert error_lines(proc.stderr) == [
        "error: stage 'pretrain' step 1: the data loader gave cp rank 1, tp rank 0 of replica 0 other micro-batches "
        "than cp rank 0, tp rank 0: every cp and tp rank of a replica needs the replica's full-length batches; "
        "shard a custom loader by ctx.dp_rank and ctx.dp_size, not by the process's rank as torch's "
        "DistributedSampler does (see docs/parallelism.md)"]
    assert not (run / "metrics.jsonl").exists() or not train_rows(metrics(run))  # no step trained
