"""`nanoset convert` of Megatron and datatrove data into Nanoset folders, and training on Megatron data."""

from __future__ import annotations

import json
import re

import numpy as np
import pytest
import yaml

from nanoset import NanosetError, open_dataset
from runtime.data.order.plan import DataPlan
from runtime.data.order.windows import TokenWindows
from tests.support import TOKENIZER, run_cli
from tests.support.configs import make_config, small_config
from tests.support.datasets import write_datatrove
from tests.support.harness import metrics, train_one
from tests.support.megatron_data import (
    DOCS,
    ENDS,
    STREAM,
    build_with_megatron,
    cache_dir,  # noqa: F401 (an autouse fixture: scan records per test)
    write_mmidx,
)

# ---------------------------------------------------------------- nanoset convert ------

def test_convert_megatron_to_nanoset_then_verify(tmp_path):
    prefix = build_with_megatron(tmp_path / "mg" / "corpus", DOCS, "int32")
    out = tmp_path / "converted"
    assert run_cli("convert", prefix, "-o", out).stdout == (
        f"converted {prefix} (megatron) to {out}: 1 shards, 5 documents, 15 tokens as uint16, tokenizer unknown\n")
    assert run_cli("verify", out).stdout == (
        f"OK: {out}: 1 shards, 5 documents, 15 tokens, largest id 103 verified "
        f"(checksums, shard table, index and token ids; no EOS check: the tokenizer is unknown)\n")
    ds = open_dataset(out)
    assert (ds.format, ds.dtype.name, ds.tokens(0, 15).tolist(), ds.document_ends.tolist()) == \
        ("nanoset", "uint16", STREAM, ENDS)
    manifest = json.loads((out / "nanoset.json").read_text())
    assert manifest["build"] == {"converted_from": "megatron", "source": str(prefix), "documents_end_with_eos": None}
    assert (manifest["tokenizer"]["name"], manifest["tokenizer"]["vocab_size"], manifest["max_token_id"]) == \
        ("unknown", None, 103)
    assert (out / "corpus.ds.metadata").read_text() == "unknown|2\n15\n15"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cache", "converted", "mg"]  # no temporary left


def test_convert_with_the_tokenizer_records_it_and_the_eos_state(tmp_path, eos_id):
    prefix = write_mmidx(tmp_path / "d", [[[5, 6, eos_id]], [[7, eos_id]]], "int32")
    out = tmp_path / "a"
    assert run_cli("convert", prefix, "-o", out, "--tokenizer", TOKENIZER).stdout.endswith("tokenizer tokenizer\n")
    manifest = json.loads((out / "nanoset.json").read_text())
    assert manifest["build"]["documents_end_with_eos"] is True and manifest["tokenizer"]["eos_id"] == eos_id
    assert manifest["tokenizer"]["sha256"] and manifest["dtype"] == "uint16"
    assert run_cli("verify", out).stdout.endswith("verified (checksums, shard table, index, token ids and EOS)\n")
    # Megatron data need not end its documents with EOS: recorded, and verify does not ask for it
    write_mmidx(prefix, DOCS, "int32")
    line = run_cli("convert", prefix, "-o", out, "--tokenizer", TOKENIZER, "--overwrite").stdout
    assert line.endswith(f"tokenizer tokenizer; not every document ends with EOS {eos_id} (recorded)\n")
    assert json.loads((out / "nanoset.json").read_text())["build"]["documents_end_with_eos"] is False
    assert run_cli("verify", out).stdout.endswith(
        "verified (checksums, shard table, index and token ids; converted data whose documents need not end with "
        "EOS)\n")


def test_convert_a_datatrove_folder_keeps_its_tokenizer_name_and_picks_the_dtype(tmp_path):
    src = tmp_path / "dt"
    write_datatrove(src, [[[5, 6, 0], [4464, 0]], [[9, 0]]], tokenizer_name="gpt2")
    out = tmp_path / "out"
    assert run_cli("convert", src, "-o", out).stdout == (
        f"converted {src} (datatrove) to {out}: 2 shards, 3 documents, 7 tokens as uint16, tokenizer gpt2\n")
    ds = open_dataset(out)
    assert ds.tokens(0, 7).tolist() == [5, 6, 0, 4464, 0, 9, 0] and ds.document_ends.tolist() == [3, 5, 7]
    big = write_mmidx(tmp_path / "big", [[[1, 70000]], [[2]]], "int32")  # an id past uint16: uint32 tokens
    run_cli("convert", big, "-o", tmp_path / "big-out")
    assert open_dataset(tmp_path / "big-out").dtype.name == "uint32"


