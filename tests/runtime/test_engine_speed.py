"""model.compile and model.activation_checkpointing train exactly like the plain engine."""

from __future__ import annotations

import json
import shutil

import pytest

from runtime.parallel.parallelize import checkpointed_layers
from tests.support.harness import run_distributed


def _runs(tmp_path, runs: dict) -> dict:
    from tests.support.speed_workers import train_modes

    out = tmp_path / "runs.json"
    run_distributed(1, train_modes, runs, str(out))
    return json.loads(out.read_text())


def test_checkpointed_layers_are_chosen_by_global_index():
    assert checkpointed_layers(5, "none", 2) == set()
    assert checkpointed_layers(5, "full", 2) == {0, 1, 2, 3, 4}
    assert checkpointed_layers(5, "selective", 2) == {0, 2, 4}
    assert checkpointed_layers(5, "selective", 3) == {0, 3}


def test_activation_checkpointing_gives_the_same_losses(tmp_path):
    out = _runs(tmp_path, {
        "none": {},
        "full": {"activation_checkpointing": "full"},
        "selective": {"activation_checkpointing": "selective", "activation_checkpointing_every": 2},
    })
    # 5 steps × 2 micro-batches: 10 forward calls, 20 where the layer is recomputed in the backward pass
    assert out["none"]["mlp_calls"] == [10, 10, 10]
    assert out["full"]["mlp_calls"] == [20, 20, 20]
    assert out["selective"]["mlp_calls"] == [20, 10, 20]
    for mode in ("full", "selective"):
        assert out[mode]["names"] == out["none"]["names"]  # checkpoints and exports see the same names
        assert max(abs(a - b) for a, b in zip(out[mode]["losses"], out["none"]["losses"])) <= 1e-6


def _can_compile() -> str | None:
    if shutil.which("g++") is None and shutil.which("c++") is None:
        return "torch.compile on CPU (inductor) needs a C++ compiler (g++), none found"
    return None


@pytest.mark.skipif(_can_compile() is not None, reason=str(_can_compile()))
def test_compiled_layers_give_the_same_losses(tmp_path):
    out = _runs(tmp_path, {"eager": {}, "compiled": {"compile": True},
                           "compiled_checkpointed": {"compile": True, "activation_checkpointing": "full"}})
    for name in ("compiled", "compiled_checkpointed"):
        assert out[name]["names"] == out["eager"]["names"]
        assert max(abs(a - b) for a, b in zip(out[name]["losses"], out["eager"]["losses"])) <= 1e-4
    assert out["compiled"]["unique_graphs"] == 1  # one graph for every layer: they share their code


@pytest.mark.parametrize("model, fragment", [
    ({"activation_checkpointing": "partial"},
     "model.activation_checkpointing: 'partial' is not one of ['none', 'full', 'selective']"),
    ({"activation_checkpointing_every": 0}, "model.activation_checkpointing_every: must be > 0, got 0"),
    ({"compile": "yes"}, "model.compile: expected true or false, got 'yes'"),
])
def test_bad_speed_settings_are_one_clear_error(model, fragment):
    from runtime.config import ConfigError
    from tests.support.configs import tiny_config

    with pytest.raises(ConfigError) as e:
        tiny_config(**model)
    assert str(e.value) == fragment
