"""Hugging Face checkpoints of the model families in (model.init_from_hf) and out (python -m runtime.export)."""
