"""AMSFL Tables 1-2 and Fig. 1 from a grid of runs (experiments/amsfl_nslkdd.toml,
experiments/amsfl_tables.toml).

    python experiments/amsfl_report.py runs/amsfl_nslkdd [--target official=0.77 holdout=0.97]
    python experiments/amsfl_report.py runs/amsfl_tables --target 0.78 [--figures PREFIX]
    python experiments/amsfl_report.py runs/amsfl_mu --target 0.78 --split algorithm.mu

Runs are grouped by test set (``data.test_set``; one group on other datasets) and method
(the run's [algorithm] section, plus "deadline" for runs with a round deadline, plus the
values of any ``--split`` keys). Table 1:
client-wise accuracy (each client's held-out data), global test accuracy (mean ± 95% t
interval over seeds), the paired difference from FedAvg (same seeds: same data split and
initial model) with its p-value, and mean simulated time per round. Table 2: simulated time
and rounds to the target, mean over the seeds that reached it (± 95% interval), and how many
did; the paired time difference from FedAvg over the seeds where both reached it. Then what
AMSFL's allocations did (mean steps per client, share of rounds GDA's L came from local steps,
from consecutive rounds, or was kept). Fig. 1: box plots of final accuracy over seeds.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tomllib
from collections import defaultdict
from pathlib import Path

import numpy as np

from fedhet.results import RunDirectory
from fedhet.studies.stats import difference_p_value, estimate


def method(config: dict) -> str:
    """A short name for a run's method: ``amsfl sqrt (GDA free)``, ``fednova (deadline)``."""
    algorithm = config["algorithm"]
    name = algorithm["name"]
    if name == "amsfl":
        allocation = algorithm.get("allocation", "marginal")
        return f"amsfl {allocation} (GDA {algorithm.get('gda_cost', 'charged')})"
    deadline = float(config["system"].get("deadline", 0)) < 100
    if name == "fedprox" and float(algorithm.get("mu", 0.01)) == 0.0:
        name = "fedavg"  # FedProx with mu = 0 is FedAvg that accepts partial work
    return f"{name} (deadline)" if deadline else name


def setting(config: dict, key: str) -> str:
    """The value of a dotted config key (``algorithm.mu``) as ``mu 1.0``; ``-`` where unset."""
    section, _, name = key.partition(".")
    return f"{name} {config.get(section, {}).get(name, '-')}"


def collect(folder: str, split: list[str]) -> dict:
    """{test set: {method: {seed: (summary, folder)}}}; ``split`` keys extend the method name."""
    groups: dict = defaultdict(lambda: defaultdict(dict))
    for path in sorted(Path(folder).iterdir()):
        run = RunDirectory(path)
        if not run.summary_path.exists():
            continue
        summary = run.read_summary()
        config = tomllib.loads((path / "config.toml").read_text())
        test_set = config["data"].get("test_set", "-") if config["data"]["dataset"] == "nsl-kdd" else "-"
        name = method(config)
        if split:
            name += " [" + ", ".join(setting(config, key) for key in split) + "]"
        groups[test_set][name][int(config["run"]["seed"])] = (summary, path)
    return groups


def order(methods) -> list[str]:
    first = ["fedavg", "fedprox", "fednova", "scaffold", "feddyn"]
    return sorted(methods, key=lambda m: (m.split(" ")[0] not in first, m.startswith("amsfl"), m))


def accuracy_table(runs: dict) -> None:
    clients = sorted(
        {c for seeds in runs.values() for s, _ in seeds.values() for c in s["final_client_accuracy"]}, key=int
    )
    head = [
        "method",
        "n",
        *[f"acc C{int(c) + 1}" for c in clients],
        "global acc",
        "vs FedAvg (p)",
        "time/round (s)",
    ]
    print("| " + " | ".join(head) + " |\n|" + "---|" * len(head))
    base = {seed: s["final_test_accuracy"] for seed, (s, _) in runs.get("fedavg", {}).items()}
    for name in order(runs):
        seeds = runs[name]
        acc = {seed: s["final_test_accuracy"] for seed, (s, _) in seeds.items()}
        e = estimate(list(acc.values()), "ci95")
        cells = [name, str(len(seeds))]
        cells += [
            f"{statistics.mean(s['final_client_accuracy'][c] for s, _ in seeds.values()):.4f}"
            for c in clients
        ]
        cells.append(f"{e.mean:.4f} ± {e.spread:.4f}")
        if name == "fedavg" or not base:
            cells.append("")
        else:
            common = sorted(set(acc) & set(base))
            d = estimate([acc[s] - base[s] for s in common], "ci95")
            p = difference_p_value(acc, base)
            cells.append(f"{d.mean:+.4f} ± {d.spread:.4f} ({'-' if p is None else f'{p:.2g}'})")
        cells.append(f"{statistics.mean(s['mean_round_time'] for s, _ in seeds.values()):.2f}")
        print("| " + " | ".join(cells) + " |")


