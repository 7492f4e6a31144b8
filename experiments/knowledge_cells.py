"""Leaderboard cells re-run under each planner knowledge: a sub-model rule's tuned settings
(read from a leaderboard.csv) run on the suite's seeds with ``algorithm.planner_knowledge``
set to each of the given values; prints, per method and knowledge, the mean final test
accuracy with a 95% t-interval over the seed runs (tunings x seeds), the mean over the
tunings' means (the leaderboard's cell), and the clients sent work that missed the deadline.

    python experiments/knowledge_cells.py suites/heterogeneity.toml docs/results/data/leaderboard.csv \\
        --scenario random-90 --methods heterofl fiarse slt --knowledge oracle history --out runs/knowledge

Runs already finished in ``--out`` are read, not run again. The settings were tuned once, under
the knowledge the leaderboard ran with (the five-tuning field: ``history``, so its ``history``
runs give the field's per-seed accuracies); they are not tuned again here.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import numpy as np
from scipy import stats


def _run(job: tuple[dict, str]) -> dict:
    import torch

    torch.set_num_threads(1)
    from fedhet.config import from_dict
    from fedhet.engine.launch import run

    raw, folder = job
    summary_path = Path(folder) / "summary.json"
    if summary_path.exists():
        return json.loads(summary_path.read_text())
    return run(from_dict(raw), folder).summary


def _tunings(leaderboard: Path, scenario: str, method: str) -> list[dict]:
    for row in csv.DictReader(leaderboard.open()):
        if row["scenario"] == scenario and row["method"] == method:
            return json.loads(row["tuned"])
    raise SystemExit(f"{leaderboard}: no row for scenario {scenario}, method {method}")


def _jobs(args) -> list[tuple[tuple, tuple[dict, str]]]:
    from fedhet.bench.suite import load_suite

    suite = load_suite(args.suite)
    scenario = next(s for s in suite.scenarios if s.name == args.scenario)
    methods = {m.label: m for m in suite.methods}
    jobs = []
    for label in args.methods:
        for knowledge in args.knowledge:
            for repeat, params in enumerate(_tunings(args.leaderboard, args.scenario, label), start=1):
                for seed in suite.seeds:
                    name = f"{args.scenario}-{label}-{knowledge}-t{repeat}-s{seed}"
                    raw = suite.config(scenario, methods[label], params, name, seed=seed)
                    raw["algorithm"]["planner_knowledge"] = knowledge
                    folder = str(Path(args.out) / label / knowledge / f"tuning-{repeat}" / f"seed-{seed}")
                    jobs.append(((label, knowledge, repeat, seed), (raw, folder)))
    return jobs


def _table(results: dict[tuple, dict]) -> None:
    print("| method | knowledge | mean (95% CI, n runs) | mean over tunings | late sub-models per run |")
    print("|---|---|---|---|---|")
    for label, knowledge in dict.fromkeys((k[0], k[1]) for k in results):
        runs = {k: v for k, v in results.items() if k[:2] == (label, knowledge)}
        scores = np.array([v["final_test_accuracy"] for v in runs.values()], dtype=float)
        low, high = stats.t.interval(0.95, len(scores) - 1, loc=scores.mean(), scale=stats.sem(scores))
        by_tuning = [np.mean([v["final_test_accuracy"] for k, v in runs.items() if k[2] == r])
                     for r in sorted({k[2] for k in runs})]  # fmt: skip
        late = [v.get("late_sub_models", 0) for v in runs.values()]
        print(f"| {label} | {knowledge} | {scores.mean():.4f} ± {(high - low) / 2:.4f} ({len(scores)}) | "
              f"{np.mean(by_tuning):.4f} | {np.mean(late):.1f} |")  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("suite")
    parser.add_argument("leaderboard", type=Path)
    parser.add_argument("--scenario", required=True)
    parser.add_argument("--methods", nargs="+", required=True)
    parser.add_argument("--knowledge", nargs="+", default=["oracle", "history"])
    parser.add_argument("--out", default="runs/knowledge")
    parser.add_argument("--jobs", type=int, default=2)
    args = parser.parse_args()
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    jobs = _jobs(args)
    with ProcessPoolExecutor(args.jobs) as pool:
        summaries = list(pool.map(_run, [job for _, job in jobs]))
    results = {}
    for (key, (_, folder)), summary in zip(jobs, summaries, strict=True):
        metrics = list(csv.DictReader((Path(folder) / "metrics.csv").open()))
        late = float(metrics[-1].get("late_sub_models") or 0) if metrics else 0.0
        results[key] = {**summary, "late_sub_models": late}
    _table(results)


if __name__ == "__main__":
    main()
