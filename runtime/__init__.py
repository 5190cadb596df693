"""Nanoset's training runtime: config, data stages, the distributed engine and the trainer."""