def target_table(runs: dict, target: str) -> None:
    print("| method | reached | time (s) | rounds | vs FedAvg, time (s, paired) |\n|---|---|---|---|---|")
    base = {seed: s["targets"].get(target) for seed, (s, _) in runs.get("fedavg", {}).items()}
    for name in order(runs):
        seeds = runs[name]
        hits = {seed: s["targets"].get(target) for seed, (s, _) in seeds.items() if s["targets"].get(target)}
        if not hits:
            print(f"| {name} | 0/{len(seeds)} | - | - | - |")
            continue
        time = estimate([h["sim_time"] for h in hits.values()], "ci95")
        rounds = statistics.mean(h["round"] for h in hits.values())
        both = sorted(s for s in hits if base.get(s))
        versus = ""
        if name != "fedavg" and len(both) >= 2:
            d = estimate([hits[s]["sim_time"] - base[s]["sim_time"] for s in both], "ci95")
            p = difference_p_value(
                {s: hits[s]["sim_time"] for s in both}, {s: base[s]["sim_time"] for s in both}
            )
            versus = f"{d.mean:+.2f} ± {d.spread:.2f} (p {p:.2g}, {len(both)} seeds)"
        reached = f"{len(hits)}/{len(seeds)}"
        print(f"| {name} | {reached} | {time.mean:.2f} ± {time.spread:.2f} | {rounds:.1f} | {versus} |")


def allocation_table(runs: dict) -> None:
    print("| method | mean steps per client (slowest .. fastest) | L from steps / rounds / kept |")
    print("|---|---|---|")
    for name in order(runs):
        if not name.startswith("amsfl"):
            continue
        steps, sources = [], defaultdict(int)
        for _, path in runs[name].values():
            report = json.loads((path / "amsfl.json").read_text())
            for row in report["rounds"]:
                steps.append(row["steps"])
                sources[row.get("smoothness_from", "none")] += 1
        mean = np.mean(np.array(steps), axis=0)
        total = sum(sources.values())
        share = " / ".join(f"{sources[k] / total:.2f}" for k in ("steps", "rounds", "kept"))
        print(f"| {name} | {' '.join(f'{v:.2f}' for v in mean)} | {share} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("grid", help="folder of run directories")
    parser.add_argument(
        "--target", nargs="+", default=["0.78"], help="target of Table 2, or TEST_SET=TARGET per test set"
    )
    parser.add_argument("--figures", help="write <prefix>[-<test set>]-box.png")
    parser.add_argument(
        "--split", nargs="+", default=[], metavar="KEY", help="config keys telling methods apart"
    )
    args = parser.parse_args()
    targets = dict(t.split("=", 1) if "=" in t else ("*", t) for t in args.target)
    for test_set, runs in sorted(collect(args.grid, args.split).items()):
        title = f"test set: {test_set}" if test_set != "-" else "test set: the dataset's own"
        print(f"\n## {title}\n\n### Table 1\n")
        accuracy_table(runs)
        target = targets.get(test_set, targets.get("*", "0.78"))
        print(f"\n### Table 2 (target {target})\n")
        target_table(runs, target)
        print("\n### AMSFL's allocations\n")
        allocation_table(runs)
        if args.figures:
            from fedhet.studies.plots import plot_distributions

            accuracy = {
                name: [s["final_test_accuracy"] for s, _ in runs[name].values()] for name in order(runs)
            }
            suffix = "" if test_set == "-" else f"-{test_set}"
            print(
                plot_distributions(
                    accuracy, f"{args.figures}{suffix}-box.png", "box", "final accuracy over seeds"
                )
            )


if __name__ == "__main__":
    main()
