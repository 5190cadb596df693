"""The one place that opens a dataset, whatever its format: a Nanoset folder (its manifest), a plain
datatrove folder, or Megatron data (a ``PREFIX`` or a folder of ``.bin``/``.idx`` pairs). The readers
know only their own format; a tokenize output whose tasks are not all done is refused here.
"""

from __future__ import annotations

from pathlib import Path

from nanoset.errors import NanosetError
from nanoset.format.datatrove import open_datatrove
from nanoset.format.megatron import megatron_prefixes, open_megatron
from nanoset.format.reader import NanosetReader, ShardReader
from nanoset.format.spec import MANIFEST_NAME, Manifest, TokenizerInfo, dtype_from_name, work_progress


def open_dataset(path: str | Path) -> NanosetReader:
    """Open a Nanoset folder (with ``nanoset.json``), a plain datatrove folder of ``*.ds`` shards, or a
    Megatron dataset (a ``PREFIX`` of ``PREFIX.bin`` + ``PREFIX.idx``, or a folder of such pairs)."""
    folder = Path(path)
    prefixes = megatron_prefixes(folder)
    if prefixes is not None:
        return open_megatron(folder, prefixes)
    if not folder.is_dir():
        raise NanosetError(f"{folder}: no such dataset folder (create it with `nanoset tokenize ... -o {folder}`)")
    if not (folder / MANIFEST_NAME).is_file():
        _refuse_unfinished(folder)
    if (folder / MANIFEST_NAME).is_file():
        manifest = Manifest.load(folder)
        dtype = dtype_from_name(manifest.dtype)
        shards = [ShardReader(folder, s.name, dtype, s.num_tokens, s.num_documents, has_loss=manifest.loss_masks)
                  for s in manifest.shards]
        tokenizer: TokenizerInfo | None = manifest.tokenizer
    else:
        manifest = None
        shards, tokenizer = open_datatrove(folder)
    if not shards:
        raise NanosetError(f"{folder}: the dataset has no shards")
    for shard in shards:
        shard.check_sizes()
    return NanosetReader(folder, shards, tokenizer, manifest)


def _refuse_unfinished(folder: Path) -> None:
    """A tokenize output whose tasks are not all done holds shards but is no dataset yet."""
    progress = work_progress(folder)
    if progress is None:
        return
    done, total = progress
    raise NanosetError(
        f"{folder}: unfinished `nanoset tokenize` output ({done} of {total if total is not None else '?'} tasks done, "
        f"no {MANIFEST_NAME} yet); finish it by rerunning the same tokenize command without --num-tasks/--task-index "
        f"(finished tasks are kept), or run the missing --task-index values"
    )
