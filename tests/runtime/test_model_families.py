"""Model families behind their ``ModelSpec``: the registry, what a family supports, its counts against the model
it builds."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from runtime.config import ConfigError, ModelArgs
from runtime.metrics import flops_per_token, parameter_count
from runtime.models import registry
from runtime.models.spec import Support
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
