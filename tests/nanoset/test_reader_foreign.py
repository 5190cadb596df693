"""Folders that are not complete Nanoset datasets: unfinished tokenize outputs and datatrove folders.

An unfinished output is refused everywhere with one line; a datatrove folder's largest token id is
known (scanned once, recorded, rescanned when the files change) and checked against the model;
its tokenizer is matched by name against Nanoset folders that record a sha256.
"""

from __future__ import annotations

import json
import os
import re
import shutil

import numpy as np
import pytest

from nanoset import NanosetError, open_dataset
from runtime.config import ConfigError
from runtime.data.order.plan import DataPlan
from tests.support import CORPUS, TOKENIZER, assert_one_cache_note, run_cli
from tests.support.configs import make_config
from tests.support.datasets import write_datatrove


@pytest.fixture(autouse=True)
def cache_dir(tmp_path, monkeypatch):
    """Scan records go to a per-test cache, never the user's."""
    monkeypatch.setenv("NANOSET_CACHE_DIR", str(tmp_path / "cache"))
    return tmp_path / "cache"


def stage(*folders, weights=None):
    ds = {"dataset_folder": [str(f) for f in folders]}
    if weights:
        ds["dataset_weights"] = weights
    return [{"name": "s", "start_training_step": 1, "data": {"dataset": ds}}]


# ---------------------------------------------------------------- unfinished outputs ------

def test_unfinished_tokenize_output_is_refused_everywhere(tmp_path):
    out = tmp_path / "half"
    args = ("tokenize", CORPUS, "-o", out, "--tokenizer", TOKENIZER, "--task-bytes", 200_000, "--quiet")
    first = run_cli(*args, "--num-tasks", 2, "--task-index", 0)
    done, total = map(int, re.search(r"ran (\d+) of (\d+) tasks", first.stdout).groups())
    assert 0 < done < total and any(out.glob("*.ds"))  # shards on disk, as a datatrove folder would have
    line = (f"{out}: unfinished `nanoset tokenize` output ({done} of {total} tasks done, no nanoset.json yet); "
            f"finish it by rerunning the same tokenize command without --num-tasks/--task-index")
    for command in ("inspect", "verify"):
        proc = run_cli(command, out, check=False)
        assert proc.returncode == 1 and proc.stdout == ""
        assert proc.stderr.startswith(f"error: {line}") and len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    with pytest.raises(NanosetError) as e:
        open_dataset(out)
    assert str(e.value).startswith(line)
    with pytest.raises(ConfigError) as e:
        DataPlan(make_config(stages=stage(out)))
    assert str(e.value).startswith(f"data_stages[0] (s).data.dataset.dataset_folder: {line}")
    assert "\n" not in str(e.value)
    # the command the message names finishes it
    run_cli(*args)
    assert run_cli("verify", out).stdout.startswith(f"OK: {out}: ")


# ---------------------------------------------------------------- ids beyond the vocabulary

def test_datatrove_ids_beyond_vocab_are_refused_before_training(tmp_path, cache_dir):
    folder = tmp_path / "dt"
    write_datatrove(folder, [[[5, 6, 0], [7, 0]], [[8191, 0]]])
    plan = DataPlan(make_config(seq=2, stages=stage(folder)))  # vocab_size 8192: the largest id 8191 fits
    assert plan.datasets[0].reader.max_token_id == 8191
    record = json.loads(next((cache_dir / "max-token-id").glob("*.json")).read_text())
    assert record["folder"] == str(folder.resolve()) and record["max_token_ids"] == [7, 8191]
    # same sizes, new content: the record is stale (mtime) and the folder is rescanned
    (folder / "001.ds").write_bytes(np.array([9000, 0], dtype="<u2").tobytes())
    st = (folder / "001.ds").stat()
    os.utime(folder / "001.ds", ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000))
    with pytest.raises(ConfigError) as e:
        DataPlan(make_config(seq=2, stages=stage(folder)))
    assert str(e.value) == (f"{folder}: holds token id 9000, ≥ model.vocab_size 8192; raise model.vocab_size to at "
                            f"least 9001, or use data made with the model's tokenizer")


def test_recorded_scan_is_reused(tmp_path, cache_dir):
    folder = tmp_path / "dt"
    write_datatrove(folder, [[[5, 6, 0]]])
    assert open_dataset(folder).max_token_id == 6
    record = next((cache_dir / "max-token-id").glob("*.json"))
    saved = json.loads(record.read_text())
    record.write_text(json.dumps(dict(saved, max_token_ids=[4321])))  # what a recorded scan says is believed
    assert open_dataset(folder).max_token_id == 4321


