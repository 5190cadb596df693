"""The tokenize job: inputs cut into tasks, tokenized by worker processes into shards, resumable."""

from nanoset.tokenize.job import TokenizeOptions, TokenizeSummary, tokenize

__all__ = ["TokenizeOptions", "TokenizeSummary", "tokenize"]
