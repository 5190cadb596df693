"""How the run names its datasets: the folders a user writes (any spelling, or a Hugging Face stage's source)
mapped to the plan's datasets, and the names a log or report shows for each.
"""

from __future__ import annotations

from nanoset import storage
from nanoset.errors import ConfigError
from runtime.config import Config, DatasetStageArgs, HFDatasetArgs
from runtime.data.order.surgery import FINGERPRINT, dataset_key


def resolved(folder: str) -> str:
    """The one spelling of a dataset folder: ``A``, ``./A`` and ``/abs/A`` (or a link to it) are one dataset."""
    return storage.resolved(folder)


class DatasetNames:
    """The plan's datasets by name: per dataset (index into ``DataPlan.datasets``), the resolved folder it is read
    from and the folder as the config spells it."""

    def __init__(self, config: Config, stage_folders: list[list[str]], recorded: dict[str, str] | None = None
                 ) -> None:
        """``recorded``: the resumed checkpoint's folders → the content fingerprint each held (what a record
        made before datasets were named by content names a dataset by, wherever it is now)."""
        self.config, self.stage_folders = config, stage_folders
        self.recorded = recorded or {}
        self.locations: list[str] = []  # resolved folder of each dataset
        self.spelled: list[str] = []  # the folder of each dataset as the config first spells it
        self.keys: list[str] = []  # the key of content of each dataset (``surgery.dataset_key``)
        self.read_from: dict[str, set[int]] = {}  # every resolved folder a stage reads → its datasets (one a
        # sequence length and packing; a copy of a dataset's content in another folder is that dataset)
        self.spelled_as: dict[str, str] = {}  # those folders as the config spells them

    def add(self, location: str, spelled: str, fingerprint: str) -> None:
        self.locations.append(location)
        self.spelled.append(spelled)
        self.keys.append(FINGERPRINT + fingerprint)

    def also(self, dataset: int, location: str, spelled: str) -> None:
        """``dataset`` is read from ``location`` too (a copy of its content in another folder is the same dataset)."""
        self.read_from.setdefault(location, set()).add(dataset)
        self.spelled_as.setdefault(location, spelled)

    def named(self, folder: str, where: str = "", shown: str | None = None) -> list[int]:
        """The datasets (one per sequence length and packing) read from ``folder``: a folder of a stage, the
        Hugging Face source of a stage (whose tokenized copy the plan reads) or a key of content (``fingerprint:F``,
        wherever the data is now); ``where`` names the asking key, ``shown`` the folder as the user knows it."""
        if folder.startswith(FINGERPRINT):
            ids = [d for d, key in enumerate(self.keys) if key == folder]
            if not ids and shown is not None and not shown.startswith(FINGERPRINT):
                # no dataset has that content any more: the folder it was named by, whose content changed (as a
                # resumed part follows its recorded folder; the record check refuses the change unless allowed)
                ids = [d for d, f in enumerate(self.locations) if f == resolved(shown)]
            return ids or self._unknown(f"{shown} ({folder})" if shown and shown != folder else folder, where)
        target = resolved(folder)
        folders = {target}
        for i, stage in enumerate(self.config.data_stages):
            ds = stage.data.dataset
            if isinstance(ds, HFDatasetArgs) and resolved(ds.hf_dataset_or_datasets) == target:
                folders.update(resolved(f) for f in self.stage_folders[i])
        ids = sorted({d for f in folders for d in self.read_from.get(f, ())})
        if not ids and target in self.recorded:  # a folder the checkpoint trained: its content, moved elsewhere
            ids = [d for d, key in enumerate(self.keys) if key == FINGERPRINT + self.recorded[target]]
        if not ids:  # a copy of a dataset of the run, as a surgery keys it (``dataset_key``): that dataset
            ids = [d for d, key in enumerate(self.keys) if key == dataset_key(target)[0]]
        return ids or self._unknown(shown or folder, where)

    def _unknown(self, folder: str, where: str) -> list[int]:
        known = ", ".join(sorted(set(self.spelled_as.values())))
        prefix = f"{where}: " if where else ""
        raise ConfigError(f"{prefix}{folder}: not a dataset of this run; its datasets are: {known}")

    def sources(self) -> dict[str, str]:
        """Each dataset's folder as ``explain`` prints it → what the config calls it: the folder, or for a stage
        of a Hugging Face dataset its source (``hf_dataset_or_datasets``), whose tokenized copy the plan reads."""
        hf = {}
        for i, stage in enumerate(self.config.data_stages):
            if isinstance(stage.data.dataset, HFDatasetArgs):
                hf.update({resolved(f): stage.data.dataset.hf_dataset_or_datasets for f in self.stage_folders[i]})
        return {shown: hf.get(f, shown) for f, shown in zip(self.locations, self.spelled)}

    def shown(self) -> dict[str, str]:
        """Each dataset's folder → how the run names it to a user: the folder, or for a stage of a Hugging Face
        dataset ``SOURCE (tokenized in FOLDER)`` (a cache folder's name says nothing of where its data came from)."""
        return {folder: folder if source == folder else f"{source} (tokenized in {folder})"
                for folder, source in self.sources().items()}


def check_listed_once(ids: list[int], fingerprints: list[str], folders: list[str], i: int,
                      stage: DatasetStageArgs) -> None:
    """One dataset listed twice in a stage (``A`` and ``./A``, or ``A`` and a copy of it: the same content
    fingerprint, so the same sample order too) would give every sample twice: refuse it."""
    where = f"data_stages[{i}] ({stage.name}).data.dataset.dataset_folder"
    first: dict[int, int] = {}
    for b, d in enumerate(ids):
        a = first.setdefault(d, b)
        if a == b:
            continue
        if resolved(folders[a]) == resolved(folders[b]):
            raise ConfigError(f"{where}: {folders[a]!r} and {folders[b]!r} are the same dataset "
                              f"({resolved(folders[a])}); list it once and merge the weights")
        raise ConfigError(f"{where}: {folders[a]!r} and {folders[b]!r} hold the same data (fingerprint "
                          f"{fingerprints[b]}), so every sample would be read twice; list one "
                          f"of them and merge the weights")
