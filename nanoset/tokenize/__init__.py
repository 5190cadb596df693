"""The tokenize job: inputs cut into tasks, tokenized by worker processes into shards, resumable.

``plan_key`` is the key of a job's options: what, besides the inputs, decides the bytes it writes (the
runtime keys its tokenized Hugging Face datasets on it). The job's names are loaded on first use, so that
importing one part (the CLI's backend names, the runtime's tokenizer lookup) does not import the job and
its process pool."""

from typing import Any

__all__ = ["TokenizeOptions", "TokenizeSummary", "plan_key", "tokenize"]


def __getattr__(name: str) -> Any:
    if name in __all__:
        from nanoset.tokenize import job

        return getattr(job, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
