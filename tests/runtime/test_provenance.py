"""explain over a range of steps, and the reverse question: which steps held a token of a document."""

from __future__ import annotations

import json
import subprocess
import sys
import time

import pytest
import yaml

from runtime.cli.explain import explain_step, main
from runtime.data import DataPlan, training_metadata
from runtime.data.order.provenance import document_steps
from runtime.data.order.record import TrainingMetadata
from tests.support import one_line_error
from tests.support.configs import make_config


@pytest.fixture(autouse=True)
def in_shards(shards, monkeypatch):
    monkeypatch.chdir(shards)


SCHEDULE = [{"step": 1, "weights": [0.9, 0.1]}, {"step": 6, "weights": [0.3, 0.7]}]


def two_stages(schedule=SCHEDULE):
    """A scheduled web+code blend of windows (steps 1-9), then sft and web packed as whole documents."""
    return [{"name": "pretrain", "start_training_step": 1, "data": {"use_position_ids": True, "dataset": {
                "dataset_folder": ["shards/web", "shards/code"], "dataset_weights": schedule}}},
            {"name": "sft", "start_training_step": 10, "sequence_length": 64, "data": {
                "use_position_ids": True, "packing": "documents",
                "dataset": {"dataset_folder": ["shards/sft", "shards/web"], "dataset_weights": [0.5, 0.5]}}}]


def cli(*args, check=True):
    return subprocess.run([sys.executable, "-m", "runtime.explain", *map(str, args)], capture_output=True, text=True,
                          check=check)


def write(config, path):
    path.write_text(yaml.safe_dump(config.to_dict()))
    return path


def test_a_range_of_steps_equals_the_steps_one_by_one(tmp_path, capsys):
    cfg = write(make_config(mbs=4, train_steps=16, stages=two_stages()), tmp_path / "c.yaml")
    ranged = json.loads(cli("--config", cfg, "--steps", "4:12", "--json").stdout)
    single = []
    for step in range(4, 13):
        assert main(["--config", str(cfg), "--step", str(step), "--json"]) == 0
        single += json.loads(capsys.readouterr().out)
    assert ranged == single and [r["step"] for r in ranged] == [s for s in range(4, 13) for _ in range(4)]
    assert {r["stage"] for r in ranged} == {"pretrain", "sft"}  # across the stage boundary
    text = cli("--config", cfg, "--steps", "9:10").stdout.splitlines()
    plan = DataPlan(make_config(mbs=4, train_steps=16, stages=two_stages()))
    assert text[0] == f"step 9: stage 'pretrain', 4 samples, data_hash {plan.data_hash(9)}" and len(text) == 10
    assert text[5] == f"step 10: stage 'sft', 4 samples, data_hash {plan.data_hash(10)}"
    one_line_error(cli("--config", cfg, "--steps", "12:4", check=False), "--steps: expected A:B with A ≤ B")
    one_line_error(cli("--config", cfg, "--steps", "10:17", check=False),
                   "--steps 10:17: outside [1, tokens.train_steps=16]")


def forward_map(plan, last_step):
    """(folder, document) → {(step, position, sample, tokens)} from explain's rows of every step."""
    out: dict[tuple[str, int], set] = {}
    for step in range(1, last_step + 1):
        for r in explain_step(plan, step):
            for doc in r["documents"]:
                out.setdefault((r["dataset"], doc), set()).add((step, r["position"], r["sample"], tuple(r["tokens"])))
    return out


def test_the_reverse_lookup_equals_the_forward_map_for_every_document(tmp_path):
    """Windows (a scheduled blend) then packed documents; the run resumes at step 5 with another global batch
    (8 → 4, mid-stage: a new part); web is read as windows and as packed samples. For every document of the
    three folders, the reverse lookup finds exactly the (step, position, sample, tokens) the forward map has."""
    before = DataPlan(make_config(mbs=8, train_steps=16, stages=two_stages()))
    history = TrainingMetadata.from_json(json.loads(json.dumps(training_metadata(before, 5).to_json())))
    config = make_config(mbs=4, train_steps=16, stages=two_stages())
    config.checkpoints.allow_data_change = True
    plan = DataPlan(config).resumed_from("ckpt", history)
    assert [(p.name, p.global_batch_size) for p in plan.stages] == [("pretrain", 8), ("pretrain", 4), ("sft", 4)]
    expected = forward_map(plan, 16)
    queries = [(f"shards/{name}", doc) for name in ("web", "code", "sft")
               for doc in range(plan.datasets[plan.folders.index(str(tmp_path.cwd() / "shards" / name))]
                                .reader.num_documents)]
    hits = document_steps(plan, queries)
    got: dict[tuple[str, int], set] = {}
    for h in hits:
        folder, doc = h["document"].rsplit(":", 1)
        assert h["dataset"] == folder and h["stage"] == plan.stage_for_step(h["step"]).name
        got.setdefault((folder, int(doc)), set()).add((h["step"], h["position"], h["sample"], tuple(h["tokens"])))
    assert got == expected
    assert len(hits) == sum(map(len, expected.values()))  # no hit twice
    kinds = {h["dataset"]: set() for h in hits}
    for h in hits:
        kinds[h["dataset"]].add(h["stage"])
    assert kinds["shards/web"] == {"pretrain", "sft"}  # web's windows and its packed samples


