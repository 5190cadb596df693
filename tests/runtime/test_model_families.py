"""Model families behind their ``ModelSpec``: the registry, what a family supports, its counts against the model
it builds."""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path

import pytest
import torch

from runtime.config import ConfigError, ModelArgs
from runtime.models import registry
from runtime.models.spec import Support
from runtime.observe.metrics import flops_per_token, parameter_count
from tests.support.configs import TINY, build, merged

FAMILIES = sorted(registry.FAMILIES)


def test_an_unknown_family_is_one_line():
    with pytest.raises(ConfigError) as e:
        build(merged(TINY, model={"family": "gpt2"}))
    assert str(e.value) == f"model.family: 'gpt2' is not one of {', '.join(registry.FAMILIES)}"


@pytest.mark.parametrize("what, section, refused", [
    ("context_parallel", {"parallelism": {"cp": 2}}, "parallelism.cp > 1"),
    ("document_masks", {"model": {"attention": "document"}}, "model.attention: document"),
    ("tied_embeddings", {"model": {"tie_word_embeddings": True}}, "model.tie_word_embeddings: true"),
])
def test_a_feature_the_family_does_not_support_is_one_line(monkeypatch, what, section, refused):
    spec = registry.FAMILIES["llama"]
    monkeypatch.setitem(registry.FAMILIES, "llama", dataclasses.replace(spec, support=Support(**{what: False})))
    data = merged(TINY, **section)
    data["data_stages"][0]["data"]["use_position_ids"] = True
    with pytest.raises(ConfigError) as e:
        build(data)
    assert str(e.value) == f"{refused}: model.family llama's model does not support it (docs/models.md)"


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("model", [{"tie_word_embeddings": True}, {"num_key_value_heads": 1, "head_dim": 24}])
def test_the_counts_are_the_family_models(family, model):
    """The parameter count is every parameter of the model the family builds (a tied head once); the FLOPs' matrix
    weights are the layers' 2-D weights (no biases, no norms)."""
    args = ModelArgs(family=family, hidden_size=32, num_hidden_layers=3, num_attention_heads=4, intermediate_size=80,
                     vocab_size=500, max_position_embeddings=64, **model)
    chunk = registry.model_spec(family).modules().chunk(args)
    assert parameter_count(args).total == sum(p.numel() for p in chunk.parameters())
    matrices = sum(p.numel() for n, p in chunk.named_parameters() if n.startswith("layers.") and p.ndim == 2)
    q = 4 * args.head_size
    assert flops_per_token(args, 16) == 6 * (matrices + 500 * 32) + 12 * 3 * q * 16


def test_the_engine_builds_and_initialises_through_the_spec():
    """A fresh model's weights: norms 1, biases 0 (where a family has them), the rest seeded by name."""
    from runtime.models.init import init_weights

    config = build(merged(TINY))
    chunk = registry.spec_of(config.model).modules().chunk(config.model)
    init_weights(chunk, config.model, seed=7)
    for name, p in chunk.named_parameters():
        if name.endswith("norm.weight"):
            assert torch.equal(p, torch.ones_like(p)), name
        elif name.endswith(".bias"):
            assert torch.equal(p, torch.zeros_like(p)), name
        else:
            assert 0.005 < p.std().item() < 0.03, name


# ---------------------------------------------------------------- Qwen2 and Qwen3 against transformers ---------

QWEN = ("qwen2", "qwen3")
# one launched group per world size runs every family's layouts: dp 1 (and a fresh run), then tp 2, pp 2, cp 2, and
# dp 2 (FSDP2, activation checkpointing; both replicas get the same rows, so the global batch's mean is dp 1's)
DP1 = [({}, "dp1"), ({"attention": "document"}, "dp1-doc")]
WORLD2 = [({"tp": 2, "checkpoint": True}, "tp2"), ({"pp": 2}, "pp2"), ({"cp": 2, "attention": "document"}, "cp2-doc"),
          ({"dp": 2, "activation_checkpointing": "full"}, "dp2")]


