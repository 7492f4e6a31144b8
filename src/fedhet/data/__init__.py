"""Datasets (loaded once into tensors) and partitions (index arrays per client)."""

from fedhet.data.partition import PARTITIONERS, partition_indices
from fedhet.data.sources import DATASETS, Dataset, load_dataset

__all__ = ["DATASETS", "PARTITIONERS", "Dataset", "load_dataset", "partition_indices"]