def test_the_document_cli_and_its_errors(tmp_path):
    cfg = write(make_config(mbs=4, train_steps=16, stages=two_stages()), tmp_path / "c.yaml")
    plan = DataPlan(make_config(mbs=4, train_steps=16, stages=two_stages()))
    _, loc = plan.global_batch(3)
    sample = int(loc.sample[0])
    web = plan.datasets[int(loc.dataset[0])]
    doc = int(web.reader.document_ids(*web.token_range(sample))[-1])
    rows = json.loads(cli("--config", cfg, "--document", f"{web.folder}:{doc}", "--json").stdout)
    assert {"step": 3, "position": 0, "dataset": web.folder, "sample": sample} in [
        {k: r[k] for k in ("step", "position", "dataset", "sample")} for r in rows]
    keys = {"document", "step", "stage", "position", "dataset", "source", "sample", "epoch", "tokens",
            "skipped"}
    assert all(set(r) == keys for r in rows)
    listing = tmp_path / "docs.txt"
    listing.write_text(f"{web.folder}:{doc}\n\nshards/code:0\n")
    many = json.loads(cli("--config", cfg, "--documents", listing, "--json").stdout)
    assert [r for r in many if r["document"] == f"{web.folder}:{doc}"] == rows
    text = cli("--config", cfg, "--documents", listing).stdout
    assert text.startswith(f"document {web.folder}:{doc}: {len(rows)} samples in ")
    unseen = next(d for d in range(web.reader.num_documents) if not document_steps(plan, [("shards/web", d)]))
    assert cli("--config", cfg, "--document", f"shards/web:{unseen}").stdout == (
        f"document shards/web:{unseen}: in no step of 1-16\n")
    one_line_error(cli("--config", cfg, "--document", "shards/nope:3", check=False),
                   "shards/nope: not a dataset of this run; its datasets are: shards/code, shards/sft, shards/web")
    one_line_error(cli("--config", cfg, "--document", "shards/web:3500", check=False),
                   "shards/web:3500: shards/web has 3500 documents; give an index in [0, 3500)")
    one_line_error(cli("--config", cfg, "--document", "shards/web", check=False),
                   "--document: expected FOLDER:DOC (a dataset folder and a document index), got 'shards/web'")
    listing.write_text("shards/web:1\nshards/web:x\n")
    one_line_error(cli("--config", cfg, "--documents", listing, check=False), f"{listing} line 2: expected FOLDER:DOC")
    one_line_error(cli("--config", cfg, "--documents", tmp_path / "none.txt", check=False),
                   f"--documents: {tmp_path / 'none.txt'}: cannot read it")


