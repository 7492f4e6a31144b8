"""The beta_opt map of FedStale Fig. 2 from a grid of finished runs.

For each heterogeneity cell (data heterogeneity sigma_g^2 = ``data.swap_fraction``,
participation heterogeneity p_avg / p_min) and each beta, the test accuracy is averaged over
seeds; beta_opt is the beta with the highest accuracy, Delta_0 and Delta_1 its gain over
beta = 0 (U-FedAvg) and beta = 1 (FedVARP). ``u-fedavg`` and ``fedvarp`` runs count as
beta = 0 and beta = 1.

The accuracy of a run is the mean of its last ``last`` evaluations (1 = the final one), which
damps the round-to-round noise of a short horizon.

With several seeds per cell, :func:`bootstrap_beta_opt` gives beta_opt's uncertainty
(seeds resampled with replacement, the same seeds for every beta, since a seed fixes the
data split, the initial model and the participation draws), and :func:`intermediate_wins`
whether the best intermediate beta beats both ends significantly (paired t-tests over seeds).
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
    fedhet: str = ""  # the build that ran it


@dataclass
class MapCell:
    """One heterogeneity cell: mean accuracy per beta (over seeds) and the resulting gains."""

    swap_fraction: float
    participation_ratio: float
    p_min: float
    accuracy: dict[float, float]
    seeds: dict[float, int] = field(default_factory=dict)
    per_seed: dict[float, dict[int, float]] = field(default_factory=dict)  # beta -> seed -> accuracy

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
        fedhet=str(run.read_summary().get("fedhet") or ""),
    )


RECORD_COLUMNS = ("name", "swap_fraction", "participation_ratio", "p_min", "beta", "participation", "seed",
                  "accuracy", "fedhet")  # fmt: skip


def records_csv(records: Sequence[RunRecord], last: int) -> str:
    """The records as a per-run table (one CSV row per run, with ``last``, the evaluations
    its accuracy averages): what a results page's beta maps are recomputed from without the
    run folders."""
    import csv
    import io

    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow([*RECORD_COLUMNS, "last"])
    for r in records:
        writer.writerow([*(getattr(r, k) for k in RECORD_COLUMNS), last])
    return out.getvalue()


def read_records_csv(path: Path, last: int) -> list[RunRecord]:
    """The records :func:`records_csv` wrote; refused in one line when a column is missing or
    the table's runs average a different number of evaluations than ``last``."""
    import csv

    with open(path, newline="") as handle:
        rows = list(csv.DictReader(handle))
    missing = [k for k in (*RECORD_COLUMNS, "last") if rows and k not in rows[0]]
    if not rows or missing:
        raise FedhetError(
            f"{path}: not a per-run table of beta-map runs (missing: {', '.join(missing) or 'rows'})"
        )
    if any(int(row["last"]) != last for row in rows):
        raise FedhetError(f"{path}: its runs average {rows[0]['last']} evaluations, not {last} (--last)")
    kinds = {"name": str, "participation": str, "fedhet": str, "seed": int}
    return [RunRecord(**{k: kinds.get(k, float)(row[k]) for k in RECORD_COLUMNS}) for row in rows]


def collect(root: str | Path, last: int = 1) -> list[RunRecord]:
    """Records of every finished run under ``root`` (a grid's output folder), or those of a
    per-run table (a ``.csv`` file :func:`records_csv` wrote)."""
    root = Path(root)
    if root.suffix == ".csv" and root.is_file():
        return read_records_csv(root, last)
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
    groups: dict[tuple, dict[float, dict[int, float]]] = defaultdict(lambda: defaultdict(dict))
    p_mins = {}
    for r in records:
        key = (r.swap_fraction, round(r.participation_ratio, 9))
        groups[key][r.beta][r.seed] = r.accuracy
        p_mins[key] = r.p_min
    cells = []
    for (sigma, ratio), by_beta in sorted(groups.items()):
        cells.append(
            MapCell(
                swap_fraction=sigma,
                participation_ratio=ratio,
                p_min=p_mins[(sigma, ratio)],
                accuracy={b: float(np.mean(list(v.values()))) for b, v in sorted(by_beta.items())},
                seeds={b: len(v) for b, v in sorted(by_beta.items())},
                per_seed={b: dict(v) for b, v in sorted(by_beta.items())},
            )
        )
    return cells


