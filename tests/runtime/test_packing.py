"""Label masks from loss masks (``NAME.ds.loss``) and whole-document packing (``data.packing: documents``)."""

from __future__ import annotations

import math
import os

import numpy as np
import pytest

from nanoset import ShardWriter, open_dataset
from runtime.data.loading.collator import DataCollatorForCLMWithPositionIds
from runtime.data.order import packing as packing_module
from runtime.data.order.packing import PackedDocuments, pack_documents
from runtime.data.order.windows import TokenWindows
from tests.support import assert_one_cache_note


def write_folder(path, shards: list[list[list[int]]], losses: list[list[list[int]]] | None = None):
    """A datatrove-layout folder (no manifest) of ``shards`` (documents of token ids), with a
    ``.ds.loss`` file of one byte per token per shard when ``losses`` is given; returns the reader."""
    path.mkdir(parents=True, exist_ok=True)
    for i, docs in enumerate(shards):
        with ShardWriter(path, f"s{i}", np.uint16, "toy") as w:
            for d in docs:
                w.add_document(d)
            w.finalize()
        if losses is not None:
            (path / f"s{i}.ds.loss").write_bytes(bytes(b for doc in losses[i] for b in doc))
    return open_dataset(path)


# five documents, lengths 3, 5, 2 | 4, 6 over two shards; loss 1 on the "answer" tokens
DOCS = [[[11, 12, 1], [21, 22, 23, 24, 1], [31, 1]], [[41, 42, 43, 1], [51, 52, 53, 54, 55, 1]]]
LOSS = [[[0, 1, 1], [0, 0, 1, 1, 1], [0, 1]], [[1, 0, 1, 1], [0, 1, 1, 0, 1, 1]]]  # 41: loss 1 at a document start
STREAM = [t for s in DOCS for d in s for t in d]
LOSS_STREAM = [b for s in LOSS for d in s for b in d]


def reference_next_fit(lengths: list[int], capacity: int) -> list[int]:
    first, fill = [0], 0
    for i, n in enumerate(lengths):
        n = min(n, capacity)
        if fill + n > capacity:
            first.append(i)
            fill = 0
        fill += n
    return first + [len(lengths)] if lengths else [0]


def test_pack_documents_exact_bins():
    assert pack_documents(np.array([3, 5, 2, 4, 6]), 8).tolist() == [0, 2, 4, 5]  # [3,5] [2,4] [6]
    assert pack_documents(np.array([3, 12, 2, 2]), 8).tolist() == [0, 1, 2, 4]  # the long one alone
    assert pack_documents(np.array([8, 8, 1]), 8).tolist() == [0, 1, 2, 3]
    assert pack_documents(np.array([], dtype=np.int64), 8).tolist() == [0]


def test_pack_documents_never_splits_and_is_next_fit():
    rng = np.random.default_rng(0)
    for _ in range(200):
        lengths = rng.integers(1, 30, int(rng.integers(1, 60)))
        capacity = int(rng.integers(1, 40))
        first = pack_documents(lengths, capacity)
        assert first.tolist() == reference_next_fit(lengths.tolist(), capacity)
        sums = np.add.reduceat(np.minimum(lengths, capacity), first[:-1])
        assert (sums <= capacity).all()  # every bin fits; documents are whole by construction (bins are doc ranges)
        assert np.array_equal(first, pack_documents(lengths, capacity))  # deterministic


def test_pack_documents_runs_in_log_rounds_of_whole_arrays(monkeypatch):
    """No loop per document or per bin: each round is one vectorised pass, and the rounds double the
    known chain of bins, so 200 000 documents in ~60 000 bins take ≤ 17 rounds."""
    rounds = []
    real = np.concatenate
    monkeypatch.setattr(packing_module.np, "concatenate",
                        lambda arrays, *a, **k: rounds.append(1) or real(arrays, *a, **k))
    lengths = np.random.default_rng(1).integers(1, 200, 200_000)
    first = pack_documents(lengths, 333)
    bins = len(first) - 1
    assert first.tolist() == reference_next_fit(lengths.tolist(), 333)
    assert len(rounds) <= math.ceil(math.log2(bins)) + 1, (len(rounds), bins)


