"""The test suite: tests/nanoset (the toolkit), tests/runtime (the training runtime), tests/cluster (real
torchrun agents); tests/support (what they share)."""
