"""The Nanoset on-disk format: its spec, the shard writer, and readers of Nanoset, datatrove and Megatron data."""
