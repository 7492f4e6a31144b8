"""AMSFL Tables 1-2 and the allocations, from a grid's per-run table (experiments/amsfl_nslkdd.toml,
experiments/amsfl_tables.toml, experiments/amsfl_mu.toml).

    python experiments/amsfl_report.py docs/results/data/amsfl-nslkdd.csv
    # from a finished grid (writes the committed per-run table first):
    python experiments/amsfl_report.py docs/results/data/amsfl-nslkdd.csv --runs runs/amsfl_nslkdd
    python experiments/amsfl_report.py TABLE.csv --runs runs/amsfl_tables --figures PREFIX
    python experiments/amsfl_report.py TABLE.csv --runs runs/amsfl_mu --split algorithm.mu

The per-run table has one row per finished run: its test set (``data.test_set``; ``-`` on
other datasets), method (the run's [algorithm] section, plus "deadline" for runs with a round
deadline, plus the values of any ``--split`` keys), seed, final accuracies, mean simulated
round time, the time and round each target accuracy was first reached, AMSFL's steps per
client summed over rounds and where GDA's L came from, and the fedhet build.

Table 1: client-wise accuracy (each client's held-out data), global test accuracy (mean ±
95% t interval over seeds), the paired difference from FedAvg (same seeds: same data split
and initial model) with its p-value and the Holm-corrected p over the table's comparisons,
and mean simulated time per round. Table 2: simulated time and rounds to the target, mean
over the seeds that reached it (± 95% t interval), how many did, and the paired time
difference from FedAvg over the seeds where both reached it (p, Holm-corrected p). Then what
AMSFL's allocations did (mean steps per client, share of rounds GDA's L came from local
steps, from consecutive rounds, or was kept). Section titles go to stderr, tables to stdout.
"""

from __future__ import annotations

import argparse
import csv
import json
import statistics
import sys
import tomllib
from collections import defaultdict
from pathlib import Path

import numpy as np

from fedhet.results import RunDirectory
from fedhet.studies.stats import difference_p_value, estimate, holm

COLUMNS = ["test_set", "method", "seed", "final_test_accuracy", "client_accuracy", "mean_round_time",
           "targets", "steps_sum", "rounds_counted", "smoothness_from", "fedhet"]  # fmt: skip
TARGETS = ["official=0.77", "holdout=0.95", "0.78"]  # Table 2's target per test set; "-": 0.78


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


