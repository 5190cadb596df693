"""Checkpoints: their layout (step-N names, latest, the metadata file), the store (DCP, RNG, pruning)
and the run folder."""
