"""Partitions of a training set over clients: each client is an index array.

Partitioners are plug-ins (kind ``partitioner``, :mod:`fedhet.registry`; ``[data]
partition = "..."`` with their options in the same table):

- ``iid``: a random permutation cut into near-equal shards.
- ``dirichlet``: per class, client shares drawn from Dirichlet(alpha) (small alpha = skewed).
- ``shards``: sort by label, cut into ``num_clients * shards_per_client`` shards, deal them.
- ``label-swap``: ``iid``, then on the chosen clients a fraction of two labels are relabelled
  to each other (the FedStale experiments' data heterogeneity), see :func:`swap_labels`.
- ``natural``: the dataset's own users (LEAF's writers, speakers, ...) are the clients.
- ``quantity-skew``: IID labels, very different client sizes: shares drawn from a lognormal
  or a power law (as LEAF's and FedLab's unbalanced splits), see :func:`quantity_skew_sizes`.

A partitioner plug-in subclasses :class:`Partitioner`: ``split(dataset, num_clients, rng)``
returns the index arrays; ``needs_labels`` says it splits by class label (refused, in one
line, for a task without labels, e.g. a regression).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from fedhet.errors import ConfigError
from fedhet.registry import NoOptions, register


def iid(labels: np.ndarray, num_clients: int, rng: np.random.Generator) -> list[np.ndarray]:
    """Shuffle and split into ``num_clients`` shards whose sizes differ by at most one."""
    return [np.sort(part) for part in np.array_split(rng.permutation(len(labels)), num_clients)]


def dirichlet(
    labels: np.ndarray,
    num_clients: int,
    rng: np.random.Generator,
    alpha: float = 0.5,
    min_size: int = 2,
    max_tries: int = 100,
) -> list[np.ndarray]:
    """Per class, split its examples over clients with shares ~ Dirichlet(alpha * 1).

    Redraws (up to ``max_tries``) until every client holds at least ``min_size`` examples.
    """
    classes = np.unique(labels)
    for _ in range(max_tries):
        parts: list[list[np.ndarray]] = [[] for _ in range(num_clients)]
        for c in classes:
            members = rng.permutation(np.flatnonzero(labels == c))
            shares = rng.dirichlet(np.full(num_clients, alpha))
            cuts = (np.cumsum(shares)[:-1] * len(members)).astype(int)
            for client, chunk in enumerate(np.split(members, cuts)):
                parts[client].append(chunk)
        result = [np.sort(np.concatenate(p)) for p in parts]
        if min(len(r) for r in result) >= min_size:
            return result
    raise ConfigError(
        f"data.alpha = {alpha}: could not give every one of {num_clients} clients "
        f"{min_size} examples in {max_tries} draws; raise alpha or lower num_clients"
    )


def shards(
    labels: np.ndarray, num_clients: int, rng: np.random.Generator, shards_per_client: int = 2
) -> list[np.ndarray]:
    """Sort by label, cut into equal shards, and deal ``shards_per_client`` to each client."""
    num_shards = num_clients * shards_per_client
    if num_shards > len(labels):
        raise ConfigError(
            f"data.shards_per_client = {shards_per_client}: {num_shards} shards exceed {len(labels)} examples"
        )
    order = np.argsort(labels, kind="stable")
    pieces = np.array_split(order, num_shards)
    dealt = rng.permutation(num_shards).reshape(num_clients, shards_per_client)
    return [np.sort(np.concatenate([pieces[s] for s in row])) for row in dealt]


def swap_labels(
    labels: np.ndarray,
    client_indices: Sequence[np.ndarray],
    fraction: float,
    pairs: Sequence[Sequence[int]],
    clients: Sequence[int],
    rng: np.random.Generator,
) -> np.ndarray:
    """Return a copy of ``labels`` where, on each client in ``clients``, a ``fraction`` of its
    examples of label a are relabelled b and the same fraction of label b relabelled a.

    Client ``c`` uses pair ``pairs[c % len(pairs)]`` (the FedStale authors' experiments: even
    clients swap (0, 1), odd ones (8, 9)); the clients are the second half in FedStale
    Sec. 5.1. Exactly ``round(fraction * count)`` examples of each label of the pair change on
    that client, so ``fraction`` is the paper's sigma_g^2 (0 = IID, 1 = the pair fully swapped).
    """
    out = labels.copy()
    for client in clients:
        a, b = pairs[client % len(pairs)]
        idx = client_indices[client]
        for src, dst in ((a, b), (b, a)):
            members = idx[labels[idx] == src]
            chosen = rng.choice(members, size=round(fraction * len(members)), replace=False)
            out[chosen] = dst
    return out


class Partitioner:
    """Base of partitioner plug-ins: ``name``, ``Options`` and :meth:`split`."""

    name = "base"
    Options: type = NoOptions
    needs_labels = False  # splits by class label (refused where the task has none)

    def __init__(self, options=None) -> None:
        self.options = options if options is not None else self.Options()

    @classmethod
    def build(cls, options, ctx=None) -> Partitioner:
        return cls(options)

    def split(self, dataset, num_clients: int, rng: np.random.Generator) -> list[np.ndarray]:
        """Index arrays of the training examples of ``dataset``, one per client."""
        raise NotImplementedError


@register("partitioner")
class IID(Partitioner):
    """A random permutation cut into near-equal shards."""

    name = "iid"

    def split(self, dataset, num_clients, rng):
        return iid(dataset.y_train.numpy(), num_clients, rng)


@register("partitioner")
class LabelSwap(IID):
    """IID, then pairs of labels partly swapped on chosen clients (FedStale Sec. 5.1).

    ``data.swap_fraction``, ``swap_pairs`` and ``swap_clients`` say how much, which and where."""

    name = "label-swap"
    needs_labels = True


@dataclass
class DirichletOptions:
    """``alpha``: the Dirichlet concentration (small = skewed)."""

    alpha: float = 0.5

    def validate(self) -> None:
        if self.alpha <= 0:
            raise ConfigError(f"data.alpha = {self.alpha}: must be > 0")


@register("partitioner")
class Dirichlet(Partitioner):
    """Per class, client shares drawn from Dirichlet(alpha)."""

    name = "dirichlet"
    Options = DirichletOptions
    needs_labels = True

    def split(self, dataset, num_clients, rng):
        return dirichlet(dataset.y_train.numpy(), num_clients, rng, alpha=self.options.alpha)


@dataclass
class ShardsOptions:
    """``shards_per_client``: label-sorted shards dealt to each client."""

    shards_per_client: int = 2

    def validate(self) -> None:
        if self.shards_per_client < 1:
            raise ConfigError(f"data.shards_per_client = {self.shards_per_client}: must be >= 1")


@register("partitioner")
class Shards(Partitioner):
    """Sort by label, cut into equal shards, deal ``shards_per_client`` to each client."""

    name = "shards"
    Options = ShardsOptions
    needs_labels = True

    def split(self, dataset, num_clients, rng):
        return shards(dataset.y_train.numpy(), num_clients, rng, self.options.shards_per_client)


SIZE_DISTRIBUTIONS = ("lognormal", "power-law")


def quantity_skew_sizes(
    num_examples: int,
    num_clients: int,
    rng: np.random.Generator,
    distribution: str = "lognormal",
    sigma: float = 1.0,
    exponent: float = 1.5,
    min_size: int = 2,
) -> np.ndarray:
    """Client sizes n_i summing to ``num_examples``, each at least ``min_size``, the rest
    shared in proportion to weights w_i drawn once per client: ``lognormal``
    w ~ LogNormal(0, sigma) (FedLab's unbalanced split; sigma = 0 is equal sizes), or
    ``power-law`` w ~ Pareto(exponent) with density proportional to w^-(exponent + 1) on
    w >= 1 (a heavy tail: a few clients hold most examples). Shares are rounded by largest
    remainder, so the sizes add up exactly."""
    spare = num_examples - num_clients * min_size
    if spare < 0:
        raise ConfigError(
            f"data.min_client_size = {min_size}: {num_clients} clients need {num_clients * min_size} "
            f"examples, {num_examples} are there"
        )
    if distribution == "lognormal":
        weights = rng.lognormal(0.0, sigma, size=num_clients)
    elif distribution == "power-law":
        weights = 1.0 + rng.pareto(exponent, size=num_clients)
    else:
        raise ConfigError(
            f"data.size_distribution = {distribution!r}: unknown (known: {', '.join(SIZE_DISTRIBUTIONS)})"
        )
    exact = spare * weights / weights.sum()
    extra = np.floor(exact).astype(np.int64)
    short = spare - int(extra.sum())
    extra[np.argsort(-(exact - extra), kind="stable")[:short]] += 1
    return min_size + extra


@dataclass
class QuantitySkewOptions:
    """``size_distribution`` (lognormal or power-law) of the clients' shares, with its
    ``size_sigma`` (lognormal) or ``size_exponent`` (power law), and ``min_client_size``."""

    size_distribution: str = "lognormal"
    size_sigma: float = 1.0
    size_exponent: float = 1.5
    min_client_size: int = 2

    def validate(self) -> None:
        if self.size_distribution not in SIZE_DISTRIBUTIONS:
            raise ConfigError(
                f"data.size_distribution = {self.size_distribution!r}: unknown "
                f"(known: {', '.join(SIZE_DISTRIBUTIONS)})"
            )
        if not 0 <= self.size_sigma <= 10:
            raise ConfigError(f"data.size_sigma = {self.size_sigma}: must be in [0, 10]")
        if not 0 < self.size_exponent <= 100:
            raise ConfigError(f"data.size_exponent = {self.size_exponent}: must be in (0, 100]")
        if self.min_client_size < 1:
            raise ConfigError(f"data.min_client_size = {self.min_client_size}: must be >= 1")


@register("partitioner")
class QuantitySkew(Partitioner):
    """IID labels, skewed sizes: a random permutation cut at the sizes of
    :func:`quantity_skew_sizes`."""

    name = "quantity-skew"
    Options = QuantitySkewOptions

    def split(self, dataset, num_clients, rng):
        o = self.options
        n = len(dataset.y_train)
        sizes = quantity_skew_sizes(
            n, num_clients, rng, o.size_distribution, o.size_sigma, o.size_exponent, o.min_client_size
        )
        order = rng.permutation(n)
        return [np.sort(part) for part in np.split(order, np.cumsum(sizes)[:-1])]


@register("partitioner")
class Natural(Partitioner):
    """The dataset's own users are the clients (LEAF's writers, speakers, ...).

    They come with the data (``dataset.train_users``). With fewer clients than users,
    ``num_clients`` users are drawn at random (the run's data stream), as LEAF samples
    users; their examples are the clients'."""

    name = "natural"

    def split(self, dataset, num_clients, rng):
        users = dataset.train_users
        if users is None:
            raise ConfigError(
                f"data.partition = 'natural': dataset {dataset.name!r} brings no users of its own "
                "(use iid, dirichlet or shards)"
            )
        users = users.numpy()
        present = np.unique(users)
        if num_clients > len(present):
            raise ConfigError(
                f"data.num_clients = {num_clients}: dataset {dataset.name!r} has {len(present)} users "
                "(data.partition = 'natural' makes each user a client)"
            )
        chosen = (
            present
            if num_clients == len(present)
            else np.sort(rng.choice(present, num_clients, replace=False))
        )
        return [np.flatnonzero(users == user) for user in chosen]


# the built-in partitioners' names, as registered above (the registry is the one list)
PARTITIONERS = tuple(
    obj.name for obj in list(globals().values())
    if isinstance(obj, type) and issubclass(obj, Partitioner) and obj is not Partitioner
)  # fmt: skip


def partition_indices(
    labels: np.ndarray,
    num_clients: int,
    method: str,
    rng: np.random.Generator,
    alpha: float = 0.5,
    shards_per_client: int = 2,
) -> list[np.ndarray]:
    """Split example indices over ``num_clients`` clients with built-in partitioner
    ``method`` (a label array stands for the dataset).

    ``label-swap`` splits like ``iid``; its relabelling is applied by :func:`swap_labels`.
    """
    if method not in ("iid", "label-swap", "dirichlet", "shards"):
        raise ConfigError(f"data.partition = {method!r}: unknown (known: {', '.join(PARTITIONERS)})")
    if num_clients > len(labels):
        raise ConfigError(f"data.num_clients = {num_clients}: more clients than {len(labels)} examples")
    options = {"dirichlet": DirichletOptions(alpha), "shards": ShardsOptions(shards_per_client)}
    import torch

    from fedhet.registry import builtins

    partitioner = builtins("partitioner")[method].cls(options.get(method))
    return partitioner.split(_Labels(torch.from_numpy(np.asarray(labels))), num_clients, rng)


@dataclass
class _Labels:
    """A label array standing for a dataset (for :func:`partition_indices`)."""

    y_train: object
    name: str = "labels"
    train_users: object = None
