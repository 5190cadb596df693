"""How the run names its datasets: the folders a user writes (any spelling, or a Hugging Face stage's source)
mapped to the plan's datasets, and the names a log or report shows for each.
"""

from __future__ import annotations

from nanoset import storage
from nanoset.errors import ConfigError
from runtime.config import Config, DatasetStageArgs, HFDatasetArgs
from runtime.data.order.surgery import FINGERPRINT


def resolved(folder: str) -> str:
    """The one spelling of a dataset folder: ``A``, ``./A`` and ``/abs/A`` (or a link to it) are one dataset."""
    return storage.resolved(folder)


class DatasetNames:
    """The plan's datasets by name: per dataset (index into ``DataPlan.datasets``), the resolved folder it is read
    from and the folder as the config spells it."""

    def __init__(self, config: Config, stage_folders: list[list[str]]) -> None:
        self.config, self.stage_folders = config, stage_folders
        self.locations: list[str] = []  # resolved folder of each dataset
        self.spelled: list[str] = []  # the folder of each dataset as the config first spells it
        self.keys: list[str] = []  # the key of content of each dataset (``surgery.dataset_key``)

    def add(self, location: str, spelled: str, fingerprint: str) -> None:
        self.locations.append(location)
        self.spelled.append(spelled)
        self.keys.append(FINGERPRINT + fingerprint)

    def named(self, folder: str, where: str = "", shown: str | None = None) -> list[int]:
        """The datasets (one per sequence length and packing) read from ``folder``: a folder of a stage, the
        Hugging Face source of a stage (whose tokenized copy the plan reads) or a key of content (``fingerprint:F``,
        wherever the data is now); ``where`` names the asking key, ``shown`` the folder as the user knows it."""
        if folder.startswith(FINGERPRINT):
            ids = [d for d, key in enumerate(self.keys) if key == folder]
            return ids or self._unknown(shown or folder, where)
        target = resolved(folder)
        folders = {target}
        for i, stage in enumerate(self.config.data_stages):
            ds = stage.data.dataset
            if isinstance(ds, HFDatasetArgs) and resolved(ds.hf_dataset_or_datasets) == target:
                folders.update(resolved(f) for f in self.stage_folders[i])
        ids = [d for d, f in enumerate(self.locations) if f in folders]
        return ids or self._unknown(shown or folder, where)

    def _unknown(self, folder: str, where: str) -> list[int]:
        known = ", ".join(sorted(set(self.spelled)))
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
    copies: dict[str, int] = {}
    for b, (d, fingerprint) in enumerate(zip(ids, fingerprints)):
        a = first.setdefault(d, b)
        if a != b:
            raise ConfigError(f"{where}: {folders[a]!r} and {folders[b]!r} are the same dataset "
                              f"({resolved(folders[a])}); list it once and merge the weights")
        c = copies.setdefault(fingerprint, b)
        if c != b:
            raise ConfigError(f"{where}: {folders[c]!r} and {folders[b]!r} hold the same data (fingerprint "
                              f"{fingerprint}), so every sample would be read twice; list one "
                              f"of them and merge the weights")
