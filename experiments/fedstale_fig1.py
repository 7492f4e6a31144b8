"""FedStale Fig. 1d from a finished experiments/fedstale_fig1.toml grid: the optimality gap
F(w) - F(w*) of the uniform objective F = (F_1 + F_2) / 2 along each method's runs, its
per-run summaries as a table, and paired tests of FedStale(0.8) against U-FedAvg and
FedVARP (the same seed gives every method the same participation draws).

    python experiments/fedstale_fig1.py docs/results/data/fedstale-fig1.csv \
        --runs runs/fedstale_fig1 --figure docs/results/figures/fedstale-fig1.png
    python experiments/fedstale_fig1.py docs/results/data/fedstale-fig1.csv   # from the table

The test loss of a quadratic run is F(w) exactly (fedhet.data.quadratic), so the gap needs
no model file.
"""

from __future__ import annotations

import argparse
import csv
import sys
import tomllib
from collections import defaultdict
from pathlib import Path

import numpy as np

from fedhet.data.quadratic import DEFAULT_MATRICES, DEFAULT_OPTIMA, objective, weighted_optimum
from fedhet.results import RunDirectory
from fedhet.studies.stats import difference_p_value, holm

CHECKPOINTS = [250, 500, 1000, 2000, 4000]
THRESHOLDS = [1.0, 0.01]
ORDER = ["u-fedavg", "fedvarp", "fedstale(0.8)", "fedavg"]


def method(config: dict) -> str:
    algorithm = config["algorithm"]
    name = algorithm["name"]
    return f"{name}({algorithm.get('beta', 0.5):g})" if name == "fedstale" else name


def curve(path: Path) -> tuple[str, int, np.ndarray, np.ndarray, str]:
    """(method, seed, rounds, gaps, fedhet build) of one finished run."""
    config = tomllib.loads((path / "config.toml").read_text())
    data = config["data"]
    matrices = data.get("quadratic_matrices", DEFAULT_MATRICES)
    optima = data.get("quadratic_optima", DEFAULT_OPTIMA)
    best = float(objective(matrices, optima, weighted_optimum(matrices, optima, [0.5, 0.5])).mean())
    run = RunDirectory(path)
    rows = [r for r in run.read_metrics() if r.get("test_loss") is not None]
    rounds = np.array([int(r["round"]) for r in rows])
    gaps = np.array([float(r["test_loss"]) for r in rows]) - best
    return method(config), int(config["run"]["seed"]), rounds, gaps, run.read_summary().get("fedhet", "")


def summaries(folder: str) -> tuple[list[dict], dict]:
    rows, curves = [], defaultdict(dict)
    for path in sorted(Path(folder).iterdir()):
        if not (path / "summary.json").exists() or not RunDirectory(path).read_summary().get("finished"):
            continue
        name, seed, rounds, gaps, build = curve(path)
        curves[name][seed] = (rounds, gaps)
        row = {"method": name, "seed": seed}
        for t in CHECKPOINTS:
            row[f"gap_{t}"] = f"{gaps[np.searchsorted(rounds, t)]:.6g}"
        for level in THRESHOLDS:
            below = np.flatnonzero(gaps < level)
            row[f"first_below_{level:g}"] = int(rounds[below[0]]) if below.size else ""
        row["fedhet"] = build
        rows.append(row)
    return rows, curves


def print_report(rows: list[dict]) -> None:
    table: dict[str, dict[int, dict]] = defaultdict(dict)
    for row in rows:
        table[row["method"]][int(row["seed"])] = row
    names = [m for m in ORDER if m in table]
    print(
        "| method | runs | "
        + " | ".join(f"gap at {t}: median [min, max]" for t in CHECKPOINTS)
        + " | "
        + " | ".join(f"first round below {lv:g}: median [min, max]" for lv in THRESHOLDS)
        + " |"
    )
    print("|---|---:|" + "---|" * (len(CHECKPOINTS) + len(THRESHOLDS)))
    for name in names:
        cells = []
        for t in CHECKPOINTS:
            v = [float(r[f"gap_{t}"]) for r in table[name].values()]
            cells.append(f"{np.median(v):.3g} [{min(v):.3g}, {max(v):.3g}]")
        for level in THRESHOLDS:
            v = [r[f"first_below_{level:g}"] for r in table[name].values()]
            reached = [int(x) for x in v if x != ""]
            cells.append(
                f"{np.median(reached):.0f} [{min(reached)}, {max(reached)}] ({len(reached)}/{len(v)})"
                if reached
                else f"- (0/{len(v)})"
            )
        print(f"| {name} | {len(table[name])} | " + " | ".join(cells) + " |")
    # paired tests on log10 gaps: FedStale(0.8) against U-FedAvg and FedVARP at each checkpoint
    pairs = [("fedstale(0.8)", other, t) for other in ("u-fedavg", "fedvarp") for t in CHECKPOINTS]
    pairs = [p for p in pairs if p[0] in table and p[1] in table]

    def logs(name, t):
        return {s: float(np.log10(max(float(r[f"gap_{t}"]), 1e-12))) for s, r in table[name].items()}

    p_values = [difference_p_value(logs(a, t), logs(b, t)) for a, b, t in pairs]
    print()
    print("| comparison | round | mean log10 gap difference | runs below the other's gap | p | p Holm |")
    print("|---|---:|---:|---:|---:|---:|")
    for (a, b, t), p, adjusted in zip(pairs, p_values, holm(p_values), strict=True):
        x, y = logs(a, t), logs(b, t)
        difference = float(np.mean([x[s] - y[s] for s in x]))
        below = sum(x[s] < y[s] for s in x)
        shown = " | ".join("-" if v is None else f"{v:.3g}" for v in (p, adjusted))
        print(f"| {a} vs {b} | {t} | {difference:+.2f} | {below}/{len(x)} | {shown} |")


def plot(curves: dict, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    colors = {
        "u-fedavg": "tab:blue",
        "fedvarp": "tab:orange",
        "fedstale(0.8)": "tab:green",
        "fedavg": "tab:gray",
    }
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for name in [m for m in ORDER if m in curves]:
        runs = curves[name]
        rounds = next(iter(runs.values()))[0]
        stack = np.array([g for _, g in runs.values()])
        for gaps in stack:
            ax.plot(rounds, np.maximum(gaps, 1e-12), color=colors[name], alpha=0.15, lw=0.7)
        ax.plot(
            rounds,
            np.maximum(np.median(stack, axis=0), 1e-12),
            color=colors[name],
            lw=2,
            label=f"{name} (median of {len(runs)})",
        )
    ax.set_yscale("log")
    ax.set_xlabel("round")
    ax.set_ylabel("F(w) - F(w*)")
    ax.set_title("Two-client quadratic, p1/p2 = 100, K = 5 (FedStale Fig. 1d)")
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("table", help="the per-run table (written with --runs, read otherwise)")
    parser.add_argument("--runs", help="the finished grid's folder")
    parser.add_argument("--figure", help="write the learning curves here (needs --runs)")
    args = parser.parse_args()
    if args.runs:
        rows, curves = summaries(args.runs)
        with open(args.table, "w", newline="") as handle:
            writer = csv.DictWriter(handle, list(rows[0]))
            writer.writeheader()
            writer.writerows(rows)
        if args.figure:
            plot(curves, args.figure)
    with open(args.table, newline="") as handle:
        print_report(list(csv.DictReader(handle)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