def test_window_label_mask_is_the_loss_mask_of_each_target(tmp_path):
    reader = write_folder(tmp_path / "chat", DOCS, LOSS)
    assert reader.has_loss_masks
    w = TokenWindows(tmp_path / "chat", 4, reader)
    assert w.has_label_mask
    masks = w.label_mask(np.arange(w.num_samples))
    for i in range(w.num_samples):  # label j of window i predicts stream token 4i + j + 1
        assert masks[i].tolist() == [bool(b) for b in LOSS_STREAM[4 * i + 1 : 4 * i + 5]]
    plain = TokenWindows(tmp_path / "plain", 4, write_folder(tmp_path / "plain", DOCS))
    assert not plain.has_label_mask and plain.label_mask(np.arange(2)) is None


def test_collator_ands_loss_masks_with_document_boundaries(tmp_path):
    reader = write_folder(tmp_path / "chat", DOCS, LOSS)
    w = TokenWindows(tmp_path / "chat", 8, reader)
    examples = [{"input_ids": w.tokens(i), "position_ids": w.position_ids(i), "label_mask": w.label_mask(i)}
                for i in range(2)]
    batch = DataCollatorForCLMWithPositionIds(8)(examples)
    # targets are stream tokens 1..8 and 9..16; tokens 3, 8, 10 and 14 start documents
    assert batch["label_mask"].int().tolist() == [
        [1, 1, 0, 0, 1, 1, 1, 0],  # loss of 12 1 | 21 22 23 24 1 | 31
        [1, 0, 0, 1, 1, 0, 1, 1],  # loss of 1 | 41 42 43 1 | 51 52 53: 41 has loss 1 but starts a document
    ]
    assert w.label_mask(1).astype(int).tolist() == [1, 1, 0, 1, 1, 0, 1, 1]  # the loss mask alone


def packed(tmp_path, L, drop=False, losses=True, cache=True):
    reader = write_folder(tmp_path / "chat", DOCS, LOSS if losses else None)
    return PackedDocuments(tmp_path / "chat", L, reader, tmp_path / "cache" if cache else None, drop)


def test_packed_samples_hold_whole_documents_padded(tmp_path):
    p = packed(tmp_path, 7)  # L + 1 = 8 tokens: [3, 5] [2, 4] [6]
    assert p.num_samples == 3 and p.num_long_documents == 0
    assert [p.token_range(i) for i in range(3)] == [(0, 8), (8, 14), (14, 20)]
    assert p.tokens(np.arange(3)).tolist() == [
        [11, 12, 1, 21, 22, 23, 24, 1],
        [31, 1, 41, 42, 43, 1, 0, 0],  # padded with the pad id (0: a datatrove folder records no EOS)
        [51, 52, 53, 54, 55, 1, 0, 0],
    ]
    assert p.position_ids(np.arange(3)).tolist() == [
        [0, 1, 2, 0, 1, 2, 3, 4],
        [0, 1, 0, 1, 2, 3, 0, 0],  # every padding token is a position-0 document of its own
        [0, 1, 2, 3, 4, 5, 0, 0],
    ]
    # labels: the target's loss bit, never a document start, never padding
    assert p.label_mask(np.arange(3)).astype(int).tolist() == [
        [1, 1, 0, 0, 1, 1, 1],
        [1, 0, 0, 1, 1, 0, 0],
        [1, 1, 0, 1, 1, 0, 0],
    ]
    no_loss = packed(tmp_path / "plain", 7, losses=False)
    assert no_loss.label_mask(1).astype(int).tolist() == [1, 0, 1, 1, 1, 0, 0]


