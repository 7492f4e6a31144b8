"""Datasets (loaded once into tensors) and partitions (index arrays per client).

Each source registers itself as a ``dataset`` plug-in (:mod:`fedhet.registry`)."""

from fedhet.data import leaf, nslkdd, partition, quadratic, sources, tabular  # noqa: F401  (registration)
from fedhet.data.dataset import Dataset, DatasetSource
from fedhet.data.partition import PARTITIONERS, partition_indices
from fedhet.data.sources import load_dataset, open_dataset

__all__ = ["PARTITIONERS", "Dataset", "DatasetSource", "load_dataset", "open_dataset", "partition_indices"]
