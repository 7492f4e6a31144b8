"""Paired comparisons of the persistent-stragglers grids against SALF's default rule.

    python experiments/salf_persistent_tests.py [runs/salf_persistent runs/salf_persistent_cnn]

For every row of experiments/salf_persistent.toml (MLP) and salf_persistent_cnn.toml (CNN):
each column's mean final test accuracy, its paired difference from `reached` (SALF eq. (9),
same seeds), the two-sided paired t-test p-value and the worst seed. These are the p-values
and worst seeds quoted in the "Persistent stragglers" section of docs/results/salf.md.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from fedhet.studies.stats import difference_p_value

SYSTEMS = {
    "straggler-ratio-0.9-True-2": "fixed 90%, depth >= 2",
    "straggler-ratio-0.9-True-1": "fixed 90%, depth >= 1",
    "exponential-uniform-0.2-1.8": "capabilities U(0.2, 1.8)",
}
COLUMNS = {"fedavg": "vanilla", "drop": "drop", "salf-inverse-reach": "inverse-reach", "salf-all": "all"}


def final_accuracies(folder: Path, prefix: str, column: str) -> dict[int, float]:
    """Seed -> final test accuracy of the runs ``<prefix>-<column>-<seed>`` in ``folder``."""
    out = {}
    for summary in sorted(folder.glob(f"{prefix}-{column}-*/summary.json")):
        seed = summary.parent.name[len(f"{prefix}-{column}-") :]
        if seed.isdigit():  # not salf-inverse-reach-1 when the column is salf
            out[int(seed)] = json.loads(summary.read_text())["final_test_accuracy"]
    return out


def main(folders: list[str]) -> None:
    for folder in map(Path, folders):
        print(f"\n## {folder}\n")
        print("| stragglers, U, labels | reached | " + " | ".join(COLUMNS.values()) + " |")
        print("|---|---|" + "---|" * len(COLUMNS))
        for system, label in SYSTEMS.items():
            prefixes = sorted({p.name.rsplit("-salf-", 1)[0] for p in folder.glob(f"{system}*-salf-1")})
            for prefix in prefixes:
                clients, partition = prefix.split("-")[-2:]
                reached = final_accuracies(folder, prefix, "salf")
                if not reached:
                    continue
                cells = [f"{sum(reached.values()) / len(reached):.3f} (worst {min(reached.values()):.3f})"]
                for column in COLUMNS:
                    values = final_accuracies(folder, prefix, column)
                    common = sorted(set(values) & set(reached))
                    diff = sum(values[s] - reached[s] for s in common) / max(1, len(common))
                    p = difference_p_value(values, reached)
                    p_text = "n/a" if p is None else f"{p:.3f}"
                    cells.append(f"{diff:+.3f}, p = {p_text} (worst {min(values.values()):.3f})")
                print(f"| {label}, U = {clients}, {partition} | " + " | ".join(cells) + " |")
    print("\nCells: mean paired difference from `reached` over the common seeds, two-sided paired t-test.")


if __name__ == "__main__":
    main(sys.argv[1:] or ["runs/salf_persistent", "runs/salf_persistent_cnn"])
