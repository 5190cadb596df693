"""The checkpoint record (``runtime.checkpoint.record``): one typed home for ``metadata.json``, version 1 read with
defaults, damaged, foreign and newer files said in one line; the run lock inside the run folder; a damaged
checkpoint's export naming the reason and the checkpoint to use instead."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from nanoset.errors import CheckpointError, ConfigError
from runtime.checkpoint.record import FORMAT_VERSION, CheckpointRecord, read_metadata
from runtime.checkpoint.run_folder import RUN_LOCK, move_aside, run_lock
from runtime.config.load import load_config
from runtime.startup import plan_start
from tests.support import FIXTURES, ROOT, one_line_error, unwritable
from tests.support.configs import small_config
from tests.support.harness import train_one

V1 = FIXTURES / "checkpoint-v1" / "step-000003"


def test_a_version_1_file_reads_with_defaults_and_writes_back_as_version_2():
    record = read_metadata(V1)
    assert (record.version, record.last_step, record.world_size, record.step_skipped, record.skipped_in_a_row) == (
        1, 3, 1, False, 0)
    assert record.consumed() == {"pretrain": (12, 384), "anneal": (0, 0)}  # samples, samples × sequence length
    assert record.lr_schedule["train_steps"] == 6 and record.model["hidden_size"] == 16 and record.extensions == {}
    tokenizer = record.tokenizer
    assert (tokenizer.info.name, tokenizer.info.eos_id, tokenizer.stage, tokenizer.chat_template,
            tokenizer.special_tokens) == ("tokenizer", 0, None, None, {})
    written = json.loads(json.dumps(record.to_json()))
    assert written["format_version"] == FORMAT_VERSION == 2
    again = CheckpointRecord.from_json(written)
    assert again.to_json() == written and again.version == 2 and again.training == record.training


def test_skipped_steps_of_a_version_1_file_count_its_own_step(tmp_path):
    data = json.loads((V1 / "metadata.json").read_text())
    del data["skipped_in_a_row"]
    data["step_skipped"] = True
    assert CheckpointRecord.from_json(data).skipped_in_a_row == 1  # saved before the count was


@pytest.mark.parametrize("text, reason", [
    ('{"training": {"last_tr', "JSONDecodeError: Unterminated string starting at: line 1 column 15 (char 14)"),
    ("[1, 2]", "TypeError: a JSON list, not an object"),
    ('{"step": 4}', "KeyError: 'training'"),
    ('{"training": 3}', "TypeError: training is a JSON int, not an object"),
    ('{"format_version": "2", "training": {}}', "ValueError: format_version is '2', not a version number"),
    ('{"training": {"last_train_step": 3}}', "KeyError: 'training.data_stages'"),
])
def test_a_damaged_or_foreign_metadata_file_is_one_line_naming_it(tmp_path, text, reason):
    (tmp_path / "metadata.json").write_text(text)
    with pytest.raises(CheckpointError) as e:
        read_metadata(tmp_path)
    assert str(e.value) == (f"{tmp_path / 'metadata.json'}: not a training checkpoint's metadata ({reason}); give a "
                            f"step-N folder that a run saved")


@pytest.mark.parametrize("edit, reason", [
    (lambda d: d["training"].update(last_train_step="3"), "training.last_train_step is '3', not a count"),
    (lambda d: d["training"].update(last_train_step=None), "training.last_train_step is None, not a count"),
    (lambda d: d["training"].update(last_train_step=-4), "training.last_train_step is -4, not a count"),
    (lambda d: d["training"]["data_stages"][0].update(consumed_train_samples=1.5),
     "training.data_stages[0].consumed_train_samples is 1.5, not a count"),
    (lambda d: d["training"]["data_stages"][0]["parts"][0].update(draw_offsets=[0, "x"]),
     "training.data_stages[0].parts[0].draw_offsets is [0, 'x'], not a list of counts"),
    (lambda d: d["training"]["data_stages"][1].update(name=7), "training.data_stages[1].name is 7, not a string"),
    (lambda d: d.update(step_skipped="false"), "step_skipped is 'false', not true or false"),
    (lambda d: d.update(world_size="2"), "world_size is '2', not a count"),
])
def test_a_metadata_file_with_a_field_of_the_wrong_kind_is_one_line_naming_the_field(tmp_path, edit, reason):
    """A count that is a string, null or negative would be taken and fail (or count wrongly) later, in the
    middle of a resume; ``"false"`` would read as a skipped step. Each is refused where it is read."""
    data = json.loads((V1 / "metadata.json").read_text())
    edit(data)
    (tmp_path / "metadata.json").write_text(json.dumps(data))
    with pytest.raises(CheckpointError) as e:
        read_metadata(tmp_path)
    assert str(e.value) == (f"{tmp_path / 'metadata.json'}: not a training checkpoint's metadata (ValueError: "
                            f"{reason}); give a step-N folder that a run saved")


def newer(tmp_path: Path) -> Path:
    checkpoint = tmp_path / "checkpoints" / "step-000003"
    shutil.copytree(V1, checkpoint)
    data = json.loads((checkpoint / "metadata.json").read_text())
    (checkpoint / "metadata.json").write_text(json.dumps({**data, "format_version": 3}))
    return checkpoint


def test_a_newer_format_is_refused_for_resume_and_explain_in_one_line(shards, tmp_path):
    checkpoint = newer(tmp_path)
    line = (f"{checkpoint / 'metadata.json'}: written in checkpoint format version 3 by a newer version of the runtime "
            f"(this one reads versions 1 to 2); use that version, or choose another checkpoint")
    cfg = small_config(tmp_path, tmp_path / "run", dp=1, checkpoints={"resume": str(checkpoint)})
    with pytest.raises(CheckpointError) as e:
        plan_start(load_config(cfg))
    assert str(e.value) == line
    assert not (tmp_path / "run").exists()  # the lock taken before is let go, with the folder it made
    proc = subprocess.run([sys.executable, "-m", "runtime.explain", "--config", str(cfg), "--checkpoint",
                           str(checkpoint), "--step", "4"], capture_output=True, text=True, cwd=shards,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})
    one_line_error(proc, line)


def test_the_string_keys_of_the_record_are_spelled_only_in_the_checkpoint_package():
    keys = ("training", "lr_schedule", "step_skipped", "skipped_in_a_row", "world_size", "format_version",
            "extensions")
    pattern = re.compile(r"""(\[|\.get\(|\{|, )\s*["'](""" + "|".join(keys) + r""")["']\s*[\],:)]""")
    found = [f"{p.relative_to(ROOT)}:{n}" for p in sorted((ROOT / "runtime").rglob("*.py"))
             if "checkpoint" not in p.relative_to(ROOT / "runtime").parts
             for n, line in enumerate(p.read_text().splitlines(), 1) if pattern.search(line)]
    assert found == []
    spelled = (ROOT / "runtime" / "checkpoint" / "record.py").read_text()
    assert all(f'"{k}"' in spelled for k in keys)


def test_a_damaged_checkpoints_export_names_the_reason_and_the_checkpoint_before_it(tmp_path):
    folder = tmp_path / "checkpoints"
    shutil.copytree(V1, folder / "step-000003")
    shutil.copytree(V1, folder / "step-000006")
    (folder / "latest").write_text("step-000006\n")
    (folder / "step-000006" / "__0_0.distcp").write_bytes(b"")  # was: "the DCP files are unreadable ()"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.run([sys.executable, "-m", "runtime.export", str(folder), str(tmp_path / "hf")],
                          capture_output=True, text=True, env=env)
    one_line_error(proc)
    assert proc.stderr == (f"error: {folder / 'step-000006'}: the DCP files are unreadable (a shard file ends before "
                           f"its data: torn or truncated); give {folder / 'step-000003'} as the checkpoint (the newest "
                           f"complete checkpoint before it)\n")
    (folder / "step-000006" / "__0_0.distcp").write_bytes(bytes(4096))  # was torch's 9-line weights_only message
    proc = subprocess.run([sys.executable, "-m", "runtime.export", str(folder / "step-000006"), str(tmp_path / "hf")],
                          capture_output=True, text=True, env=env)
    one_line_error(proc, "(a shard file holds no tensors torch saved: damaged or overwritten); give "
                         f"{folder / 'step-000003'} as the checkpoint")
    (folder / "step-000003" / ".metadata").write_bytes(b"")
    proc = subprocess.run([sys.executable, "-m", "runtime.export", str(folder / "step-000003"), str(tmp_path / "hf")],
                          capture_output=True, text=True, env=env)
    assert proc.stderr == (f"error: {folder / 'step-000003'}: the DCP files are unreadable (Ran out of input); "
                           f"choose another checkpoint\n")  # nothing before it to name
    assert not (tmp_path / "hf").exists()


def test_the_run_lock_lives_inside_the_run_folder_and_follows_a_replaced_run(tmp_path):
    parent = tmp_path / "runs"
    cfg = load_config(small_config(tmp_path, parent / "run", dp=1))
    held = run_lock(cfg)
    assert sorted(p.name for p in parent.iterdir()) == ["run"]  # nothing beside the run folder
    lock = parent / "run" / RUN_LOCK
    assert lock.read_text() == f"{os.uname().nodename} pid {os.getpid()}\n"
    (parent / "run" / "metrics.jsonl").write_text('{"step": 1}\n')
    (old,) = move_aside(cfg)  # replace_run: the old run moves aside, the held lock is the new folder's
    assert os.stat(parent / "run" / RUN_LOCK).st_ino == os.stat(old / RUN_LOCK).st_ino
    assert sorted(p.name for p in (parent / "run").iterdir()) == [RUN_LOCK]
    held.close()
    fresh = load_config(small_config(tmp_path, tmp_path / "new" / "run", dp=1, name="new.yaml"))
    run_lock(fresh).close()  # a lock that made its folders and trained nothing leaves none behind
    assert not (tmp_path / "new").exists()


def test_a_run_folder_under_a_read_only_parent_is_one_line_naming_it(shards, tmp_path):
    parent = tmp_path / "shared"
    cfg = small_config(tmp_path, parent / "run", dp=1)
    with unwritable(parent):
        proc = train_one(cfg, shards, check=False)
        with pytest.raises(ConfigError):
            plan_start(load_config(cfg))
    line = one_line_error(proc, "general.run_dir: ", str(parent / "run"), str(parent))
    assert "Errno" not in line and list(parent.iterdir()) == []
