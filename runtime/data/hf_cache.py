"""The old name of ``runtime.data.hf_datasets`` (Hugging Face *datasets* tokenized into the cache; ``runtime.hf``
is Hugging Face *models*), kept because error messages and scripts named
``runtime.data.hf_cache.resolve_stage_folders``."""

from runtime.data.hf_datasets import resolve_stage_folders

__all__ = ["resolve_stage_folders"]
