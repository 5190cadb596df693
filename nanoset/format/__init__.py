"""The Nanoset on-disk format: its spec, the shard writer, and readers of Nanoset, datatrove and Megatron data.

``Manifest.load`` is given to the spec's ``Manifest`` here, where the package is assembled: it reads through the
shard table (``nanoset.format.shardtable``), which builds on the spec."""

from pathlib import Path

from nanoset.format.spec import MANIFEST_NAME, Manifest


def _load(folder: str | Path) -> Manifest:
    """The manifest of ``folder``, its shards read as a ShardTable (the records stay on disk until needed): from
    the shard table beside it, else from the manifest itself."""
    from nanoset.format.shardtable import load_manifest

    return load_manifest(Path(folder) / MANIFEST_NAME)


Manifest.load = staticmethod(_load)
