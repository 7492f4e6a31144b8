"""The beta_opt map of FedStale Fig. 2 from a grid of finished runs.

For each heterogeneity cell (data heterogeneity sigma_g^2 = ``data.swap_fraction``,
participation heterogeneity p_avg / p_min) and each beta, the test accuracy is averaged over
seeds; beta_opt is the beta with the highest accuracy, Delta_0 and Delta_1 its gain over
beta = 0 (U-FedAvg) and beta = 1 (FedVARP). ``u-fedavg`` and ``fedvarp`` runs count as
beta = 0 and beta = 1.

The accuracy of a run is the mean of its last ``last`` evaluations (1 = the final one), which
damps the round-to-round noise of a short horizon.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from fedhet.config import load_config
from fedhet.errors import FedhetError
from fedhet.results import RunDirectory

FIXED_BETA = {"u-fedavg": 0.0, "fedvarp": 1.0}


@dataclass
class RunRecord:
    """One finished run of the family, reduced to what the map needs."""

    name: str
    swap_fraction: float
    participation_ratio: float  # p_avg / p_min
    p_min: float
    beta: float
    participation: str  # known | fedau
    seed: int
    accuracy: float


@dataclass
class MapCell:
    """One heterogeneity cell: mean accuracy per beta (over seeds) and the resulting gains."""

    swap_fraction: float
    participation_ratio: float
    p_min: float
    accuracy: dict[float, float]
    seeds: dict[float, int] = field(default_factory=dict)

    @property
    def beta_opt(self) -> float:
        return max(self.accuracy, key=lambda b: (self.accuracy[b], -b))

    def gain_over(self, beta: float) -> float | None:
        """Accuracy of beta_opt minus that of ``beta`` (Delta_0 for 0, Delta_1 for 1)."""
        if beta not in self.accuracy:
            return None
        return self.accuracy[self.beta_opt] - self.accuracy[beta]


def participation_ratio(probs: np.ndarray) -> float:
    """p_avg / p_min of a vector of participation probabilities."""
    probs = np.asarray(probs, dtype=float)
    return float(probs.mean() / probs.min())


def read_record(run: RunDirectory, last: int = 1) -> RunRecord | None:
    """The record of a finished run of fedstale / u-fedavg / fedvarp, else ``None``."""
    if not run.summary_path.exists() or not run.read_summary().get("finished"):
        return None
    config = load_config(run.path / "config.toml")
    name = config.algorithm_name
    if name == "fedstale":
        beta = float(config.algorithm.get("beta", 0.5))
    elif name in FIXED_BETA:
        beta = FIXED_BETA[name]
    else:
        return None
    evaluated = [r["test_accuracy"] for r in run.read_metrics() if r.get("test_accuracy") is not None]
    if not evaluated:
        return None
    s = config.system
    if s.participation == "two-group":
        n = config.data.num_clients
        probs = np.r_[np.ones(n // 2), np.full(n - n // 2, s.participation_min)]
    elif s.participation == "list":
        probs = np.asarray(s.participation_probs, dtype=float)
    elif s.participation == "uniform":
        probs = np.array([s.participation_low, s.participation_high])  # ratio of the range
    else:
        probs = np.ones(1)
    return RunRecord(
        name=run.path.name,
        swap_fraction=config.data.swap_fraction,
        participation_ratio=participation_ratio(probs),
        p_min=float(probs.min()),
        beta=beta,
        participation=str(config.algorithm.get("participation", "known")),
        seed=config.run.seed,
        accuracy=float(np.mean(evaluated[-last:])),
    )


def collect(root: str | Path, last: int = 1) -> list[RunRecord]:
    """Records of every finished run under ``root`` (a grid's output folder)."""
    root = Path(root)
    if not root.is_dir():
        raise FedhetError(f"{root}: no such folder of runs")
    records = []
    for path in sorted(root.iterdir()):
        if (path / "metrics.csv").exists():
            record = read_record(RunDirectory(path), last)
            if record is not None:
                records.append(record)
    if not records:
        raise FedhetError(f"{root}: no finished fedstale / u-fedavg / fedvarp runs")
    return records


def beta_map(records: Sequence[RunRecord]) -> list[MapCell]:
    """Group records by heterogeneity cell and average accuracy over seeds per beta; cells
    sorted by data heterogeneity, then participation heterogeneity."""
    groups: dict[tuple, dict[float, list[float]]] = defaultdict(lambda: defaultdict(list))
    p_mins = {}
    for r in records:
        key = (r.swap_fraction, round(r.participation_ratio, 9))
        groups[key][r.beta].append(r.accuracy)
        p_mins[key] = r.p_min
    cells = []
    for (sigma, ratio), by_beta in sorted(groups.items()):
        cells.append(
            MapCell(
                swap_fraction=sigma,
                participation_ratio=ratio,
                p_min=p_mins[(sigma, ratio)],
                accuracy={b: float(np.mean(v)) for b, v in sorted(by_beta.items())},
                seeds={b: len(v) for b, v in sorted(by_beta.items())},
            )
        )
    return cells


def markdown_table(cells: Sequence[MapCell], digits: int = 3) -> str:
    """One row per cell: sigma_g^2, p_avg/p_min, accuracy per beta, beta_opt, Delta_0, Delta_1
    (in accuracy points x 100)."""
    betas = sorted({b for c in cells for b in c.accuracy})
    head = ["sigma_g^2", "p_avg/p_min", *[f"beta={b:g}" for b in betas], "beta_opt", "Delta_0", "Delta_1"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for c in cells:
        row = [f"{c.swap_fraction:g}", f"{c.participation_ratio:.1f}"]
        row += [f"{c.accuracy[b]:.{digits}f}" if b in c.accuracy else "-" for b in betas]
        row.append(f"{c.beta_opt:g}")
        for ref in (0.0, 1.0):
            gain = c.gain_over(ref)
            row.append("-" if gain is None else f"{100 * gain:+.1f}")
        lines.append("| " + " | ".join(row) + " |")
    return "\n".join(lines) + "\n"