@dataclass
class BetaOptInterval:
    """beta_opt over bootstrap resamples of the seeds: the central ``level`` range of its
    values (on the beta grid), and how often each beta was the best."""

    low: float
    high: float
    share: dict[float, float]

    @property
    def intermediate_share(self) -> float:
        """Share of resamples in which beta_opt lies strictly between 0 and 1."""
        return float(sum(v for b, v in self.share.items() if 0.0 < b < 1.0))


def common_seeds(cell: MapCell) -> list[int]:
    """Seeds that ran every beta of the cell."""
    seeds = None
    for by_seed in cell.per_seed.values():
        seeds = set(by_seed) if seeds is None else seeds & set(by_seed)
    return sorted(seeds or ())


def bootstrap_beta_opt(
    cell: MapCell, draws: int = 4000, level: float = 0.95, seed: int = 0
) -> BetaOptInterval | None:
    """beta_opt's bootstrap distribution: resample the cell's common seeds with replacement
    (``draws`` times), take the beta with the highest mean accuracy in each resample (ties to
    the smaller beta, as :attr:`MapCell.beta_opt`), and report the central ``level`` range
    in beta order. ``None`` with fewer than two common seeds."""
    seeds = common_seeds(cell)
    if len(seeds) < 2:
        return None
    betas = sorted(cell.per_seed)
    table = np.array([[cell.per_seed[b][s] for b in betas] for s in seeds])  # seeds x betas
    rng = np.random.default_rng(seed)
    picks = rng.integers(0, len(seeds), size=(draws, len(seeds)))
    means = table[picks].mean(axis=1)  # draws x betas
    best = np.argmax(means, axis=1)  # first maximum = smallest beta among ties
    chosen = np.array(betas)[best]
    tail = (1.0 - level) / 2
    low, high = np.quantile(chosen, [tail, 1.0 - tail], method="inverted_cdf")
    share = {b: float(np.mean(best == i)) for i, b in enumerate(betas)}
    return BetaOptInterval(float(low), float(high), share)


def intermediate_wins(cell: MapCell, alpha: float = 0.05) -> tuple[float, float, float] | None:
    """Whether the best intermediate beta (0 < beta < 1, by mean accuracy) beats both ends:
    (that beta, p-value against beta = 0, p-value against beta = 1), two-sided paired t-tests
    over the common seeds (:func:`fedhet.studies.stats.difference_p_value`). It wins
    significantly when it is above both and both p-values are below ``alpha``. ``None`` when
    the cell lacks an end or an intermediate beta, or has fewer than two seeds. Picking the
    best of several intermediate betas before testing favours a win: read the count as an
    upper bound."""
    from fedhet.studies.stats import difference_p_value

    middle = [b for b in cell.accuracy if 0.0 < b < 1.0]
    if not middle or 0.0 not in cell.per_seed or 1.0 not in cell.per_seed or len(common_seeds(cell)) < 2:
        return None
    best = max(middle, key=lambda b: cell.accuracy[b])
    p0 = difference_p_value(cell.per_seed[best], cell.per_seed[0.0])
    p1 = difference_p_value(cell.per_seed[best], cell.per_seed[1.0])
    return best, float("nan") if p0 is None else p0, float("nan") if p1 is None else p1


def wins_significantly(cell: MapCell, alpha: float = 0.05) -> bool:
    """The best intermediate beta is above both ends, each with p < ``alpha`` (one cell,
    uncorrected; over a table's cells :func:`intermediate_tests` corrects)."""
    result = intermediate_wins(cell, alpha)
    if result is None:
        return False
    best, p0, p1 = result
    above = cell.accuracy[best] > cell.accuracy[0.0] and cell.accuracy[best] > cell.accuracy[1.0]
    return bool(above and p0 < alpha and p1 < alpha)


@dataclass(frozen=True)
class IntermediateTest:
    """One cell's best intermediate beta against both ends, with the p-values Holm-corrected
    over every such test of a table (two per cell)."""

    best: float
    p0: float
    p1: float
    p0_holm: float
    p1_holm: float
    wins: bool  # above both ends, both corrected p-values below alpha


