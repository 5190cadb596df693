"""The names of a run's data sources as users see them (console, metrics, plots, W&B, explain): the name the config
gives (``dataset_folder: {name: folder}``), else the folder's last component, made unique - never an absolute path."""

from __future__ import annotations

from pathlib import PurePosixPath


def folder_names(folders: list[str]) -> dict[str, str]:
    """Folder → its last path component (a URL's too), ``-2``, ``-3``, ... for the second and third of one name."""
    out: dict[str, str] = {}
    count: dict[str, int] = {}
    for folder in dict.fromkeys(folders):
        base = PurePosixPath(str(folder).rstrip("/")).name or str(folder)
        count[base] = count.get(base, 0) + 1
        out[folder] = base if count[base] == 1 else f"{base}-{count[base]}"
    return out