def test_long_documents_are_truncated_or_dropped_and_counted(tmp_path):
    p = packed(tmp_path, 3)  # 4 tokens: documents of 5 and 6 tokens are too long
    assert p.num_long_documents == 2
    assert [p.token_range(i) for i in range(p.num_samples)] == [(0, 3), (3, 7), (8, 10), (10, 14), (14, 18)]
    assert p.tokens(1).tolist() == [21, 22, 23, 24]  # truncated to L + 1, alone in its sample
    assert p.label_mask(1).astype(int).tolist() == [0, 1, 1]
    d = packed(tmp_path / "d", 3, drop=True)
    assert d.num_long_documents == 2
    assert [d.token_range(i) for i in range(d.num_samples)] == [(0, 3), (8, 10), (10, 14)]
    assert d.mode == "documents-drop" and p.mode == "documents-truncate"


def test_packing_is_cached_by_fingerprint_and_length(tmp_path, monkeypatch):
    p = packed(tmp_path, 7)
    [name] = [f.name for f in (tmp_path / "cache" / "packing").iterdir()]
    assert name.startswith(f"v1-{p.reader.fingerprint}-") and name.endswith("-8-truncate.npy")
    with monkeypatch.context() as m:
        m.setattr(packing_module, "packing_table", lambda *a: pytest.fail("computed again"))
        again = PackedDocuments(tmp_path / "chat", 7, p.reader, tmp_path / "cache")
    assert again.starts.tolist() == p.starts.tolist() and again.stops.tolist() == p.stops.tolist()
    # a datatrove index rewritten with the same size (its fingerprint is names and sizes) is packed anew
    index = tmp_path / "chat" / "s0.ds.index"
    (tmp_path / "new.index").write_bytes(np.array([1, 4, 10], dtype="<u8").tobytes())  # documents 1, 3, 6
    (tmp_path / "new.index").replace(index)
    reader = open_dataset(tmp_path / "chat")
    assert reader.fingerprint == p.reader.fingerprint
    fresh = PackedDocuments(tmp_path / "chat", 7, reader, tmp_path / "cache")
    assert [fresh.token_range(i) for i in range(fresh.num_samples)] == [(0, 4), (4, 10), (10, 14), (14, 20)]


