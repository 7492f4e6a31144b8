"""Correlated device populations: each client's speed, availability and data size tied by a
Gaussian copula (``[system] device_correlation = rho``; 0, the default, keeps them
independent and every draw as it was).

Real federations are not independent draws of each: the clients with the most data are often
the ones on fast, well-connected, often-online devices (or the reverse), which FedScale's
independent assignment of devices and traces was criticised for (FedScale issue #163). Here:

- each client's data size n_u (fixed by the partition) gives its normal score
  z^n_u = Phi^-1((r_u - 1/2) / N), r_u its size's rank (ties broken at random);
- (z^n, z^speed, z^avail) are equicorrelated standard normals with correlation rho, so
  given z^n each of the other two is ``rho z^n_u + noise`` with the conditional covariance
  [[1 - rho^2, rho - rho^2], [rho - rho^2, 1 - rho^2]]; rho in [-1/2, 1] (a valid
  correlation matrix). Spearman's rank correlation of the pairs is about
  (6 / pi) arcsin(rho / 2) (0.79 at rho = 0.8);
- speed: the capabilities (or devices) the model draws are handed out by rank, the fastest
  to the client with the largest z^speed, so the population's speeds are those of the
  independent draw, only their owners change;
- availability: ``participation = "uniform"`` gives client u the probability
  low + (high - low) Phi(z^avail_u), uniform on [low, high] as before, now ranked.

The latent draws come from the run seed's ``device-copula`` stream.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from fedhet import seeding


@dataclass(frozen=True)
class Latents:
    """Each client's latent normal scores for speed and availability."""

    speed: np.ndarray
    availability: np.ndarray


def size_scores(client_sizes: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """Normal scores Phi^-1((r - 1/2) / N) of the clients' data-size ranks (ties at random)."""
    from scipy.stats import norm

    sizes = np.asarray(client_sizes, dtype=float)
    ranks = np.lexsort((rng.random(len(sizes)), sizes)).argsort()  # 0-based, random among ties
    return norm.ppf((ranks + 0.5) / len(sizes))


def client_latents(client_sizes: np.ndarray, correlation: float, rng: np.random.Generator) -> Latents:
    """(z^speed, z^avail) given the size scores, under the equicorrelated Gaussian copula."""
    z = size_scores(client_sizes, rng)
    rho = float(correlation)
    conditional = np.array([[1 - rho**2, rho - rho**2], [rho - rho**2, 1 - rho**2]])
    eigen, vectors = np.linalg.eigh(conditional)
    root = vectors * np.sqrt(np.clip(eigen, 0.0, None))  # conditional = root @ root.T
    noise = rng.standard_normal((len(z), 2)) @ root.T
    return Latents(speed=rho * z + noise[:, 0], availability=rho * z + noise[:, 1])


def population_latents(correlation: float, seed: int, client_sizes) -> Latents | None:
    """The run's latents (``device_correlation``), or None when it is 0 (independent draws)."""
    if not correlation:
        return None
    if client_sizes is None:
        raise ValueError("system.device_correlation needs the clients' data sizes")
    return client_latents(np.asarray(client_sizes), correlation, seeding.stream(seed, "device-copula"))


def by_rank(faster: np.ndarray, latent: np.ndarray) -> np.ndarray:
    """Indices that hand the k-th fastest item (largest ``faster`` score) to the client with
    the k-th largest ``latent``: ``items[by_rank(...)]`` is one item per client."""
    out = np.empty(len(latent), dtype=int)
    out[np.argsort(latent, kind="stable")] = np.argsort(faster, kind="stable")
    return out
