"""Hugging Face Llama checkpoints in (model.init_from_hf) and out (python -m runtime.export)."""