def intermediate_tests(cells: Sequence[MapCell], alpha: float = 0.05) -> list[IntermediateTest | None]:
    """:func:`intermediate_wins` for every cell, its two p-values Holm-corrected over the
    2 x (cells tested) tests of the table (:func:`fedhet.studies.stats.holm`); ``None`` for a
    cell that cannot be tested."""
    from fedhet.studies.stats import holm

    found = [intermediate_wins(c, alpha) for c in cells]
    flat = [p for f in found if f is not None for p in f[1:]]
    adjusted = iter(holm([None if np.isnan(p) else p for p in flat]))
    out: list[IntermediateTest | None] = []
    for cell, f in zip(cells, found, strict=True):
        if f is None:
            out.append(None)
            continue
        best, p0, p1 = f
        q0, q1 = (float("nan") if q is None else q for q in (next(adjusted), next(adjusted)))
        above = cell.accuracy[best] > cell.accuracy[0.0] and cell.accuracy[best] > cell.accuracy[1.0]
        out.append(IntermediateTest(best, p0, p1, q0, q1, bool(above and q0 < alpha and q1 < alpha)))
    return out


def markdown_table(cells: Sequence[MapCell], digits: int = 3) -> str:
    """One row per cell: sigma_g^2, p_avg/p_min, accuracy per beta, beta_opt, Delta_0, Delta_1
    (in accuracy points x 100). With several seeds: accuracy as mean ± 95% t-interval,
    beta_opt's 95% bootstrap range, and the p-values of the best intermediate beta against
    beta = 0 and beta = 1, uncorrected and Holm-corrected over the table's tests (marked *
    when it beats both with corrected p < 0.05; :func:`intermediate_tests`)."""
    from fedhet.studies.stats import estimate

    betas = sorted({b for c in cells for b in c.accuracy})
    seeded = any(len(common_seeds(c)) >= 2 for c in cells)
    head = ["sigma_g^2", "p_avg/p_min", *[f"beta={b:g}" for b in betas], "beta_opt", "Delta_0", "Delta_1"]
    if seeded:
        head += ["beta_opt 95% (bootstrap)", "best middle beta: p vs 0, p vs 1 (Holm)"]
        tests = intermediate_tests(cells)
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for index, c in enumerate(cells):
        row = [f"{c.swap_fraction:g}", f"{c.participation_ratio:.1f}"]
        for b in betas:
            if b not in c.accuracy:
                row.append("-")
            elif seeded and len(c.per_seed.get(b, {})) >= 2:
                e = estimate(list(c.per_seed[b].values()), "ci95")
                row.append(f"{e.mean:.{digits}f} ± {e.spread:.{digits}f}")
            else:
                row.append(f"{c.accuracy[b]:.{digits}f}")
        row.append(f"{c.beta_opt:g}")
        for ref in (0.0, 1.0):
            gain = c.gain_over(ref)
            row.append("-" if gain is None else f"{100 * gain:+.1f}")
        if seeded:
            interval = bootstrap_beta_opt(c)
            row.append("-" if interval is None else f"[{interval.low:g}, {interval.high:g}]")
            test = tests[index]
            if test is None:
                row.append("-")
            else:
                mark = " *" if test.wins else ""
                corrected = f"({test.p0_holm:.2g}, {test.p1_holm:.2g})"
                row.append(f"{test.best:g}: {test.p0:.3f}, {test.p1:.3f} {corrected}{mark}")
        lines.append("| " + " | ".join(row) + " |")
    return "\n".join(lines) + "\n"


def trends(cells: Sequence[MapCell]) -> dict[str, float]:
    """Spearman rank correlations of beta_opt with data heterogeneity (sigma_g^2) and with
    participation heterogeneity (p_avg / p_min) over the cells, and the share of cells whose
    best intermediate beta beats both ends significantly after Holm's correction over the
    cells' tests (:func:`intermediate_tests`)."""
    from scipy.stats import spearmanr

    beta = [c.beta_opt for c in cells]
    out = {}
    for name, values in (
        ("data", [c.swap_fraction for c in cells]),
        ("participation", [c.participation_ratio for c in cells]),
    ):
        if len(set(values)) > 1 and len(set(beta)) > 1:
            result = spearmanr(values, beta)
            out[f"rho_{name}"] = float(result.statistic)
            out[f"p_{name}"] = float(result.pvalue)
    tested = [t for t in intermediate_tests(cells) if t is not None]
    if tested:
        out["intermediate_wins_share"] = sum(t.wins for t in tested) / len(tested)
        out["cells_tested"] = float(len(tested))
    return out