def test_convert_refuses_bad_requests_in_one_line(tmp_path, fixture_dataset):
    prefix = write_mmidx(tmp_path / "d", DOCS, "int32")
    (tmp_path / "taken").mkdir()
    (tmp_path / "taken" / "x").write_text("")
    neg = write_mmidx(tmp_path / "neg", [[[5, -3]]], "int32")
    cases = [
        (("convert", prefix, "-o", tmp_path / "taken"),
         f"{tmp_path}/taken: exists; pass --overwrite to replace it, or choose another output folder"),
        (("convert", fixture_dataset, "-o", tmp_path / "o"),
         f"{fixture_dataset}: already a Nanoset dataset (it has nanoset.json); nothing to convert"),
        (("convert", neg, "-o", tmp_path / "o"),
         f"{tmp_path}/neg.bin: negative token id -3 at position 1; token ids must be ≥ 0"),
        (("convert", prefix, "-o", tmp_path, "--overwrite"),
         f"{tmp_path}: holds the data being converted ({prefix}); choose another output folder"),
        (("convert", prefix, "-o", tmp_path / "o", "--eos-token", "<|endoftext|>"),
         "--eos-token needs --tokenizer (the tokenizer that made the data)"),
    ]
    big = write_mmidx(tmp_path / "big", [[[1, 70000]]], "int32")
    cases.append((("convert", big, "-o", tmp_path / "o", "--tokenizer", TOKENIZER),
                  f"{big}: holds token id 70000, ≥ the vocab size {open_vocab()} of tokenizer {str(TOKENIZER)!r}; "
                  f"pass the tokenizer the data was made with"))
    (tmp_path / "file").write_text("")  # an output under a file: was a bare "[Errno 17] File exists" line
    cases.append((("convert", prefix, "-o", tmp_path / "file" / "o"),
                  f"{tmp_path}/file/o: {tmp_path}/file is a file, not a folder; choose another output folder"))
    for args, message in cases:
        proc = run_cli(*args, check=False)
        assert (proc.returncode, proc.stderr) == (1, f"error: {message}\n"), args
    assert not (tmp_path / "o").exists() and [p.name for p in (tmp_path / "taken").iterdir()] == ["x"]
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]


def open_vocab() -> int:
    from tokenizers import Tokenizer

    return Tokenizer.from_file(str(TOKENIZER / "tokenizer.json")).get_vocab_size(with_added_tokens=True)


# ---------------------------------------------------------------- the runtime ------