def test_an_unwritable_cache_is_one_note_and_a_rescan_at_the_next_start(tmp_path, monkeypatch, capsys):
    """The scan was silently not recorded: nothing said why every start read the whole folder."""
    from nanoset.format import maxid

    folder = tmp_path / "dt"
    write_datatrove(folder, [[[5, 6, 0]], [[9, 0]]])
    root = tmp_path / "file"
    root.write_text("not a folder")
    monkeypatch.setenv("NANOSET_CACHE_DIR", str(root))
    real, scans = maxid.scan_max, []
    monkeypatch.setattr(maxid, "scan_max", lambda *a: scans.append(1) or real(*a))
    for run in range(2):  # the command goes on; the next start scans again, and the note is said once a process
        assert open_dataset(folder).max_token_id == 9 and len(scans) == 2 * (run + 1)
        if run == 0:
            assert_one_cache_note(capsys.readouterr().err, root, "max-token-id", r"[0-9a-f]{32}\.json")
    assert capsys.readouterr().err == ""
    root.unlink()  # writable again: scanned, recorded, then read back
    assert open_dataset(folder).max_token_id == 9 and len(scans) == 6
    (record,) = (root / "max-token-id").iterdir()
    assert open_dataset(folder).max_token_id == 9 and len(scans) == 6
    for damage in ("{\"folder\": ", json.dumps(dict(json.loads(record.read_text()), max_token_ids="9"))):
        record.write_text(damage)  # damaged, or not what the cache writes: scanned again and replaced
        assert open_dataset(folder).max_token_id == 9
        assert json.loads(record.read_text())["max_token_ids"] == [6, 9]
    assert len(scans) == 10 and capsys.readouterr().err == ""


def test_old_manifest_without_max_ids_is_scanned(tmp_path):
    from nanoset import Manifest, ShardWriter, TokenizerInfo, write_manifest

    folder = tmp_path / "old"
    with ShardWriter(folder, "s", np.uint16, "toy") as w:
        w.add_document([9000, 3, 0])
        info = w.finalize()
    assert info.max_token_id == 9000
    write_manifest(folder, Manifest(TokenizerInfo("toy", 100, eos_id=0), "uint16", [info]))
    manifest = json.loads((folder / "nanoset.json").read_text())
    assert manifest["max_token_id"] == 9000 and manifest["shards"][0]["max_token_id"] == 9000
    del manifest["max_token_id"], manifest["shards"][0]["max_token_id"]
    (folder / "nanoset.json").write_text(json.dumps(manifest))
    assert open_dataset(folder).max_token_id == 9000
    with pytest.raises(ConfigError, match=f"{folder}: holds token id 9000, ≥ model.vocab_size 8192"):
        DataPlan(make_config(seq=1, stages=stage(folder)))


# ---------------------------------------------------------------- one tokenizer, two formats

def datatrove_copy(src, dst, tokenizer_name):
    """A Nanoset folder's shards as a datatrove folder whose metadata names the tokenizer ``tokenizer_name``."""
    dst.mkdir()
    for p in src.glob("*.ds*"):
        shutil.copy(p, dst / p.name)
    for meta in dst.glob("*.ds.metadata"):
        lines = meta.read_text().splitlines()
        lines[0] = f"{tokenizer_name}|2"
        meta.write_text("\n".join(lines))


@pytest.mark.parametrize("recorded", ["tokenizer", "{TOKENIZER}/tokenizer.json", "{TOKENIZER}/"])
def test_datatrove_and_nanoset_of_one_tokenizer_blend(tmp_path, shards, recorded):
    dt = tmp_path / "dt"
    datatrove_copy(shards / "shards" / "sft", dt, recorded.format(TOKENIZER=TOKENIZER))
    web = shards / "shards" / "web"
    plan = DataPlan(make_config(stages=stage(web, dt, weights=[0.5, 0.5])))
    assert [w.folder for w in plan.datasets] == [str(web), str(dt)]
    assert plan.datasets[1].reader.format == "datatrove" and plan.datasets[0].reader.tokenizer.sha256


def test_datatrove_of_another_tokenizer_is_refused(tmp_path, shards):
    dt = tmp_path / "dt"
    datatrove_copy(shards / "shards" / "sft", dt, "gpt2")
    web = shards / "shards" / "web"
    with pytest.raises(ConfigError) as e:
        DataPlan(make_config(stages=stage(web, dt, weights=[0.5, 0.5])))
    assert str(e.value).startswith(f"data_stages: datasets were tokenized with different tokenizers: {web} "
                                   f"('tokenizer' sha256 ")
    assert str(e.value).endswith(f" and {dt} ('gpt2'); re-tokenize them with one tokenizer")


def test_inspect_of_a_datatrove_folder_says_vocab_unknown(tmp_path, shards):
    dt = tmp_path / "dt"
    datatrove_copy(shards / "shards" / "sft", dt, "tokenizer")
    largest = max(int(np.fromfile(p, dtype="<u2").max()) for p in dt.glob("*.ds"))
    out = run_cli("inspect", dt, "--samples", 0).stdout
    assert f"tokenizer 'tokenizer'   vocab unknown (datatrove folder; largest id {largest})   eos unknown" in out
    report = run_cli("verify", dt).stdout
    assert report.startswith(f"OK: {dt}: ") and f"largest id {largest} verified" in report