def test_a_million_step_run_answers_in_seconds(tmp_path):
    """1,000,000 steps of 8 samples (a constant blend, then a schedule from step 500,001): web is drawn in
    1,655 epochs. The lookup takes O(epochs × samples touching the document), not O(steps)."""
    stages = [{"name": "long", "start_training_step": 1, "data": {"dataset": {
                  "dataset_folder": ["shards/web", "shards/code"], "dataset_weights": [0.7, 0.3]}}},
              {"name": "scheduled", "start_training_step": 500_001, "data": {"dataset": {
                  "dataset_folder": ["shards/web", "shards/code"], "dataset_weights": [
                      {"step": 500_001, "weights": [0.7, 0.3]}, {"step": 900_000, "weights": [0.2, 0.8]}]}}}]
    config = make_config(mbs=8, train_steps=1_000_000, stages=stages)
    config.general.cache_dir = str(tmp_path / "cache")
    cfg = write(config, tmp_path / "long.yaml")
    began = time.perf_counter()
    proc = cli("--config", cfg, "--document", "shards/web:1234", "--json")
    seconds = time.perf_counter() - began
    hits = json.loads(proc.stdout)
    plan = DataPlan(config)
    web = plan.datasets[plan.stages[0].dataset_ids[0]]
    touching = [i for i in range(web.num_samples) if 1234 in web.reader.document_ids(*web.token_range(i))]
    epochs = -(-plan.draws_after(1_000_000)[f"{web.reader.folder.resolve()}@128"] // web.num_samples)
    assert epochs == 1655 and len(hits) <= epochs * len(touching)
    assert len(hits) >= (epochs - 1) * len(touching)  # every full epoch holds each touching sample once
    assert {h["stage"] for h in hits} == {"long", "scheduled"} and hits[-1]["step"] > 900_000
    for h in hits[:: max(1, len(hits) // 20)]:  # spot checks against the forward map
        _, loc = plan.global_batch(h["step"])
        assert plan.datasets[int(loc.dataset[h["position"]])] is web and int(loc.sample[h["position"]]) == h["sample"]
    print(f"1,000,000-step lookup: {seconds:.1f} s for {len(hits)} hits in {epochs} epochs")
    assert seconds < 10, f"{seconds:.1f} s"


def test_a_document_listed_twice_is_answered_once(tmp_path, capsys):
    """An audit list naming a document twice (or as 0153 and 153) reports its hits once: not twice the samples."""
    config = make_config(mbs=4, train_steps=16, stages=two_stages())
    cfg = write(config, tmp_path / "c.yaml")
    plan = DataPlan(config)
    _, loc = plan.global_batch(3)
    web = plan.datasets[int(loc.dataset[0])]
    doc = int(web.reader.document_ids(*web.token_range(int(loc.sample[0])))[-1])
    once = document_steps(plan, [(web.folder, doc)])
    assert once and document_steps(plan, [(web.folder, doc), (web.folder, doc), ("shards/code", 0)])[:len(once)] == once
    listing = tmp_path / "docs.txt"
    listing.write_text(f"{web.folder}:{doc}\n{web.folder}:0{doc}\n")
    assert main(["--config", str(cfg), "--documents", str(listing), "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == once
    assert main(["--config", str(cfg), "--documents", str(listing)]) == 0
    lines = capsys.readouterr().out.splitlines()
    steps = sorted({h["step"] for h in once})
    assert lines[0] == (f"document {web.folder}:{doc}: {len(once)} samples in {len(steps)} steps (first {steps[0]}, "
                        f"last {steps[-1]})")
    assert len(lines) == 1 + len(once)


@pytest.mark.parametrize("as_json", [True, False])
def test_a_range_is_written_step_by_step(tmp_path, monkeypatch, as_json):
    """--steps A:B writes each step's rows before it computes the next (memory for one step, not the range; a
    pipe sees rows at once), and the output is what one list of the whole range prints."""
    import io

    from runtime.cli import explain as cli_module

    config = make_config(mbs=4, train_steps=16, stages=two_stages())
    cfg = write(config, tmp_path / "c.yaml")
    plan = DataPlan(config)
    rows = [row for step in range(8, 12) for row in explain_step(plan, step)]
    out = io.StringIO()
    written_before: list[int] = []
    real = cli_module.explain_step

    def step_rows(plan, step, *decoding):
        written_before.append(len(out.getvalue()))
        return real(plan, step, *decoding)

    monkeypatch.setattr(cli_module, "explain_step", step_rows)
    monkeypatch.setattr(sys, "stdout", out)
    assert main(["--config", str(cfg), "--steps", "8:11"] + (["--json"] if as_json else [])) == 0
    monkeypatch.setattr(sys, "stdout", sys.__stdout__)
    assert len(written_before) == 4 and written_before[0] < written_before[1] < written_before[2] < written_before[3]
    if as_json:
        assert out.getvalue() == json.dumps(rows) + "\n"
    else:
        lines = out.getvalue().splitlines()
        assert len(lines) == 4 * 5 and lines[0].startswith("step 8: stage 'pretrain', 4 samples, data_hash ")
        assert lines[15] == f"step 11: stage 'sft', 4 samples, data_hash {rows[-1]['data_hash']}"


def test_a_range_piped_into_a_reader_that_stops_early_ends_quietly(tmp_path):
    """explain --steps 1:400 | head -1: the reader closes the pipe after a line; explain stops without a
    BrokenPipeError traceback and exits as a process a closed pipe stops does (128 + SIGPIPE)."""
    cfg = write(make_config(mbs=4, train_steps=400, stages=two_stages()), tmp_path / "c.yaml")
    proc = subprocess.Popen([sys.executable, "-m", "runtime.explain", "--config", str(cfg), "--steps", "1:400"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert proc.stdout.readline().startswith("step 1: stage 'pretrain', 4 samples, data_hash ")
    proc.stdout.close()
    assert proc.wait(timeout=120) == 141
    assert proc.stderr.read() == ""