@pytest.fixture(scope="module")
def qwen_runs(tmp_path_factory):
    """Both families' tiny models saved by transformers (Qwen2 untied, Qwen3 tied), and what our runs of them
    gave in every layout: ``(folders, ids, results)``."""
    from tests.support.harness import run_distributed
    from tests.support.hf_models import save_family_hf
    from tests.support.hf_workers import family_layouts_worker

    tmp = tmp_path_factory.mktemp("qwen")
    folders = {f: str(save_family_hf(tmp / f, f, tie=f == "qwen3")) for f in QWEN}
    ids = torch.randint(0, 96, (4, 17), generator=torch.Generator().manual_seed(5))
    one = [(f"{f}-{n}", folders[f], layout) for f in QWEN for layout, n in DP1]
    one += [(f"{f}-fresh", "", {"family": f}) for f in QWEN]
    run_distributed(1, family_layouts_worker, one, ids, str(tmp))
    two = [(f"{f}-{n}", folders[f], layout) for f in QWEN for layout, n in WORLD2]
    run_distributed(2, family_layouts_worker, two, ids, str(tmp))
    results = {p.stem: torch.load(p) for p in tmp.glob("*.pt")}
    return folders, ids, results, tmp


@pytest.mark.parametrize("family", QWEN)
def test_qwen_logits_and_step_one_loss_equal_transformers_in_every_layout(qwen_runs, family):
    """dp 1, tp 2 (biases and per-head norms on local heads) and pp 2 (a tied head on the other stage): the logits
    equal transformers' (fp32, 1e-5) and the step-1 loss too (1e-6 relative), and the step's gradient norm is dp 1's
    (the per-head norms' gradients summed over the tp ranks), also at dp 2 with FSDP2 and activation checkpointing;
    cp 2 with document masks equals dp 1 with them."""
    from tests.support.hf_models import reference_logits, reference_loss

    folders, ids, results, _ = qwen_runs
    theirs = reference_logits(folders[family], ids[:, :-1])
    loss = reference_loss(folders[family], ids)
    for layout in ("dp1", "tp2", "pp2", "dp2"):
        got = results[f"{family}-{layout}"]
        torch.testing.assert_close(got["logits"], theirs, rtol=0, atol=1e-5, msg=layout)
        assert got["loss"] == pytest.approx(loss, rel=1e-6), layout
        assert got["grad_norm"] == pytest.approx(results[f"{family}-dp1"]["grad_norm"], rel=1e-5), layout
    document, cp = results[f"{family}-dp1-doc"], results[f"{family}-cp2-doc"]
    assert abs(document["loss"] - loss) > 1e-3  # the document mask matters here
    assert cp["loss"] == pytest.approx(document["loss"], rel=1e-5)
    assert cp["grad_norm"] == pytest.approx(document["grad_norm"], rel=1e-5)


@pytest.mark.parametrize("family", QWEN)
def test_a_fresh_qwen_model_trains(qwen_runs, family):
    losses = qwen_runs[2][f"{family}-fresh"]["losses"]
    assert losses[0] == pytest.approx(math.log(128), rel=0.02)  # seeded weights: about uniform over the vocabulary
    assert losses[0] > losses[1] > losses[2]


@pytest.mark.parametrize("family", QWEN)
def test_qwen_export_is_tensor_identical_and_loads_in_transformers(qwen_runs, family):
    """The checkpoint of the weights loaded at tp 2 exports as the original files' tensors and config, and
    transformers loads it as the family's model and computes the same logits."""
    from runtime.hf.export import export_checkpoint
    from tests.support.hf_models import reference_logits, tensors, transformers

    folders, ids, _, tmp = qwen_runs
    out = export_checkpoint(tmp / f"{family}-tp2-ckpt", tmp / f"{family}-export")
    original, exported = tensors(Path(folders[family])), tensors(out)
    assert sorted(exported) == sorted(original) and all(torch.equal(exported[n], t) for n, t in original.items())
    theirs = transformers.AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32)
    assert type(theirs).__name__ == {"qwen2": "Qwen2ForCausalLM", "qwen3": "Qwen3ForCausalLM"}[family]
    torch.testing.assert_close(reference_logits(out, ids), reference_logits(Path(folders[family]), ids), rtol=0,
                               atol=0)


