"""AMSFL Tables 1-2 and Fig. 1 from a grid of runs (experiments/amsfl_tables.toml).

    python experiments/amsfl_report.py runs/amsfl_tables [--target 0.78] [--figures PREFIX]

Table 1: client-wise accuracy (each client's held-out data), global test accuracy and mean
simulated time per round at the end of the budget, mean over seeds (± 95% t-interval for
the global accuracy). Table 2: simulated time and rounds to the target accuracy, mean over
the seeds that reached it, and how many did. Fig. 1: box and violin plots of final accuracy
over seeds. Runs are grouped by cell name without the trailing seed.
"""

from __future__ import annotations

import argparse
import re
import statistics
from pathlib import Path

from scipy.stats import t as student_t

from fedhet.results import RunDirectory


def interval(values: list[float]) -> float:
    """Half-width of the 95% Student-t interval of the mean."""
    if len(values) < 2:
        return float("nan")
    return float(student_t.ppf(0.975, len(values) - 1) * statistics.stdev(values) / len(values) ** 0.5)


def label(cell: str) -> str:
    """``amsfl-<S>-<mu>[-paper]`` -> ``amsfl marginal (mu 1.0)``; baselines keep their name."""
    parts = cell.split("-")
    if parts[0] != "amsfl":
        return parts[0]
    return f"amsfl {'paper' if 'paper' in parts else 'marginal'} (mu {parts[2]})"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("grid", help="folder of run directories")
    parser.add_argument("--target", default="0.78", help="target accuracy of Table 2 (one of run.targets)")
    parser.add_argument("--figures", help="write <prefix>-box.png and <prefix>-violin.png")
    args = parser.parse_args()
    groups: dict[str, list[dict]] = {}
    for path in sorted(Path(args.grid).iterdir()):
        run = RunDirectory(path)
        if run.summary_path.exists():
            groups.setdefault(label(re.sub(r"-\d+$", "", path.name)), []).append(run.read_summary())
    clients = sorted(
        {c for runs in groups.values() for s in runs for c in (s["final_client_accuracy"] or {})}, key=int
    )
    head = ["method", "n"] + [f"acc C{int(c) + 1}" for c in clients] + ["global acc", "time/round (s)"]
    print("| " + " | ".join(head) + " |\n|" + "---|" * len(head))
    for name, runs in groups.items():
        acc = [s["final_test_accuracy"] for s in runs]
        cells = [name, str(len(runs))]
        cells += [f"{statistics.mean(s['final_client_accuracy'][c] for s in runs):.4f}" for c in clients]
        cells += [f"{statistics.mean(acc):.4f} ± {interval(acc):.4f}"]
        cells += [f"{statistics.mean(s['mean_round_time'] for s in runs):.2f}"]
        print("| " + " | ".join(cells) + " |")
    print("\n| method | target | reached | time (s) | rounds | time/round (s) |\n|---|---|---|---|---|---|")
    for name, runs in groups.items():
        hits = [s["targets"][args.target] for s in runs if s["targets"].get(args.target)]
        if hits:
            time = statistics.mean(h["sim_time"] for h in hits)
            rounds = statistics.mean(h["round"] for h in hits)
            spread = interval([h["sim_time"] for h in hits])
            print(
                f"| {name} | {args.target} | {len(hits)}/{len(runs)} | {time:.2f} ± {spread:.2f} "
                f"| {rounds:.1f} | {time / rounds:.2f} |"
            )
        else:
            print(f"| {name} | {args.target} | 0/{len(runs)} | - | - | - |")
    if args.figures:
        from fedhet.studies.plots import plot_distributions

        accuracy = {name: [s["final_test_accuracy"] for s in runs] for name, runs in groups.items()}
        for kind in ("box", "violin"):
            print(
                plot_distributions(accuracy, f"{args.figures}-{kind}.png", kind, "final accuracy over seeds")
            )


if __name__ == "__main__":
    main()
