"""Hugging Face Llama in (model.init_from_hf): logits against transformers itself, in every layout."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
import torch
from torch.distributed.checkpoint import FileSystemReader

from tests.support.configs import hf_config
from tests.support.harness import run_distributed
from tests.support.hf_workers import resumed_logits_worker

pytest.importorskip("transformers")

from runtime.config import ConfigError  # noqa: E402
from runtime.hf.export import export_checkpoint  # noqa: E402
from runtime.hf.load import check_hf_weights  # noqa: E402
from tests.support.hf_models import (
    LLAMA3,
    VOCAB,
    edit_config,
    fixed_ids,
    ours,
    reference_logits,
    rewrite_weights,
    safetensors_torch,
    save_hf,
    tensors,
)


@pytest.mark.parametrize("layout", [{}, {"tp": 2}, {"pp": 2}], ids=["dp1", "tp2", "pp2"])
def test_logits_match_transformers_untied(tmp_path, layout):
    hf = save_hf(tmp_path / "hf", shard="20KB" if layout else None)  # tp 2, pp 2: from a sharded folder
    assert (hf / "model.safetensors.index.json").is_file() == bool(layout)
    ids = fixed_ids()
    torch.testing.assert_close(ours(tmp_path, hf, layout, ids), reference_logits(hf, ids), rtol=0, atol=1e-5)


@pytest.mark.parametrize("layout,resumed_in", [({}, {"tp": 2}), ({"dp": 2}, {"pp": 2}), ({"pp": 2}, {}),
                                               ({"pp": 2, "tp": 2}, {"tp": 2})],
                         ids=["dp1", "dp2-fsdp", "pp2", "pp2-tp2"])
def test_logits_match_transformers_tied(tmp_path, layout, resumed_in):
    """Tied: one tensor in and out, also when pp puts embedding and head on different ranks (the export
    of each checkpoint is the original file's tensors; it resumes in another layout)."""
    hf = save_hf(tmp_path / "hf", tie=True)
    ids = fixed_ids()
    with safetensors_torch.safe_open(hf / "model.safetensors", "pt") as f:
        assert "lm_head.weight" not in f.keys()  # a tied model stores the embedding once
    logits = ours(tmp_path, hf, layout, ids, checkpoint=str(tmp_path / "ckpt"), tokenizer=None)
    torch.testing.assert_close(logits, reference_logits(hf, ids), rtol=0, atol=1e-5)
    (step,) = (tmp_path / "ckpt").glob("step-*")
    saved = FileSystemReader(step).read_metadata().state_dict_metadata
    assert sorted(k for k in saved if "embed" in k or "lm_head" in k) == [  # the tied weight once, any layout
        "model.embed_tokens.weight", "optimizer.embed_tokens.weight.exp_avg",
        "optimizer.embed_tokens.weight.exp_avg_sq", "optimizer.embed_tokens.weight.step"]
    world = resumed_in.get("tp", 1) * resumed_in.get("pp", 1)
    run_distributed(world, resumed_logits_worker, str(hf), resumed_in, ids, str(tmp_path / "resumed.pt"),
                    str(tmp_path / "ckpt"))
    torch.testing.assert_close(torch.load(tmp_path / "resumed.pt"), logits, rtol=0, atol=1e-5)
    out = export_checkpoint(tmp_path / "ckpt", tmp_path / "out")
    original, exported = tensors(hf), tensors(out)
    assert sorted(exported) == sorted(original) and all(torch.equal(exported[n], t) for n, t in original.items())
    assert json.loads((out / "config.json").read_text())["tie_word_embeddings"] is True
    assert "no tokenizer recorded" in json.loads((out / "nanoset_export.json").read_text())["tokenizer"]


def test_llama31_rope_scaling_and_head_dim_match_transformers(tmp_path):
    """Llama 3.1 rope scaling (positions past original_max_position_embeddings) and a head_dim ≠ hidden/heads."""
    hf = save_hf(tmp_path / "hf", rope_scaling=dict(LLAMA3), head_dim=16)  # transformers edits it
    config = hf_config(hf, tp=2)
    assert dataclasses.asdict(config.model.rope_scaling) == LLAMA3
    assert config.model.head_dim == 16 and config.model.head_size == 16
    ids = fixed_ids()
    theirs = reference_logits(hf, ids)
    torch.testing.assert_close(ours(tmp_path, hf, {"tp": 2}, ids), theirs, rtol=0, atol=1e-5)
    # the scaling matters here: without it the logits differ
    plain = save_hf(tmp_path / "plain", head_dim=16)
    assert (reference_logits(plain, ids) - theirs).abs().max() > 1e-3


def test_exported_config_json_reproduces_llama31_scaling(tmp_path):
    """The config.json export writes (both rope forms, head_dim) makes transformers compute the same logits."""
    from runtime.hf.export import hf_config_json

    hf = save_hf(tmp_path / "hf", rope_scaling=dict(LLAMA3), head_dim=16)
    ids = torch.randint(0, VOCAB, (1, 60), generator=torch.Generator().manual_seed(1))  # far past 8 positions
    theirs = reference_logits(hf, ids)
    cfg = hf_config_json(hf_config(hf).model, bos_id=None, eos_id=0, dtype="float32")
    assert cfg["rope_parameters"] == {**LLAMA3, "rope_theta": 5000.0} and cfg["rope_scaling"] == LLAMA3
    (hf / "config.json").write_text(json.dumps(cfg))
    torch.testing.assert_close(reference_logits(hf, ids), theirs, rtol=0, atol=0)


def test_transformers4_config_form(tmp_path):
    """rope_theta and rope_scaling at the top level (transformers 4) read as rope_parameters (5)."""
    hf = save_hf(tmp_path / "hf")
    cfg = json.loads((hf / "config.json").read_text())
    cfg.pop("rope_parameters")
    cfg.update(rope_theta=123.0, rope_scaling={"type": "linear", "factor": 2.0})
    (hf / "config.json").write_text(json.dumps(cfg))
    m = hf_config(hf).model
    assert (m.rope_theta, m.rope_scaling.rope_type, m.rope_scaling.factor) == (123.0, "linear", 2.0)
    cfg["rope_parameters"] = {"rope_type": "dynamic", "factor": 2.0}  # the 5 form wins, rope_theta beside it
    (hf / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ConfigError, match="rope scaling 'dynamic' is not supported"):
        hf_config(hf)
    assert (m.hidden_size, m.num_hidden_layers, m.num_key_value_heads, m.vocab_size, m.rms_norm_eps) == (
        32, 2, 2, VOCAB, 1e-5)


def test_a_pipeline_stage_opens_only_the_files_of_its_tensors(tmp_path, monkeypatch):
    """The second of two pipeline chunks (layer 1, norm, head) reads from the shard files that hold them, no other."""
    import safetensors

    from runtime.hf.load import hf_name, load_hf_weights
    from runtime.models.llama import LlamaChunk

    hf = save_hf(tmp_path / "hf", shard="20KB")
    weight_map = json.loads((hf / "model.safetensors.index.json").read_text())["weight_map"]
    opened = []
    real = safetensors.safe_open
    monkeypatch.setattr(safetensors, "safe_open", lambda path, *a, **k: opened.append(Path(path).name) or real(
        path, *a, **k))
    chunk = LlamaChunk(hf_config(hf).model, 1, 2)
    assert load_hf_weights([chunk], hf) == 9 + 2  # layer 1 (two norms, four attention, three MLP), norm, head
    needed = {weight_map[hf_name(n)] for n, _ in chunk.named_parameters()}
    assert sorted(opened) == sorted(needed) and len(needed) < len(set(weight_map.values()))
    original = tensors(hf)
    for name, p in chunk.named_parameters():
        assert torch.equal(p.detach(), original[hf_name(name)]), name


def test_a_tied_model_whose_file_holds_another_head_is_refused(tmp_path):
    """A tied config.json whose weights also hold a *different* ``lm_head.weight``: transformers keeps both
    (untied), so taking the embedding as the head would silently give other logits (was: max 22 apart)."""
    hf = save_hf(tmp_path / "hf", tie=True)
    rewrite_weights(hf, lambda s: s.__setitem__("lm_head.weight", s["model.embed_tokens.weight"].clone()))
    check_hf_weights(hf_config(hf).model)  # an equal copy is a tied model saved with both names: fine
    rewrite_weights(hf, lambda s: s["lm_head.weight"].mul_(-1))
    with pytest.raises(ConfigError) as e:
        check_hf_weights(hf_config(hf).model)
    assert str(e.value) == (f"model.init_from_hf: {hf / 'model.safetensors'}: lm_head.weight differs from "
                            f"model.embed_tokens.weight, but config.json says tie_word_embeddings: true (transformers "
                            f"would not tie them); set \"tie_word_embeddings\": false in a copy of "
                            f"{hf / 'config.json'} to train them untied")
    edit_config(hf, tie_word_embeddings=False)  # what the message says: the two weights, untied
    ids = fixed_ids()
    torch.testing.assert_close(ours(tmp_path, hf, {}, ids), reference_logits(hf, ids), rtol=0, atol=1e-5)
