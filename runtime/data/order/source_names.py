"""The names of a run's data sources as users see them (console, metrics, plots, W&B, explain): the name the config
gives (``dataset_folder: {name: folder}``), else the folder's last component, made unique - never an absolute path."""

from __future__ import annotations

from pathlib import PurePosixPath


def folder_names(folders: list[str], taken: set[str] | frozenset[str] = frozenset()) -> dict[str, str]:
    """Folder → its last path component (a URL's too), ``-2``, ``-3``, ... for the second and third of one name
    (and past the names in ``taken``)."""
    out: dict[str, str] = {}
    used = set(taken)
    for folder in dict.fromkeys(folders):
        base = PurePosixPath(str(folder).rstrip("/")).name or str(folder)
        name, k = base, 1
        while name in used:
            k += 1
            name = f"{base}-{k}"
        used.add(name)
        out[folder] = name
    return out


def source_names(plan) -> dict[str, str]:
    """Each dataset of a ``DataPlan`` (its folder, as the metrics rows and ``explain`` key it) → its source's name:
    the config's (``dataset_folder: {name: folder}``), else the last component of the folder (of a Hugging Face
    stage: of the dataset it tokenized), made unique."""
    given: dict[str, str] = {}
    for part in plan.stages:
        names = getattr(plan.config.data_stages[part.index].data.dataset, "names", None)
        for d, name in zip(part.dataset_ids, names or []):
            given.setdefault(plan.datasets[d].folder, name)
    shown = plan.source_names()  # folder → the folder, or a Hugging Face stage's dataset
    rest = [f for f in shown if f not in given]
    auto = folder_names([shown[f] for f in rest], set(given.values()))
    return {f: given[f] if f in given else auto[shown[f]] for f in shown}
