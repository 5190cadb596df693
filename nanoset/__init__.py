"""Nanoset: binary token datasets (datatrove/Nanotron compatible shards plus a manifest).

This package never imports torch; the training runtime lives in ``runtime``.
"""

from nanoset.errors import NanosetError
from nanoset.format.open import open_dataset
from nanoset.format.reader import NanosetReader
from nanoset.format.spec import Manifest, ShardInfo, TokenizerInfo
from nanoset.format.writer import ShardWriter, write_manifest

__all__ = [
    "Manifest",
    "NanosetError",
    "NanosetReader",
    "ShardInfo",
    "ShardWriter",
    "TokenizerInfo",
    "open_dataset",
    "write_manifest",
]
