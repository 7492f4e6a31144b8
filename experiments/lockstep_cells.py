"""Two cells of the committed heterogeneity leaderboard run again, each of their five seed
runs alone and the five in lockstep as one computation (fedhet.engine.cohort), beside the
per-seed test accuracies the leaderboard committed (docs/results/data/leaderboard.csv).

A cell is a scenario, a method and one of its tunings: the tuned values the CSV records
(``tuned``), the suite's seeds. Lockstep against alone says whether training the seeds as
one computation changes a result (it should not, beyond float rounding); both against the
committed figures say whether this build still gives the field's numbers.

    python experiments/lockstep_cells.py
    python experiments/lockstep_cells.py --cells random-50/salf/1 persistent-90/fedavg/2
"""

from __future__ import annotations

import argparse
import csv
import json
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LEADERBOARD = ROOT / "docs" / "results" / "data" / "leaderboard.csv"


def committed(scenario: str, method: str, tuning: int) -> tuple[dict, dict[int, float]]:
    """The cell's tuned values and its per-seed test accuracies, as committed."""
    with open(LEADERBOARD, newline="") as fh:
        for row in csv.DictReader(fh):
            if row["scenario"] == scenario and row["method"] == method:
                values = json.loads(row["tuned"])[tuning - 1]
                seeds = {}
                for item in row["accuracy_by_seed"].split(";"):
                    where, value = item.split(":")
                    repeat, seed = (int(x) for x in where.split("/"))
                    if repeat == tuning:
                        seeds[seed] = float(value)
                return values, seeds
    raise SystemExit(f"{LEADERBOARD}: no row {scenario}/{method}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cells", nargs="+", default=["random-50/salf/1", "random-50/fedavg/1"],
                        help="SCENARIO/METHOD/TUNING")  # fmt: skip
    args = parser.parse_args()
    import torch

    from fedhet.bench.suite import load_suite
    from fedhet.config import from_dict
    from fedhet.engine.cohort import CohortRun
    from fedhet.engine.launch import run, run_together

    torch.set_num_threads(1)
    suite = load_suite(ROOT / "suites" / "heterogeneity.toml")
    print("| cell | seed | committed | alone | lockstep | lockstep - alone |")
    print("|---|---|---|---|---|---|")
    with tempfile.TemporaryDirectory(prefix="fedhet-lockstep-cells-") as folder:
        for cell in args.cells:
            scenario_name, method_label, tuning = cell.split("/")
            scenario = next(s for s in suite.scenarios if s.name == scenario_name)
            method = next(m for m in suite.methods if m.label == method_label)
            values, accuracies = committed(scenario_name, method_label, int(tuning))
            configs = {
                s: from_dict(suite.config(scenario, method, values, f"seed-{s}", seed=s)) for s in suite.seeds
            }
            alone = {s: run(c, Path(folder) / cell / f"alone-{s}").summary for s, c in configs.items()}
            together = run_together(
                [CohortRun(c, Path(folder) / cell / f"lockstep-{s}") for s, c in configs.items()]
            )
            for (seed, summary), result in zip(alone.items(), together, strict=True):
                if isinstance(result, BaseException):
                    raise result
                a, b = summary["final_test_accuracy"], result.summary["final_test_accuracy"]
                print(f"| {cell} | {seed} | {accuracies.get(seed, float('nan')):.4f} | {a:.4f} | {b:.4f} | "
                      f"{b - a:+.4f} |")  # fmt: skip
    sys.stdout.flush()


if __name__ == "__main__":
    main()