def test_init_from_hf_sets_the_family_and_refuses_what_qwen_cannot_be(tmp_path):
    from runtime.config.load import load_config
    from tests.support.hf_models import edit_config, save_family_hf, write_yaml

    hf = save_family_hf(tmp_path / "hf", "qwen3")
    config = load_config(write_yaml(tmp_path, hf))
    assert (config.model.family, config.model.head_dim, config.model.head_size) == ("qwen3", 16, 16)
    assert load_config(write_yaml(tmp_path, hf, family="qwen3")).model.family == "qwen3"
    import json

    import transformers

    no_head_dim = tmp_path / "no-head-dim"
    no_head_dim.mkdir()
    cfg = json.loads((hf / "config.json").read_text())
    del cfg["head_dim"]  # transformers then takes Qwen3Config's default, 128: so must we
    (no_head_dim / "config.json").write_text(json.dumps(cfg))
    assert transformers.Qwen3Config.from_pretrained(no_head_dim).head_dim == 128
    assert load_config(write_yaml(tmp_path, no_head_dim)).model.head_size == 128
    with pytest.raises(ConfigError) as e:
        load_config(write_yaml(tmp_path, hf, family="qwen2"))
    assert str(e.value) == (f"{tmp_path / 'cfg.yaml'}: model.family: qwen2 in the config but qwen3 in "
                            f"{hf / 'config.json'} (model.init_from_hf); remove the key or make them agree")
    for changes, line in [
        ({"use_sliding_window": True, "sliding_window": 8}, "use_sliding_window True is not supported (our Qwen3 "
                                                            "has use_sliding_window False)"),
        ({"attention_bias": True}, "attention_bias True is not supported (our Qwen3 has attention_bias False)"),
    ]:
        edit_config(hf, **changes)
        with pytest.raises(ConfigError) as e:
            load_config(write_yaml(tmp_path, hf))
        assert str(e.value).endswith(f"model.init_from_hf: {hf / 'config.json'}: {line}")
        edit_config(hf, use_sliding_window=False, sliding_window=None, attention_bias=False)
    qwen2 = save_family_hf(tmp_path / "qwen2", "qwen2", use_sliding_window=True, sliding_window=8)
    with pytest.raises(ConfigError, match="use_sliding_window True is not supported \\(our Qwen2 has"):
        load_config(write_yaml(tmp_path, qwen2))


def test_a_checkpoint_of_another_family_is_refused_and_old_records_are_llama(tmp_path):
    """Resuming a Qwen3 checkpoint as Llama would silently drop its q/k norms: refused in one line. A record written
    before model.family existed is a Llama's."""
    from types import SimpleNamespace

    from runtime.checkpoint.layout import check_same_model

    llama = build(merged(TINY))
    qwen3 = build(merged(TINY, model={"family": "qwen3"}))
    record = SimpleNamespace(model=qwen3.to_dict()["model"])
    with pytest.raises(ConfigError, match=r"saved with another model: model.family qwen3 → llama; use the"):
        check_same_model(llama, record, tmp_path)
    old = {k: v for k, v in llama.to_dict()["model"].items() if k != "family"}
    check_same_model(llama, SimpleNamespace(model=old), tmp_path)
    with pytest.raises(ConfigError, match=r"model.family llama → qwen3"):
        check_same_model(qwen3, SimpleNamespace(model=old), tmp_path)
