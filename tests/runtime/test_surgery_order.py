"""Data surgery in the data order: excised documents are passed over from their step on, nothing else moves."""

from __future__ import annotations

import json
import os
import pickle

import numpy as np
import pytest

from nanoset.errors import ConfigError
from runtime.cli.explain import explain_step
from runtime.data import DataPlan, training_metadata
from runtime.data.order.excision import DrawIndex, excised_samples
from runtime.data.order.permutation import FeistelPermutation
from runtime.data.order.provenance import document_steps
from runtime.data.order.record import TrainingMetadata
from runtime.data.order.surgery import (
    Surgery,
    parse_step_range,
    read_documents_file,
    resumed_surgery,
    surgery_of,
)
from tests.support.configs import make_config
from tests.support.data import global_batches


@pytest.fixture(autouse=True)
def in_shards(shards, monkeypatch):
    monkeypatch.chdir(shards)


def brute_force_positions(n: int, perm, exclusions: list[tuple[int, set[int]]], draws: int) -> list[int]:
    """Walk the stream position by position: draw k passes over the samples excluded by every (first draw ≤ k)."""
    out, q = [], 0
    while len(out) < draws:
        k = len(out)
        excluded = set().union(*[x for first, x in exclusions if first <= k])
        if int(perm(q // n)(q % n)) not in excluded:
            out.append(q)
        q += 1
    return out


def test_the_draw_index_equals_walking_the_stream_over_several_epochs_and_two_exclusions():
    n = 37
    perms = {e: FeistelPermutation(n, 5, e) for e in range(12)}
    exclusions = [(10, {3, 8, 20}), (50, {1, 8, 30, 31})]
    index = DrawIndex(n, perms.__getitem__, [(k, np.array(sorted(x))) for k, x in exclusions])
    expected = brute_force_positions(n, perms.__getitem__, exclusions, 300)
    assert index.positions(np.arange(300)).tolist() == expected
    positions = np.arange(expected[-1] + 1)
    samples = np.array([int(perms[int(p) // n](int(p) % n)) for p in positions])
    back = np.full(len(positions), -1)
    back[expected] = np.arange(300)
    assert index.draws(positions, samples).tolist() == back.tolist()  # passed-over positions are -1
    assert index.positions(np.arange(10)).tolist() == list(range(10))  # before the first exclusion: unchanged


def web_and_code(**surgery):
    stages = [{"name": "s", "start_training_step": 1, "data": {"use_position_ids": True, "dataset": {
        "dataset_folder": ["shards/web", "shards/code"], "dataset_weights": [0.6, 0.4]}}}]
    return make_config(mbs=8, train_steps=30, seq=64, stages=stages, surgery=surgery)


def excluded_docs(plan: DataPlan, count: int) -> list[int]:
    """``count`` documents of web that step 12's batch holds (so the surgery has something to pass over)."""
    docs = sorted({d for r in explain_step(plan, 12) if r["dataset"] == "shards/web" for d in r["documents"]})
    return docs[:count]


def test_excised_documents_are_absent_from_every_later_step_and_nothing_else_changes():
    base = DataPlan(web_and_code())
    docs = excluded_docs(base, 5)
    cut = DataPlan(web_and_code(exclude_documents=[f"shards/web:{d}" for d in docs], exclude_from_step=13))
    for step in range(1, 31):
        before, after = explain_step(base, step), explain_step(cut, step)
        assert [r["dataset"] for r in after] == [r["dataset"] for r in before]  # every slot's dataset
        web = [r for r in after if r["dataset"] == "shards/web"]
        if step < 13:
            assert after == before
            continue
        assert not any(set(r["documents"]) & set(docs) for r in web), step
        code_before = [(r["sample"], r["epoch"]) for r in before if r["dataset"] == "shards/code"]
        assert [(r["sample"], r["epoch"]) for r in after if r["dataset"] == "shards/code"] == code_before
    # the draws pass over exactly the excised samples of web's order: the kept ones in the same order, none twice
    w = cut.datasets[0]
    excised = set(excised_samples(w, np.array(docs)).tolist())
    stream = [int(cut.permutation(0, 0)(p)) for p in range(w.num_samples)]
    drawn = [r["sample"] for s in range(13, 31) for r in explain_step(cut, s) if r["dataset"] == "shards/web"]
    start = stream.index(drawn[0])
    assert drawn == [s for s in stream[start:] if s not in excised][: len(drawn)]  # within web's first epoch
    assert len(set(drawn)) == len(drawn)
    holding = {i for i in range(w.num_samples) if set(w.reader.document_ids(*w.token_range(i)).tolist()) & set(docs)}
    assert excised == holding  # every window holding one of them, no other
    assert any(cut.data_hash(s) != base.data_hash(s) for s in range(13, 31))
    again = pickle.loads(pickle.dumps(cut))  # as a loader worker started by spawn receives it
    assert [again.data_hash(s) for s in range(13, 31)] == [cut.data_hash(s) for s in range(13, 31)]
    # the reverse lookup agrees: each excised document is listed before step 13 only (step 12 held them all)
    hits = document_steps(cut, [("shards/web", d) for d in docs])
    assert {h["step"] for h in hits} >= {12} and all(h["step"] < 13 for h in hits)
    assert [h for h in document_steps(base, [("shards/web", d) for d in docs]) if h["step"] < 13] == hits


def test_the_order_with_surgery_is_the_same_for_any_layout_and_any_resume():
    docs = excluded_docs(DataPlan(web_and_code()), 3)
    surgery = {"exclude_documents": [f"shards/web:{d}" for d in docs], "exclude_from_step": 6, "skip_steps": ["8:9"]}
    one = DataPlan(web_and_code(**surgery))
    stages = one.config.to_dict()["data_stages"]
    layouts = [make_config(dp=2, mbs=4, train_steps=30, seq=64, stages=stages, surgery=surgery),
               make_config(dp=4, mbs=1, accum=2, train_steps=30, seq=64, stages=stages, surgery=surgery)]
    history = TrainingMetadata.from_json(json.loads(json.dumps(training_metadata(one, 7).to_json())))
    for other in [DataPlan(c) for c in layouts] + [DataPlan(layouts[0]).resumed_from("ckpt", history)]:
        assert [other.data_hash(s) for s in range(1, 31)] == [one.data_hash(s) for s in range(1, 31)]
    # draws_per_dataset counts the passed-over positions: later stages sharing web start after them
    assert sum(one.draws_after(30).values()) == 30 * 8 + sum(p for part in one.stages
                                                              for _, _, p in one.passed_over(part))


def test_a_later_stage_sharing_the_dataset_starts_after_the_positions_passed_over():
    docs = excluded_docs(DataPlan(web_and_code()), 5)
    stages = [{"name": "a", "start_training_step": 1, "data": {"dataset": {"dataset_folder": "shards/web"}}},
              {"name": "b", "start_training_step": 16, "data": {"dataset": {"dataset_folder": "shards/web"}}}]
    cut = DataPlan(make_config(mbs=8, train_steps=30, seq=64, stages=stages,
                               surgery={"exclude_documents": [f"shards/web:{d}" for d in docs]}))
    drawn = [r["sample"] for s in range(1, 31) for r in explain_step(cut, s)]
    w = cut.datasets[0]
    excised = set(excised_samples(w, np.array(docs)).tolist())
    stream = [int(cut.permutation(0, 0)(p)) for p in range(w.num_samples)]
    assert drawn == [s for s in stream if s not in excised][: len(drawn)]  # one walk across both stages


def test_surgery_mistakes_are_one_line(tmp_path):
    with pytest.raises(ConfigError) as e:
        DataPlan(web_and_code(exclude_documents=["shards/nope:3"]))
    assert str(e.value) == (f"surgery: {os.path.realpath('shards/nope')}: not a dataset of this run; its datasets "
                            f"are: shards/code, shards/web")
    with pytest.raises(ConfigError) as e:
        DataPlan(web_and_code(exclude_documents=["shards/web:999999"]))
    web = os.path.realpath("shards/web")
    n = DataPlan(web_and_code()).datasets[0].reader.num_documents
    assert str(e.value) == f"surgery: {web}:999999: {web} has {n} documents; give an index in [0, {n})"
    with pytest.raises(ConfigError) as e:
        web_and_code(skip_steps=["5:3"])
    assert "surgery.skip_steps: expected A:B with 1 ≤ A ≤ B (steps, both included), got '5:3'" in str(e.value)
    with pytest.raises(ConfigError) as e:
        web_and_code(skip_steps=["5:31"])
    assert "surgery.skip_steps: 5:31 ends after tokens.train_steps 30; give steps in [1, 30]" in str(e.value)
    with pytest.raises(ConfigError) as e:
        web_and_code(exclude_documents=["shards/web:1"], exclude_from_step=31)
    assert ("surgery.exclude_from_step: 31 is after tokens.train_steps 30, so nothing would be excised; give a step "
            "in [1, 30]") in str(e.value)
    with pytest.raises(ConfigError) as e:  # an exclusion's first step, and nothing to exclude
        web_and_code(exclude_from_step=9)
    assert ("surgery.exclude_from_step: 9, but no document is excluded; give surgery.exclude_documents or "
            "surgery.exclude_documents_file, or remove the key") in str(e.value)
    code = DataPlan(web_and_code()).datasets[1]
    everything = [f"shards/code:{d}" for d in range(code.reader.num_documents)]
    with pytest.raises(ConfigError) as e:
        DataPlan(web_and_code(exclude_documents=everything))
    assert str(e.value) == ("surgery: every sample of shards/code (sequence length 64) holds a token of an excluded "
                            "document, so nothing of it is left to train on; exclude fewer of its documents or remove "
                            "it from the stages")
    listed = tmp_path / "docs.txt"
    listed.write_text("shards/web:1\nnot a document\n")
    with pytest.raises(ConfigError) as e:
        DataPlan(web_and_code(exclude_documents_file=str(listed)))
    assert str(e.value).endswith(f"surgery.exclude_documents_file: {listed} line 2: expected FOLDER:DOC (a dataset "
                                 f"folder and a document index), got 'not a document'")


def test_a_surgery_that_contradicts_trained_steps_is_refused_and_a_recorded_one_is_kept():
    past = surgery_of(["12:14"], {"shards/web": [4]}, 9, "surgery")
    record = past.to_json()
    assert resumed_surgery(past, record, 10, "ckpt") == past  # the same surgery resumes
    assert resumed_surgery(Surgery(), record, 10, "ckpt") == past  # never dropped
    later = surgery_of(["20:20"], {"shards/web": [5]}, 11, "surgery")
    assert resumed_surgery(later, record, 10, "ckpt") == past.union(later)
    with pytest.raises(ConfigError) as e:
        resumed_surgery(surgery_of(["10:11"], {}, 1, "surgery"), record, 10, "ckpt")
    assert str(e.value) == ("ckpt: surgery skips steps 10-11, but this checkpoint trained steps up to 10; a skip must "
                            "start after the step resumed: rewind to an earlier checkpoint (nanoset train --rewind-to "
                            "STEP with STEP < 10)")
    with pytest.raises(ConfigError) as e:
        resumed_surgery(surgery_of([], {"shards/web": [5]}, 10, "surgery"), record, 10, "ckpt")
    folder = os.path.realpath("shards/web")
    assert str(e.value) == (f"ckpt: surgery excludes {folder}:5 from step 10, but this checkpoint trained steps up to "
                            f"10; an exclusion must start after the step resumed: rewind to an earlier checkpoint "
                            f"(nanoset train --rewind-to STEP with STEP < 10)")
    with pytest.raises(ConfigError) as e:  # from step 1: no checkpoint to rewind to
        resumed_surgery(surgery_of(["1:12"], {}, 1, "surgery"), record, 12, "ckpt")
    assert str(e.value) == ("ckpt: surgery skips steps 1-12, but this checkpoint trained steps up to 12; a skip must "
                            "start after the step resumed: no checkpoint comes before step 1, so start a new run with "
                            "it (another general.run_dir), or make it start after step 12")
    # a document the checkpoint excluded earlier may be named again from a later step
    assert resumed_surgery(surgery_of([], {"shards/web": [4]}, 10, "surgery"), record, 10, "ckpt") == past


def test_the_loaders_of_every_dp_layout_deliver_the_excised_order():
    docs = excluded_docs(DataPlan(web_and_code()), 5)
    surgery = {"exclude_documents": [f"shards/web:{d}" for d in docs], "exclude_from_step": 3}
    one = DataPlan(web_and_code(**surgery))
    expected = []
    for step in range(1, 16):
        _, loc = one.global_batch(step)
        rows = zip(loc.dataset.tolist(), loc.sample.tolist())
        expected.append(np.stack([one.datasets[d].tokens(s) for d, s in rows]))
    stages = one.config.to_dict()["data_stages"]
    for dp, mbs, accum in ((1, 8, 1), (2, 4, 1), (4, 1, 2)):
        plan = DataPlan(make_config(dp=dp, mbs=mbs, accum=accum, train_steps=30, seq=64, stages=stages,
                                    surgery=surgery))
        got = global_batches(plan, plan.stages[0], 15)
        assert all(np.array_equal(g, e) for g, e in zip(got, expected)), (dp, mbs, accum)


def test_the_audit_walk_through_excises_300_reported_documents(tmp_path):
    """docs/data-order.md: a contamination report names 300 documents; excised from step 16, no later step holds
    them, and every earlier hit stays as it was."""
    base = DataPlan(web_and_code())
    trained = sorted({d for s in range(1, 31) for r in explain_step(base, s) if r["dataset"] == "shards/web"
                      for d in r["documents"]})
    never = sorted(set(range(base.datasets[0].reader.num_documents)) - set(trained))
    report = sorted(trained[:200] + never[:100])  # a report names documents whether the run trained them or not
    assert len(report) == 300
    leaked = tmp_path / "leaked.txt"
    leaked.write_text("".join(f"shards/web:{d}\n" for d in report))
    cut = DataPlan(web_and_code(exclude_documents_file=str(leaked), exclude_from_step=16))
    queries = [("shards/web", d) for d in report]
    hits = document_steps(cut, queries)
    assert hits and max(h["step"] for h in hits) < 16
    assert hits == [h for h in document_steps(base, queries) if h["step"] < 16]
    for step in range(16, 31):
        held = {d for r in explain_step(cut, step) if r["dataset"] == "shards/web" for d in r["documents"]}
        assert not held & set(report), step
    assert cut.passed_over(cut.stages[0])[0][:2] == (0, 300)


def test_a_documents_file_means_what_its_lines_say_and_a_bad_index_is_one_line(tmp_path):
    listed = tmp_path / "docs.txt"
    listed.write_text("  shards/web:5\nshards/web:6\n")  # an indented line is the document it names
    read = read_documents_file(str(listed), "--exclude-documents")
    assert {f: d.tolist() for f, d in read.items()} == {"shards/web": [5, 6]}
    for line, why in (("shards/web:99999999999999999999", "the document index is too large"),
                      ("shards/web:²", "expected FOLDER:DOC (a dataset folder and a document index)")):
        listed.write_text(f"shards/web:1\n{line}\n")
        with pytest.raises(ConfigError) as e:
            read_documents_file(str(listed), "--exclude-documents")
        assert str(e.value).startswith(f"--exclude-documents: {listed} line 2: {why}"), str(e.value)
    with pytest.raises(ConfigError) as e:
        parse_step_range("²:3", "surgery.skip_steps")
    assert str(e.value) == "surgery.skip_steps: expected A:B with 1 ≤ A ≤ B (steps, both included), got '²:3'"


def test_a_documents_file_with_a_byte_order_mark_reads_and_one_not_utf8_is_one_line(tmp_path):
    """Every reader of a documents file (--exclude-documents, surgery.exclude_documents_file, explain --documents)
    takes a byte-order mark and refuses other encodings in one line naming the file and the line."""
    from runtime.cli.explain import _queries

    listed = tmp_path / "docs.txt"
    listed.write_bytes(b"\xef\xbb\xbfshards/web:5\nshards/web:6\n")
    assert {f: d.tolist() for f, d in read_documents_file(str(listed), "surgery.exclude_documents_file").items()} \
        == {"shards/web": [5, 6]}
    assert _queries(None, str(listed)) == [("shards/web", 5), ("shards/web", 6)]
    listed.write_bytes("shards/web:5\nshards/caf\u00e9:6\n".encode("latin-1"))
    for where, read in (("--exclude-documents", lambda: read_documents_file(str(listed), "--exclude-documents")),
                        ("--documents", lambda: _queries(None, str(listed)))):
        with pytest.raises(ConfigError) as e:
            read()
        assert str(e.value) == (f"{where}: {listed} line 2: not UTF-8 (byte 0xe9); save the file as UTF-8, one "
                                f"FOLDER:DOC a line")


def test_a_packed_dataset_passes_over_whole_packed_samples_from_the_step_on():
    stages = [{"name": "sft", "start_training_step": 1, "data": {"packing": "documents", "dataset": {
        "dataset_folder": ["shards/sft"]}}}]
    base = DataPlan(make_config(mbs=4, train_steps=20, seq=64, stages=stages))
    docs = sorted({d for s in (8, 9) for r in explain_step(base, s) for d in r["documents"]})[:6]
    cut = DataPlan(make_config(mbs=4, train_steps=20, seq=64, stages=stages, surgery={
        "exclude_documents": [f"shards/sft:{d}" for d in docs], "exclude_from_step": 8}))
    for step in range(1, 21):
        rows = explain_step(cut, step)
        if step < 8:
            assert rows == explain_step(base, step)
        else:
            assert not any(set(r["documents"]) & set(docs) for r in rows), step
    drawn = [(r["sample"], r["epoch"]) for s in range(1, 21) for r in explain_step(cut, s)]
    assert len(set(drawn)) == len(drawn) == 80  # nothing repeats: skip forward, not resample


def test_the_reverse_lookup_is_the_truth_with_two_exclusions_across_stages_sharing_a_dataset():
    stages = [{"name": "a", "start_training_step": 1, "data": {"dataset": {
        "dataset_folder": ["shards/code", "shards/sft"], "dataset_weights": [0.5, 0.5]}}},
              {"name": "b", "start_training_step": 21, "data": {"dataset": {"dataset_folder": "shards/code"}}}]
    base = DataPlan(make_config(mbs=8, train_steps=40, seq=64, stages=stages))
    early = sorted({d for r in explain_step(base, 5) if r["dataset"] == "shards/code" for d in r["documents"]})[:2]
    late = sorted({d for r in explain_step(base, 22) for d in r["documents"]})[:2]
    cut = base.with_surgery(surgery_of([], {"shards/code": np.array(early)}, 8, "a").union(
        surgery_of(["25:27"], {"shards/code": np.array(late)}, 25, "b")))
    rows = {step: explain_step(cut, step) for step in range(1, 41)}
    for doc, first in [*((d, 8) for d in early), *((d, 25) for d in late)]:
        truth = [(step, i) for step in rows for i, r in enumerate(rows[step])
                 if r["dataset"] == "shards/code" and doc in r["documents"]]
        hits = document_steps(cut, [("shards/code", doc)])
        assert [(h["step"], h["position"]) for h in hits] == truth and truth, doc
        assert all(step < first for step, _ in truth), doc
        assert [h["skipped"] for h in hits] == ["surgery" if 25 <= s <= 27 else None for s, _ in truth]


def test_a_recorded_exclusion_follows_its_folder_when_that_folder_now_holds_other_content():
    """A surgery recorded by content (``fingerprint:F``) of a folder rewritten in place since (a resume allowed to
    change data): the exclusion applies to that folder, as the resumed parts follow it, not a contradictory refusal."""
    base = DataPlan(web_and_code())
    docs = excluded_docs(base, 3)
    by_folder = DataPlan(web_and_code(exclude_documents=[f"shards/web:{d}" for d in docs], exclude_from_step=13))
    recorded = Surgery.from_json({"exclusions": [{"from_step": 13, "documents": {"fingerprint:0ld": docs}}],
                                  "datasets": {"fingerprint:0ld": os.path.abspath("shards/web")}})
    cut = base.with_surgery(recorded)
    assert [cut.data_hash(s) for s in range(1, 31)] == [by_folder.data_hash(s) for s in range(1, 31)]
    assert any(cut.data_hash(s) != base.data_hash(s) for s in range(13, 31))
    gone = Surgery.from_json({"exclusions": [{"from_step": 13, "documents": {"fingerprint:0ld": docs}}],
                              "datasets": {"fingerprint:0ld": "/gone/web"}})
    with pytest.raises(ConfigError, match=r"^surgery: /gone/web \(fingerprint:0ld\): not a dataset of this run; "
                                          r"its datasets are: shards/code, shards/web$"):
        base.with_surgery(gone)


def test_a_surgery_recorded_by_folder_before_content_keys_follows_the_data_its_checkpoint_trained(tmp_path):
    """A checkpoint made before datasets were keyed by content names its excised dataset by folder; that folder
    moved since: the checkpoint's own record (folder → fingerprint) says which dataset of the run it was."""
    base = DataPlan(web_and_code())
    docs = excluded_docs(base, 3)
    history = TrainingMetadata.from_json(json.loads(json.dumps(training_metadata(base, 4).to_json())))
    for part in (p for s in history.data_stages for p in s.parts):
        part.datasets = [str(tmp_path / "gone" / os.path.basename(f)) for f in part.datasets]
    old = Surgery.from_json({"exclusions": [{"from_step": 13, "documents": {str(tmp_path / "gone" / "web"): docs}}]})
    resumed = base.resumed_from("ckpt", history).with_surgery(old)
    by_folder = DataPlan(web_and_code(exclude_documents=[f"shards/web:{d}" for d in docs], exclude_from_step=13))
    assert [resumed.data_hash(s) for s in range(1, 31)] == [by_folder.data_hash(s) for s in range(1, 31)]
    assert any(resumed.data_hash(s) != base.data_hash(s) for s in range(13, 31))
