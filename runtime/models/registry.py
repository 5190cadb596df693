"""The model families the runtime trains, by their ``model.family`` name: a family is its folder under
``runtime/models/`` and one line here. Torch-free (the config reads it)."""

from __future__ import annotations

from nanoset.errors import ConfigError
from runtime.models import llama, qwen2, qwen3
from runtime.models.spec import ModelSpec

FAMILIES: dict[str, ModelSpec] = {spec.name: spec for spec in (
    llama.SPEC,
    qwen2.SPEC,
    qwen3.SPEC,
)}
DEFAULT_FAMILY = "llama"


def model_spec(family: str) -> ModelSpec:
    """The spec of ``family`` (``model.family``); an unknown name is one line."""
    spec = FAMILIES.get(family)
    if spec is None:
        raise ConfigError(f"model.family: {family!r} is not one of {', '.join(FAMILIES)}")
    return spec


def spec_of(model_args) -> ModelSpec:
    """The spec of a ``model`` section (one without ``family``, as older code builds them: Llama)."""
    return model_spec(getattr(model_args, "family", DEFAULT_FAMILY))


def family_of_architectures(architectures: list) -> ModelSpec | None:
    """The family whose Hugging Face ``architectures`` include one of ``architectures`` (None: no family's)."""
    return next((s for s in FAMILIES.values() if any(a in s.hf_architectures for a in architectures)), None)
