"""Partitions cover the data once, and label swap changes exactly what it should."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from fedhet.data.partition import partition_indices, swap_labels
from fedhet.errors import ConfigError


def _labels(n=1000, classes=10, seed=0):
    return np.random.default_rng(seed).integers(0, classes, n)


@pytest.mark.parametrize("method", ["iid", "dirichlet", "shards", "label-swap"])
def test_partition_is_a_disjoint_cover(method):
    labels = _labels()
    parts = partition_indices(labels, 7, method, np.random.default_rng(1), alpha=0.3)
    joined = np.concatenate(parts)
    assert len(parts) == 7 and len(joined) == len(labels)
    assert np.array_equal(np.sort(joined), np.arange(len(labels)))


def test_iid_sizes_differ_by_at_most_one():
    sizes = [len(p) for p in partition_indices(_labels(1003), 10, "iid", np.random.default_rng(0))]
    assert max(sizes) - min(sizes) <= 1


def test_shards_give_each_client_few_classes():
    labels = np.repeat(np.arange(10), 100)
    parts = partition_indices(labels, 10, "shards", np.random.default_rng(0), shards_per_client=2)
    assert all(len(np.unique(labels[p])) <= 2 for p in parts)


def test_small_dirichlet_alpha_is_skewed():
    labels = _labels(5000)
    skewed = partition_indices(labels, 10, "dirichlet", np.random.default_rng(0), alpha=0.1)
    flat = partition_indices(labels, 10, "dirichlet", np.random.default_rng(0), alpha=100.0)

    def top_share(parts):
        return np.mean([np.bincount(labels[p], minlength=10).max() / len(p) for p in parts])

    assert top_share(skewed) > 0.4 > top_share(flat)


def test_unknown_partition_names_the_key():
    with pytest.raises(ConfigError, match="data.partition"):
        partition_indices(_labels(), 3, "weird", np.random.default_rng(0))


def test_label_swap_changes_exact_fraction_of_intended_labels_on_intended_clients():
    labels = np.repeat(np.arange(10), 200)
    rng = np.random.default_rng(0)
    parts = partition_indices(labels, 6, "iid", rng)
    swapped_clients = [3, 4, 5]
    out = swap_labels(labels, parts, 0.25, [[0, 1], [8, 9]], swapped_clients, rng)
    for client, idx in enumerate(parts):
        changed = idx[out[idx] != labels[idx]]
        if client not in swapped_clients:
            assert len(changed) == 0
            continue
        a, b = [[0, 1], [8, 9]][client % 2]  # even clients swap (0, 1), odd (8, 9)
        for src, dst in ((a, b), (b, a)):
            members = idx[labels[idx] == src]
            moved = members[out[members] != src]
            assert len(moved) == round(0.25 * len(members))
            assert np.all(out[moved] == dst)
        assert set(np.unique(labels[changed])) <= {a, b}


def test_fedstale_label_swap_touches_only_the_second_half_with_parity_pairs():
    """FedStale Sec. 5.1 through the config: N = 24, sigma_g^2 = 0.6 on clients 12..23 only;
    even clients swap 0<->1, odd clients 8<->9, exactly round(0.6 * count) of each label."""
    from conftest import make_config

    from fedhet.data import load_dataset
    from fedhet.world import build_partition

    config = make_config(
        {
            "data.num_clients": 24,
            "data.partition": "label-swap",
            "data.swap_fraction": 0.6,
            "data.swap_clients": "second-half",
        }
    )
    dataset = load_dataset("digits")
    parts, swapped = build_partition(config, dataset)
    original = dataset.y_train.numpy()
    swapped = swapped.numpy()
    for client, idx in enumerate(parts):
        changed = idx[swapped[idx] != original[idx]]
        if client < 12:
            assert len(changed) == 0
            continue
        a, b = (0, 1) if client % 2 == 0 else (8, 9)
        assert set(np.unique(original[changed])) <= {a, b}
        for src, dst in ((a, b), (b, a)):
            members = idx[original[idx] == src]
            moved = members[swapped[members] != src]
            assert len(moved) == round(0.6 * len(members)) and np.all(swapped[moved] == dst)


def _quantity_skew(labels, clients, seed=0, **options):
    import torch

    from fedhet.data.partition import QuantitySkew, QuantitySkewOptions, _Labels

    splitter = QuantitySkew(QuantitySkewOptions(**options))
    return splitter.split(_Labels(torch.from_numpy(labels)), clients, np.random.default_rng(seed))


@pytest.mark.parametrize("distribution", ["lognormal", "power-law"])
def test_quantity_skew_is_a_disjoint_cover_with_the_minimum_size(distribution):
    labels = _labels(2000)
    parts = _quantity_skew(labels, 40, size_distribution=distribution, min_client_size=5)
    joined = np.concatenate(parts)
    assert np.array_equal(np.sort(joined), np.arange(len(labels)))
    assert min(len(p) for p in parts) >= 5


def test_quantity_skew_grows_with_sigma_and_vanishes_at_zero():
    """sigma = 0 gives equal shares (sizes within one of each other); a larger sigma gives
    a larger spread of sizes (coefficient of variation, averaged over seeds)."""
    labels = _labels(5000)
    equal = [len(p) for p in _quantity_skew(labels, 50, size_sigma=0.0)]
    assert max(equal) - min(equal) <= 1

    def spread(sigma):
        draws = [_quantity_skew(labels, 50, seed, size_sigma=sigma) for seed in range(5)]
        sizes = [np.array([len(p) for p in parts]) for parts in draws]
        return np.mean([s.std() / s.mean() for s in sizes])

    assert spread(0.3) < spread(1.0) < spread(2.0)
    assert spread(1.0) > 0.8  # lognormal(0, 1): CV sqrt(e - 1) = 1.31 in the limit


def test_power_law_sizes_have_a_heavy_tail():
    """Pareto(1.1) shares: the largest tenth of 100 clients holds more than a third of
    the examples (a near-equal split would give them a tenth)."""
    sizes = np.sort([len(p) for p in _quantity_skew(_labels(20000), 100, size_distribution="power-law",
                                                     size_exponent=1.1)])[::-1]  # fmt: skip
    assert sizes[:10].sum() > len(_labels(20000)) / 3


def test_quantity_skew_refuses_more_minimum_than_examples():
    with pytest.raises(ConfigError, match="data.min_client_size = 50"):
        _quantity_skew(_labels(100), 3, min_client_size=50)


def test_quantity_skew_is_a_data_partition_of_a_configuration(tmp_path):
    from fedhet.config import from_dict
    from fedhet.world import build_world

    config = from_dict({
        "run": {"seed": 2, "threads": 1},
        "data": {"dataset": "digits", "num_clients": 8, "partition": "quantity-skew", "size_sigma": 1.5},
    })  # fmt: skip
    world = build_world(config)
    sizes = world.client_sizes
    assert sizes.sum() == len(world.dataset.y_train) and sizes.max() > 4 * sizes.min()
    with pytest.raises(ConfigError, match="data.size_distribution"):
        from_dict({"data": {"partition": "quantity-skew", "size_distribution": "zipf"}})


def test_a_label_swap_that_makes_no_client_differ_says_so_once(caplog):
    """One client, or every client swapping the same pair: the swap is label noise, not
    heterogeneity between clients, and one warning line says so; clients that swap different
    pairs (or only the second half) differ, and nothing is said."""
    import logging

    from conftest import make_config

    from fedhet import world as world_module
    from fedhet.world import build_world

    def warned(**data) -> bool:
        world_module._SAID.discard("swap-alike")
        caplog.clear()
        keys = {
            "data.partition": "label-swap",
            "data.swap_fraction": 0.5,
            **{f"data.{k}": v for k, v in data.items()},
        }
        with caplog.at_level(logging.WARNING, logger="fedhet"):
            build_world(make_config(keys))
        return "no client differs from another" in caplog.text

    assert warned(num_clients=1)
    assert warned(num_clients=4, swap_pairs=[[0, 1]])
    assert not warned(num_clients=4)  # (0, 1) on even clients, (8, 9) on odd ones
    assert not warned(num_clients=4, swap_pairs=[[0, 1]], swap_clients="second-half")


def test_a_runs_splits_are_rows_of_the_shared_features_not_copies():
    """data.fraction and data.validation_fraction select the training examples as rows of
    the decoded features (one tensor, shared by the runs of a process): a client's examples
    and labels are the same rows a copy would have given, with a label swap applied, and
    only the validation set (the run's test set) is copied."""
    from fedhet.config import from_dict
    from fedhet.world import build_world, open_configured_dataset

    document = {
        "run": {"seed": 3},
        "data": {"dataset": "digits", "num_clients": 4, "fraction": 0.6, "validation_fraction": 0.25,
                 "partition": "label-swap", "swap_fraction": 1.0, "swap_clients": "all"},
    }  # fmt: skip
    config = from_dict(document)
    full = open_configured_dataset(config)
    world = build_world(config)
    assert world.dataset.x_train.data_ptr() == full.x_train.data_ptr()  # no copy of the features
    rows = world.dataset.train_rows
    assert rows is not None and len(rows) == world.dataset.num_train < full.num_train
    swapped = 0
    for client in range(4):
        data = world.client_data(client)
        assert torch.equal(data.x[data.indices], full.x_train[data.indices])  # the rows themselves
        assert set(data.indices.tolist()) <= set(rows.tolist())
        swapped += int((world.train_labels[data.indices] != full.y_train[data.indices]).sum())
    assert swapped > 0  # the swapped labels sit at the clients' rows
    kept = round(0.6 * full.num_train)  # data.fraction's rows, a quarter of them for validation
    assert len(world.dataset.x_test) == round(0.25 * kept) and len(rows) == kept - round(0.25 * kept)