def write_table(folder: str, out: str, split: list[str]) -> None:
    """The per-run table of a finished grid (floats written in full: the tables computed from
    it equal the ones computed from the runs)."""
    rows = []
    for path in sorted(Path(folder).iterdir()):
        run = RunDirectory(path)
        if not run.summary_path.exists():
            continue
        summary = run.read_summary()
        if not summary.get("finished"):
            continue
        config = tomllib.loads((path / "config.toml").read_text())
        test_set = config["data"].get("test_set", "-") if config["data"]["dataset"] == "nsl-kdd" else "-"
        name = method(config)
        if split:
            name += " [" + ", ".join(setting(config, key) for key in split) + "]"
        clients = summary["final_client_accuracy"]
        targets = {t: [hit["sim_time"], hit["round"]] for t, hit in summary["targets"].items() if hit}
        steps_sum, counted, sources = "", "", ""
        if name.startswith("amsfl"):
            report = json.loads((path / "amsfl.json").read_text())
            steps = np.array([row["steps"] for row in report["rounds"]], dtype=float)
            counts: dict[str, int] = defaultdict(int)
            for row in report["rounds"]:
                counts[row.get("smoothness_from", "none")] += 1
            steps_sum = ";".join(repr(float(v)) for v in steps.sum(axis=0))
            counted, sources = str(len(steps)), json.dumps(dict(sorted(counts.items())))
        rows.append([
            test_set, name, config["run"]["seed"], repr(float(summary["final_test_accuracy"])),
            ";".join(repr(float(clients[c])) for c in sorted(clients, key=int)),
            repr(float(summary["mean_round_time"])), json.dumps(targets, sort_keys=True), steps_sum,
            counted, sources, summary.get("fedhet", ""),
        ])  # fmt: skip
    rows.sort(key=lambda r: (r[0], r[1], int(r[2])))
    with open(out, "w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(COLUMNS)
        writer.writerows(rows)
    print(f"{out}: {len(rows)} runs", file=sys.stderr)


def read_table(path: str) -> dict:
    """{test set: {method: {seed: row}}} from the per-run table."""
    groups: dict = defaultdict(lambda: defaultdict(dict))
    with open(path, newline="") as handle:
        for row in csv.DictReader(handle):
            row["clients"] = [float(v) for v in row["client_accuracy"].split(";")]
            row["hits"] = json.loads(row["targets"])
            groups[row["test_set"]][row["method"]][int(row["seed"])] = row
    return groups


def order(methods) -> list[str]:
    first = ["fedavg", "fedprox", "fednova", "scaffold", "feddyn"]
    return sorted(methods, key=lambda m: (m.split(" ")[0] not in first, m.startswith("amsfl"), m))


def _p(value: float | None) -> str:
    return "-" if value is None else f"{value:.2g}"


def accuracy_table(runs: dict) -> None:
    clients = len(next(iter(next(iter(runs.values())).values()))["clients"])
    head = ["method", "n", *[f"acc C{c + 1}" for c in range(clients)], "global acc",
            "vs FedAvg (p; Holm)", "time/round (s)"]  # fmt: skip
    print("| " + " | ".join(head) + " |\n|" + "---|" * len(head))
    base = {seed: float(r["final_test_accuracy"]) for seed, r in runs.get("fedavg", {}).items()}
    names = order(runs)
    accuracy = {
        name: {seed: float(r["final_test_accuracy"]) for seed, r in runs[name].items()} for name in names
    }
    p_values = [
        None if name == "fedavg" or not base else difference_p_value(accuracy[name], base) for name in names
    ]
    for name, p, adjusted in zip(names, p_values, holm(p_values), strict=True):
        seeds, acc = runs[name], accuracy[name]
        e = estimate(list(acc.values()), "ci95")
        cells = [name, str(len(seeds))]
        cells += [f"{statistics.mean(r['clients'][c] for r in seeds.values()):.4f}" for c in range(clients)]
        cells.append(f"{e.mean:.4f} ± {e.spread:.4f}")
        if name == "fedavg" or not base:
            cells.append("")
        else:
            d = estimate([acc[s] - base[s] for s in sorted(set(acc) & set(base))], "ci95")
            cells.append(f"{d.mean:+.4f} ± {d.spread:.4f} ({_p(p)}; {_p(adjusted)})")
        cells.append(f"{statistics.mean(float(r['mean_round_time']) for r in seeds.values()):.2f}")
        print("| " + " | ".join(cells) + " |")


def target_table(runs: dict, target: str) -> None:
    print("| method | reached | time (s) | rounds | vs FedAvg, time (s, paired; p; Holm) |")
    print("|---|---|---|---|---|")
    base = {seed: r["hits"].get(target) for seed, r in runs.get("fedavg", {}).items()}
    names = order(runs)
    hits = {
        name: {s: r["hits"][target] for s, r in runs[name].items() if r["hits"].get(target)} for name in names
    }
    p_values: list[float | None] = []
    for name in names:
        both = sorted(s for s in hits[name] if base.get(s))
        if name == "fedavg" or len(both) < 2:
            p_values.append(None)
            continue
        p_values.append(
            difference_p_value({s: hits[name][s][0] for s in both}, {s: base[s][0] for s in both})
        )
    for name, p, adjusted in zip(names, p_values, holm(p_values), strict=True):
        reached = f"{len(hits[name])}/{len(runs[name])}"
        if not hits[name]:
            print(f"| {name} | {reached} | - | - | - |")
            continue
        time = estimate([h[0] for h in hits[name].values()], "ci95")
        rounds = statistics.mean(h[1] for h in hits[name].values())
        versus = ""
        if p is not None:
            both = sorted(s for s in hits[name] if base.get(s))
            d = estimate([hits[name][s][0] - base[s][0] for s in both], "ci95")
            versus = f"{d.mean:+.2f} ± {d.spread:.2f} ({len(both)} seeds; {_p(p)}; {_p(adjusted)})"
        print(f"| {name} | {reached} | {time.mean:.2f} ± {time.spread:.2f} | {rounds:.1f} | {versus} |")


def allocation_table(runs: dict) -> None:
    print("| method | mean steps per client (slowest .. fastest) | L from steps / rounds / kept |")
    print("|---|---|---|")
    for name in order(runs):
        if not name.startswith("amsfl"):
            continue
        rows = runs[name].values()
        total = np.sum([[float(v) for v in r["steps_sum"].split(";")] for r in rows], axis=0)
        rounds = sum(int(r["rounds_counted"]) for r in rows)
        sources: dict[str, int] = defaultdict(int)
        for r in rows:
            for key, count in json.loads(r["smoothness_from"]).items():
                sources[key] += count
        share = " / ".join(f"{sources[k] / sum(sources.values()):.2f}" for k in ("steps", "rounds", "kept"))
        print(f"| {name} | {' '.join(f'{v:.2f}' for v in total / rounds)} | {share} |")


def targets_of(given: list[str]) -> dict[str, str]:
    """``["official=0.77", "0.78"]`` as {test set: target}; a bare target is for ``-``."""
    return dict(t.split("=", 1) if "=" in t else ("-", t) for t in given)


def split_table(runs: dict, baseline: dict, target: str) -> None:
    """One row per value of the ``--split`` key (the mu grid): mean steps per client, final
    accuracy, the paired difference from ``baseline``'s FedAvg runs of the same seeds (p,
    Holm-corrected over the rows), time to ``target`` and time per round."""
    print("| mu | mean steps (slowest .. fastest client) | final accuracy | vs FedAvg (p; Holm) "
          "| time to " + target + " (s) | time per round (s) |")  # fmt: skip
    print("|---|---|---|---|---|---|")
    base = {seed: float(r["final_test_accuracy"]) for seed, r in baseline["fedavg"].items()}
    names = sorted(runs, key=lambda name: float(name.rsplit(" ", 1)[1].rstrip("]")))
    accuracy = {
        name: {seed: float(r["final_test_accuracy"]) for seed, r in runs[name].items()} for name in names
    }
    p_values = [difference_p_value(accuracy[name], base) for name in names]
    for name, p, adjusted in zip(names, p_values, holm(p_values), strict=True):
        rows = runs[name].values()
        total = np.sum([[float(v) for v in r["steps_sum"].split(";")] for r in rows], axis=0)
        steps = total / sum(int(r["rounds_counted"]) for r in rows)
        low, high = f"{steps.min():.2f}", f"{steps.max():.2f}"
        shown = f"{low} on every client" if low == high else f"{low} .. {high}"
        acc = estimate(list(accuracy[name].values()), "ci95")
        d = estimate([accuracy[name][s] - base[s] for s in sorted(set(accuracy[name]) & set(base))], "ci95")
        times = [r["hits"][target][0] for r in rows if r["hits"].get(target)]
        time = estimate(times, "ci95") if times else None
        mu = float(name.rsplit(" ", 1)[1].rstrip("]"))
        cells = [f"{mu:,g}", shown, f"{acc.mean:.3f} ± {acc.spread:.3f}",
                 f"{d.mean:+.3f} ± {d.spread:.3f} ({_p(p)}; {_p(adjusted)})",
                 "-" if time is None else f"{time.mean:.1f} ± {time.spread:.1f}",
                 f"{statistics.mean(float(r['mean_round_time']) for r in rows):.2f}"]  # fmt: skip
        print("| " + " | ".join(cells) + " |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("table", help="the per-run table (CSV): read, or written first with --runs")
    parser.add_argument("--runs", help="a finished grid's folder: write the per-run table from it first")
    parser.add_argument(
        "--target", nargs="+", default=TARGETS, help="Table 2's target: TEST_SET=TARGET or one for all"
    )
    parser.add_argument("--figures", help="write <prefix>[-<test set>]-box.png")
    parser.add_argument(
        "--split", nargs="+", default=[], metavar="KEY", help="config keys telling methods apart"
    )
    parser.add_argument(
        "--baseline", help="a per-run table with the FedAvg runs to pair with: one row per --split value"
    )
    args = parser.parse_args()
    if args.runs:
        write_table(args.runs, args.table, args.split)
    targets = targets_of(args.target)
    if args.baseline:
        baseline = read_table(args.baseline)["-"]
        for runs in read_table(args.table).values():
            split_table(runs, baseline, targets.get("-", "0.78"))
        return
    for test_set, runs in sorted(read_table(args.table).items()):
        title = f"test set: {test_set}" if test_set != "-" else "test set: the dataset's own"
        target = targets.get(test_set, targets.get("-", "0.78"))
        print(f"\n## {title}\n### Table 1", file=sys.stderr, flush=True)
        accuracy_table(runs)
        print(f"\n### Table 2 (target {target})", file=sys.stderr, flush=True)
        target_table(runs, target)
        print("\n### AMSFL's allocations", file=sys.stderr, flush=True)
        allocation_table(runs)
        sys.stdout.flush()
        if args.figures:
            from fedhet.studies.plots import plot_distributions

            accuracy = {
                name: [float(r["final_test_accuracy"]) for r in runs[name].values()] for name in order(runs)
            }
            suffix = "" if test_set == "-" else f"-{test_set}"
            path = plot_distributions(
                accuracy, f"{args.figures}{suffix}-box.png", "box", "final accuracy over seeds"
            )
            print(path, file=sys.stderr)


if __name__ == "__main__":
    main()