def test_a_stage_on_a_megatron_prefix_plans_and_reads_windows(tmp_path):
    rng = np.random.default_rng(3)
    docs = [[rng.integers(0, 8192, size=int(rng.integers(1, 40))).tolist()] for _ in range(60)]
    prefix = build_with_megatron(tmp_path / "mg" / "web_text_document", docs, "int32")
    stream = np.concatenate([d[0] for d in docs])
    ends = np.cumsum([len(d[0]) for d in docs])
    stages = [{"name": "s", "start_training_step": 1,
               "data": {"use_position_ids": True, "dataset": {"dataset_folder": str(prefix)}}}]
    plan = DataPlan(make_config(seq=16, train_steps=4, stages=stages))
    windows = plan.datasets[0]
    assert (windows.reader.format, windows.num_samples) == ("megatron", (len(stream) - 1) // 16)
    _, loc = plan.global_batch(3)
    rows = windows.tokens(np.asarray(loc.sample))
    for row, i in zip(rows, loc.sample.tolist()):
        assert row.tolist() == stream[i * 16 : i * 16 + 17].tolist()
    same, starts, restarts = TokenWindows(prefix, 16), set(ends.tolist()), 0
    for i in loc.sample.tolist():
        expected, start = [], 0
        for p in range(17):  # the position within the document, restarting where a document begins
            start = p if i * 16 + p in starts else start
            expected.append(p - start)
        assert same.position_ids(i).tolist() == windows.position_ids(i).tolist() == expected
        restarts += expected[1:].count(0)
    assert restarts > 0


def test_training_on_a_megatron_prefix_equals_training_on_the_same_datatrove_shard(tmp_path, shards):
    """The fixture web shards rewritten by megatron-core (int32) and as one datatrove shard (uint16) of the
    same name: one data fingerprint, so one sample order, and bit-identical losses."""
    web = open_dataset(shards / "shards" / "web")
    docs = [web.document(i).tolist() for i in range(web.num_documents)]
    prefix = build_with_megatron(tmp_path / "mg" / "web", [[d] for d in docs], "int32")
    write_datatrove(tmp_path / "dt", [docs], tokenizer_name="tokenizer")
    (tmp_path / "dt" / "000.ds").rename(tmp_path / "dt" / "web.ds")
    (tmp_path / "dt" / "000.ds.index").rename(tmp_path / "dt" / "web.ds.index")
    (tmp_path / "dt" / "000.ds.metadata").rename(tmp_path / "dt" / "web.ds.metadata")
    losses = []
    for name, data in (("megatron", prefix), ("datatrove", tmp_path / "dt")):
        cfg = small_config(tmp_path, tmp_path / f"run-{name}", dp=1, steps=3, interval=100, single_stage=True,
                           name=f"{name}.yaml")
        d = yaml.safe_load(cfg.read_text())
        d["data_stages"][0]["data"]["dataset"] = {"dataset_folder": str(data)}
        cfg.write_text(yaml.safe_dump(d))
        train_one(cfg, tmp_path)
        losses.append([m["loss"] for m in metrics(tmp_path / f"run-{name}") if "loss" in m])
    assert len(losses[0]) == 3 and losses[0] == losses[1]


def test_convert_keeps_a_datatrove_folders_loss_masks(tmp_path):
    src = tmp_path / "dt"
    write_datatrove(src, [[[5, 6, 0], [7, 0]], [[9, 0]]])
    (src / "000.ds.loss").write_bytes(bytes([0, 1, 1, 0, 1]))
    (src / "001.ds.loss").write_bytes(bytes([1, 1]))
    out = tmp_path / "out"
    run_cli("convert", src, "-o", out)
    ds = open_dataset(out)
    assert ds.has_loss_masks and ds.loss_mask(0, 7).tolist() == [0, 1, 1, 0, 1, 1, 1]
    manifest = json.loads((out / "nanoset.json").read_text())
    assert manifest["loss_masks"] is True and [s["loss_tokens"] for s in manifest["shards"]] == [3, 2]
    assert run_cli("verify", out).stdout.endswith(
        "verified (checksums, shard table, index, token ids and loss masks; no EOS check: the tokenizer is unknown)\n")
    (src / "001.ds.loss").write_bytes(bytes([1, 2]))
    proc = run_cli("convert", src, "-o", tmp_path / "bad", check=False)
    assert proc.stderr == f"error: {src}/001.ds.loss: loss mask value 2 at token 1; only 0 and 1 are valid\n"


def test_a_full_disk_during_convert_is_one_line_naming_the_file(tmp_path, monkeypatch):
    from nanoset.convert import convert
    from nanoset.format import writer

    prefix = write_mmidx(tmp_path / "mg", DOCS)
    real_open = open

    def full_disk(path, mode="r", *args, **kwargs):
        if str(path).endswith(".ds") and "w" in mode:
            return real_open("/dev/full", mode, *args, **kwargs)
        return real_open(path, mode, *args, **kwargs)

    monkeypatch.setattr(writer, "open", full_disk, raising=False)
    out = tmp_path / "out"
    with pytest.raises(NanosetError) as e:
        convert(prefix, out)
    assert re.fullmatch(rf"{tmp_path}/\.out\.convert-[^/]+/mg\.ds: cannot write it \(No space left on device\); "
                        rf"free some space \(or fix the cause\) and rerun the same command", str(e.value)), str(e.value)
    assert not out.exists() and not list(tmp_path.glob(".out.*"))  # nothing half written is left


def test_negative_ids_are_refused_before_training(tmp_path):
    prefix = write_mmidx(tmp_path / "neg", [[[5, 6]], [[7, -1, 8]]], "int32")
    stages = [{"name": "s", "start_training_step": 1, "data": {"dataset": {"dataset_folder": str(prefix)}}}]
    with pytest.raises(NanosetError) as e:
        DataPlan(make_config(seq=2, stages=stages))
    assert str(e.value) == f"{tmp_path}/neg.bin: negative token id -1 at position 3; token ids must be ≥ 0"


def test_data_of_an_unknown_tokenizer_beside_a_known_one_is_refused_raw_or_converted(tmp_path, shards, monkeypatch):
    """Raw Megatron data (no tokenizer recorded) blended silently with another tokenizer's dataset, while the same
    data converted without --tokenizer was refused: one rule now, saying how to record the tokenizer."""
    monkeypatch.chdir(shards)
    prefix = write_mmidx(tmp_path / "mg" / "corpus", DOCS)
    run_cli("convert", prefix, "-o", tmp_path / "converted")
    converted = tmp_path / "converted"
    for data, why in ((prefix, "Megatron data records none"), (converted, "converted without --tokenizer")):
        stages = [{"name": "s", "start_training_step": 1, "data": {"dataset": {
            "dataset_folder": ["shards/web", str(data)], "dataset_weights": [0.5, 0.5]}}}]
        with pytest.raises(NanosetError) as e:
            DataPlan(make_config(seq=4, stages=stages))
        assert str(e.value) == (
            f"data_stages: the tokenizer that made {data} is unknown ({why}), but shards/web was tokenized with "
            f"'tokenizer' sha256 {open_dataset('shards/web').tokenizer.sha256[:12]}: the ids may be another "
            f"tokenizer's; if it was made with that tokenizer, record it with `nanoset convert {data} -o OUT "
            f"--tokenizer TOKENIZER` and list OUT instead")
    alone = [{"name": "s", "start_training_step": 1, "data": {"dataset": {"dataset_folder": str(prefix)}}}]
    assert DataPlan(make_config(seq=4, stages=alone)).datasets[0].num_samples == 3  # nothing to compare it with
