"""The loader's fast paths give exactly what the plain definitions give."""

from __future__ import annotations

import numpy as np

from nanoset import Manifest, ShardWriter, TokenizerInfo, open_dataset, write_manifest
from runtime.data.order.windows import TokenWindows, position_ids_at


def _random_folder(path, seed=0, shards=3):
    """Shards of random documents (lengths 1-40, EOS 0 at each end); returns the reader and the stream."""
    rng = np.random.default_rng(seed)
    infos, stream, starts = [], [], []
    for s in range(shards):
        with ShardWriter(path, f"s{s}", np.uint16, "toy") as w:
            for _ in range(int(rng.integers(5, 30))):
                doc = rng.integers(1, 100, int(rng.integers(1, 41))).tolist()
                doc[-1] = 0
                starts.append(len(stream))
                stream.extend(doc)
                w.add_document(doc)
            infos.append(w.finalize())
    write_manifest(path, Manifest(TokenizerInfo("toy", 100, eos_id=0), "uint16", infos))
    return open_dataset(path), stream, set(starts)


def _reference_positions(doc_starts: set[int], start: int, width: int) -> list[int]:
    out, p = [], 0
    for t in range(start, start + width):
        p = 0 if t == start or t in doc_starts else p + 1
        out.append(p)
    return out


def test_position_ids_match_the_definition_across_shards(tmp_path):
    reader, stream, doc_starts = _random_folder(tmp_path)
    for L in (1, 4, 17, 64, 256):  # 256: many documents per window, the running-maximum path
        w = TokenWindows("toy", L, reader)
        idx = np.random.default_rng(L).permutation(w.num_samples)
        pos = w.position_ids(idx)
        tok = np.empty((len(idx), L + 1), dtype=np.int64)
        pos2 = np.full_like(tok, -7)
        w.read(idx, tok, pos2)  # the batch path writes both into given buffers
        for row, i in enumerate(idx.tolist()):
            expected = _reference_positions(doc_starts, i * L, L + 1)
            assert pos[row].tolist() == expected == pos2[row].tolist()
            assert tok[row].tolist() == stream[i * L : i * L + L + 1]
            # one window alone: inside one shard mostly (the one-shard paths), else across shards
            assert w.position_ids(i).tolist() == expected and w.tokens(i).tolist() == tok[row].tolist()
        first = np.arange(min(3, w.num_samples))  # a batch from the first shard only
        assert w.position_ids(first).tolist() == [_reference_positions(doc_starts, i * L, L + 1) for i in first]
    starts = np.array([0, 5, len(stream) - 9])
    assert position_ids_at(reader, starts, 9).tolist() == [_reference_positions(doc_starts, s, 9) for s in starts]


def test_position_ids_search_the_index_in_its_own_dtype(tmp_path, monkeypatch):
    """Position ids cost 3× the tokens because each search converted the whole uint64 index:
    numpy searches int64 values in a uint64 array as float64, converting the array every call."""
    reader, _, doc_starts = _random_folder(tmp_path, shards=1)
    search = np.searchsorted
    searched = []

    def strict(a, v, *args, **kwargs):
        searched.append((np.asarray(a).dtype, np.asarray(v).dtype))
        return search(a, v, *args, **kwargs)

    monkeypatch.setattr(np, "searchsorted", strict)
    pos = TokenWindows("toy", 8, reader).position_ids(np.array([3, 1, 2]))
    assert pos.tolist() == [_reference_positions(doc_starts, i * 8, 9) for i in (3, 1, 2)]
    index_searches = [(a, v) for a, v in searched if a == np.uint64]
    assert len(index_searches) == 2 and all(v == np.uint64 for _, v in index_searches)


def test_collator_takes_the_stage_buffers_as_a_list_of_rows_would_give(shards, monkeypatch):
    """StageDataset hands the collator its buffers (no stacking); a plain list of the same rows (any
    other dataset) gives exactly the same batch."""
    from runtime.data import DataPlan, StageDataset
    from runtime.data.loading.collator import DataCollatorForCLM, DataCollatorForCLMWithPositionIds
    from runtime.data.loading.dataset import Examples
    from tests.support.configs import make_config

    monkeypatch.chdir(shards)
    plan = DataPlan(make_config(mbs=4))
    for stage in plan.stages:  # with position ids, then without
        cls = DataCollatorForCLMWithPositionIds if stage.use_position_ids else DataCollatorForCLM
        collator = cls(stage.sequence_length)
        examples = StageDataset(plan, stage).__getitems__([5, 0, 17, 3])
        assert isinstance(examples, Examples) and len(examples) == 4
        fast, plain = collator(examples), collator([dict(ex) for ex in examples])
        assert sorted(fast) == sorted(plain)
        for key in fast:
            assert fast[key].dtype == plain[key].dtype and fast[key].tolist() == plain[key].tolist(), key
        assert fast["input_ids"].data_ptr() == examples.ids.ctypes.data  # the stage's buffer, not a copy
    assert [s.use_position_ids for s in plan.stages] == [True, False]