def test_an_index_rewritten_in_place_with_its_mtime_kept_is_packed_anew(tmp_path):
    """Same size, same inode, same mtime (as `cp -p` over the file leaves it): only the status-change time
    tells the index changed, and the packing cache must not serve the old table."""
    p = packed(tmp_path, 7)
    index = tmp_path / "chat" / "s0.ds.index"
    st = index.stat()
    index.write_bytes(np.array([1, 4, 10], dtype="<u8").tobytes())  # documents 1, 3, 6, written in place
    os.utime(index, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert (index.stat().st_size, index.stat().st_ino, index.stat().st_mtime_ns) == (st.st_size, st.st_ino,
                                                                                      st.st_mtime_ns)
    fresh = PackedDocuments(tmp_path / "chat", 7, open_dataset(tmp_path / "chat"), tmp_path / "cache")
    assert [p.token_range(i) for i in range(p.num_samples)] == [(0, 8), (8, 14), (14, 20)]
    assert [fresh.token_range(i) for i in range(fresh.num_samples)] == [(0, 4), (4, 10), (10, 14), (14, 20)]


def test_an_unwritable_cache_is_one_note_and_packing_again_at_the_next_start(tmp_path, capsys, monkeypatch):
    """It was a config error: a packing that cannot be kept costs only its computation at the next start."""
    (tmp_path / "file").write_text("not a folder")
    reader = write_folder(tmp_path / "chat", DOCS)
    real, calls = packing_module.packing_table, []
    monkeypatch.setattr(packing_module, "packing_table", lambda *a: calls.append(1) or real(*a))
    name = rf"v1-{reader.fingerprint}-[0-9a-f]{{8}}-8-truncate\.npy"
    for run in range(2):  # the run goes on; the next start packs again, and the note is said once a process
        p = PackedDocuments(tmp_path / "chat", 7, reader, tmp_path / "file")
        assert [p.token_range(i) for i in range(p.num_samples)] == [(0, 8), (8, 14), (14, 20)] and len(calls) == run + 1
        if run == 0:
            assert_one_cache_note(capsys.readouterr().err, tmp_path / "file", "packing", name)
    assert capsys.readouterr().err == ""
    (tmp_path / "file").unlink()  # writable again: packed, written, then read back
    PackedDocuments(tmp_path / "chat", 7, reader, tmp_path / "file")
    (entry,) = (tmp_path / "file" / "packing").iterdir()
    again = PackedDocuments(tmp_path / "chat", 7, reader, tmp_path / "file")
    assert [again.token_range(i) for i in range(again.num_samples)] == [(0, 8), (8, 14), (14, 20)] and len(calls) == 3
    entry.write_bytes(entry.read_bytes()[:-8])  # damaged (truncated): packed again and replaced
    fixed = PackedDocuments(tmp_path / "chat", 7, reader, tmp_path / "file")
    assert [fixed.token_range(i) for i in range(fixed.num_samples)] == [(0, 8), (8, 14), (14, 20)] and len(calls) == 4
    assert np.load(entry).tolist() == [[0, 5], [0, 8], [8, 14], [14, 20]] and capsys.readouterr().err == ""


def chat_config(tmp_path, packing="documents", seq=7, steps=3, **data):
    """A one-stage config over the hand-made chat folder (G = 2 samples per step)."""
    from tests.support.configs import make_config

    general = {"project": "t", "run": "p", "seed": 5, "run_dir": str(tmp_path / "run"),
               "cache_dir": str(tmp_path / "cache")}
    stage = {"name": "sft", "start_training_step": 1,
             "data": {"use_position_ids": True, "packing": packing, "num_loading_workers": 0,
                      "dataset": {"dataset_folder": str(tmp_path / "chat")}, **data}}
    return make_config(dp=1, accum=1, mbs=2, train_steps=steps, stages=[stage], seq=seq, general=general)


def test_stage_samples_are_packed_samples_with_their_label_masks(tmp_path):
    from runtime.cli.explain import explain_step
    from runtime.data import DataPlan
    from tests.support.data import stage_loader

    write_folder(tmp_path / "chat", DOCS, LOSS)
    plan = DataPlan(chat_config(tmp_path))
    stage = plan.stages[0]
    p = plan.datasets[0]
    assert isinstance(p, PackedDocuments) and p.num_samples == 3
    batches = list(stage_loader(plan, stage, 0, 1))
    for step, batch in enumerate(batches, start=1):
        _, loc = plan.global_batch(step)
        tokens = p.tokens(loc.sample)
        assert batch["input_ids"].tolist() == tokens[:, :-1].tolist()
        assert batch["position_ids"].tolist() == p.position_ids(loc.sample)[:, :-1].tolist()
        assert batch["label_mask"].tolist() == p.label_mask(loc.sample).tolist()
        rows = explain_step(plan, step)
        assert [r["sample"] for r in rows] == loc.sample.tolist()
        assert [r["loss_tokens"] for r in rows] == p.label_mask(loc.sample).sum(axis=1).tolist()
        assert [r["tokens"] for r in rows] == [list(p.token_range(s)) for s in loc.sample.tolist()]
    by_sample = {r["sample"]: r for step in (1, 2, 3) for r in explain_step(plan, step)}
    assert {s: (r["documents"], r["loss_tokens"]) for s, r in by_sample.items()} == {
        0: ([0, 1], 5), 1: ([2, 3], 3), 2: ([4], 4)}


def test_explain_counts_loss_tokens_of_windows(tmp_path):
    from runtime.cli.explain import explain_step
    from runtime.data import DataPlan

    write_folder(tmp_path / "chat", DOCS, LOSS)
    plan = DataPlan(chat_config(tmp_path, packing="window", seq=4))
    rows = explain_step(plan, 1)
    for r in rows:  # labels are stream tokens start+1..start+4: loss bit, and not a document start
        start = r["tokens"][0]
        doc_starts = {3, 8, 10, 14}
        expected = sum(LOSS_STREAM[t] and t not in doc_starts for t in range(start + 1, start + 5))
        assert r["loss_tokens"] == expected and r["packing"] == "window"


def test_packing_options_are_checked(tmp_path):
    from runtime.config import ConfigError

    with pytest.raises(ConfigError, match=r"data_stages\[0\] \(sft\)\.data\.drop_long_documents: only applies with "
                                          r"packing: documents \(packing is 'window'\)"):
        chat_config(tmp_path, packing="window", drop_long_documents=True)
    with pytest.raises(ConfigError, match=r"data_stages\[0\]\.data\.packing: 'docs' is not one of "
                                          r"\['window', 'documents'\]"):
        chat_config(tmp_path, packing="docs")


def test_every_document_too_long_and_dropped_is_a_config_error(tmp_path):
    from runtime.config import ConfigError
    from runtime.data import DataPlan

    write_folder(tmp_path / "chat", [[[1, 2, 3, 4, 5, 6]]])
    with pytest.raises(ConfigError, match=r"every document of .*chat is longer than sequence_length \+ 1 = 4 and was "
                                          r"dropped; raise sequence_length or set drop_long_documents: false"):
        DataPlan(chat_config(tmp_path, seq=3, drop_long_documents=True))


def test_a_folder_without_documents_is_not_said_to_have_dropped_them(tmp_path):
    """An empty folder packed with drop_long_documents: false was told every document was dropped."""
    from runtime.config import ConfigError
    from runtime.data import DataPlan

    write_folder(tmp_path / "chat", [[]])
    for drop in (False, True):
        with pytest.raises(ConfigError) as e:
            DataPlan(chat_config(tmp_path, drop_long_documents=drop))
        assert str(e.value) == f"data_stages[0] (sft): {tmp_path / 'chat'} has no tokens to pack; add data"


def test_resume_refuses_a_changed_packing(tmp_path):
    from runtime.config import ConfigError
    from runtime.data import DataPlan
    from runtime.data.order.plan import training_metadata
    from runtime.data.order.record import TrainingMetadata

    write_folder(tmp_path / "chat", DOCS, LOSS)
    history = TrainingMetadata.from_json(training_metadata(DataPlan(chat_config(tmp_path)), 1).to_json())
    assert history.data_stages[0].packing == "documents"
    resumed = DataPlan(chat_config(tmp_path), history=history, checkpoint="ckpt")  # unchanged: fine
    assert resumed.data_hash(2) == DataPlan(chat_config(tmp_path)).data_hash(2)
    with pytest.raises(ConfigError, match=r"ckpt: data_stages\[0\] \(sft\)\.data\.packing: window differs from "
                                          r"documents that the checkpoint trained this stage with"):
        DataPlan(chat_config(tmp_path, packing="window"), history=history, checkpoint="ckpt")


def test_sft_stage_trains_on_exactly_the_explained_loss_tokens(tmp_path):
    """End to end (one process): packed documents, loss masks and document attention; the trainer's
    ``label_tokens`` per step equal the ``loss_tokens`` that explain reports for the step's samples."""
    import yaml

    from runtime.cli.explain import explain_step
    from runtime.data import DataPlan
    from tests.support.harness import metrics, train_one

    write_folder(tmp_path / "chat", DOCS, LOSS)
    config = chat_config(tmp_path, steps=4)
    d = config.to_dict()
    d["model"].update(hidden_size=16, num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=2,
                      intermediate_size=32, vocab_size=64, attention="document")
    d["logging"] = {"tensorboard": False}
    d["checkpoints"]["save_final"] = False
    (tmp_path / "cfg.yaml").write_text(yaml.safe_dump(d))
    proc = train_one(tmp_path / "cfg.yaml", tmp_path)
    # the stage's line says the padding: 20 tokens of documents in 3 samples of 8 (4 of the 24 are padding)
    assert (f"{tmp_path / 'chat'}: 3 packed samples of whole documents (≤ 8 tokens, 16.7% of them padding); 0 longer "
            f"documents truncated") in proc.stdout
    rows = metrics(tmp_path / "run")
    plan = DataPlan(config)
    expected = [sum(r["loss_tokens"] for r in explain_step(plan, step)) for step in (1, 2, 3, 4)]
    assert [r["label_tokens"] for r in rows] == expected and all(n > 0 for n in expected)


def test_a_stage_blending_a_chat_folder_and_a_plain_one_masks_only_the_chat_rows(tmp_path):
    from runtime.data import DataPlan, StageDataset

    write_folder(tmp_path / "chat", DOCS, LOSS)
    write_folder(tmp_path / "plain", DOCS)
    config = chat_config(tmp_path, packing="window", seq=4)
    config.data_stages[0].data.dataset.dataset_folder = [str(tmp_path / "chat"), str(tmp_path / "plain")]
    config.data_stages[0].data.dataset.dataset_weights = [1.0, 1.0]
    plan = DataPlan(config)
    stage = plan.stages[0]
    examples = StageDataset(plan, stage).__getitems__(list(range(6)))
    loc = plan.locate(stage, list(range(6)))
    assert sorted(set(loc.dataset.tolist())) == [0, 1]
    for ex, d, s in zip(examples, loc.dataset.tolist(), loc.sample.tolist()):
        expected = [bool(LOSS_STREAM[t]) if d == 0 else True for t in range(4 * s + 1, 4 * s + 5)]
        assert ex["label_mask"].tolist() == expected


def test_resume_tells_a_chat_folder_from_a_plain_copy_of_its_tokens(tmp_path):
    """The record's folder moved away and a plain copy of its tokens listed instead: not the same dataset
    (the fingerprint covers the masks), so resume refuses instead of continuing the chat folder's draws there."""
    import shutil

    from runtime.config import ConfigError
    from runtime.data import DataPlan
    from runtime.data.order.plan import training_metadata
    from runtime.data.order.record import TrainingMetadata

    write_folder(tmp_path / "chat", DOCS, LOSS)
    write_folder(tmp_path / "plain", DOCS)
    history = TrainingMetadata.from_json(training_metadata(DataPlan(chat_config(tmp_path)), 1).to_json())
    shutil.move(tmp_path / "chat", tmp_path / "gone")
    config = chat_config(tmp_path)
    config.data_stages[0].data.dataset.dataset_folder = str(tmp_path / "plain")
    with pytest.raises(ConfigError, match=f"dataset_folder: {tmp_path / 'chat'}: no such dataset folder"):
        DataPlan(config, history=history, checkpoint="ckpt")
    shutil.copytree(tmp_path / "gone", tmp_path / "moved")  # a true copy is still found by content
    config.data_stages[0].data.dataset.dataset_folder = str(tmp_path / "moved")
    resumed = DataPlan(config, history=history, checkpoint="ckpt")
    assert resumed.folders == [str(tmp_path / "moved")]


def test_windows_and_packed_documents_are_both_a_sample_space(tmp_path):
    """The plan, the stage dataset and explain call only what SampleSpace declares: both classes have each of its
    members, every method with its parameters, and ``packing`` tells them apart as the stage's data.packing."""
    import inspect

    from runtime.data.order.sample_space import SampleSpace

    declared = {name for name in vars(SampleSpace) if not name.startswith("_")} | {"__len__"}
    declared |= set(SampleSpace.__annotations__)
    assert declared == {"packing", "folder", "reader", "sequence_length", "num_samples", "__len__", "sample_key",
                        "has_label_mask", "token_range", "tokens", "position_ids", "label_mask", "read"}
    windows = TokenWindows(tmp_path / "chat", 7, write_folder(tmp_path / "chat", DOCS, LOSS))
    for space, packing in ((windows, "window"), (packed(tmp_path, 7), "documents")):
        assert isinstance(space, SampleSpace) and space.packing == packing
        for name in declared:
            assert hasattr(space, name), (type(space).__name__, name)
            member = inspect.getattr_static(SampleSpace, name, None)
            if inspect.isfunction(member):
                assert (list(inspect.signature(getattr(type(space), name)).parameters)
                        == list(inspect.signature(member).parameters)), (type(space).__name__, name)
        tokens = np.empty((2, 8), dtype=np.int64)
        positions = np.empty_like(tokens)
        space.read(np.array([1, 0]), tokens, positions)  # the batch path the stage dataset takes for both
        assert tokens.tolist() == space.tokens(np.array([1, 0])).tolist()
        assert positions.tolist() == space.position_ids(np.array([1, 0])).tolist()
