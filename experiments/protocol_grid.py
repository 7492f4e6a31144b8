"""The command line the papers' protocol scripts share (experiments/fedstale_protocol.py,
experiments/adelfl_protocol.py): a tuning grid's runs and, later, its test grid's runs
written to one per-run table; the test grid written from the tuning rows; every number of
the page section printed from the table alone."""

from __future__ import annotations

import argparse
import csv
import sys
import tomllib
from collections.abc import Callable
from pathlib import Path

import tomli_w


def protocol_main(
    description: str,
    tune_config: str,
    columns: list[str],
    runs_table: Callable[[str, str], list[dict]],
    write_grid: Callable[[list[dict], str, str, list[int]], None],
    print_report: Callable[[list[dict]], None],
) -> int:
    """Parse ``TABLE [--tune DIR] [--test DIR] [--more-seeds DIR] [--grid OUT]``: with
    ``--tune`` rewrite the table from the finished grids (``runs_table(folder, stage)``);
    with ``--test`` alone keep its tuning rows and replace its test rows; with
    ``--more-seeds`` alone keep both and replace its ``more-seeds`` rows (extra seeds of some
    test cells, for a question the test grid left open); then read it, write the test grid
    with ``--grid`` and print the report."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("table", help="the per-run table (written with --tune, read otherwise)")
    parser.add_argument("--tune", help="the finished tuning grid's folder")
    parser.add_argument("--test", help="the finished test grid's folder")
    parser.add_argument("--grid", help="write the test grid here (from the table's tuning rows)")
    parser.add_argument("--more-seeds", help="a finished grid of more test seeds for some cells")
    parser.add_argument("--tune-config", default=tune_config)
    parser.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3, 4, 5])
    args = parser.parse_args()
    if args.tune or args.test or args.more_seeds:
        if args.tune:
            rows = runs_table(args.tune, "tune")
        else:  # keep the table's tuning rows (and test rows without --test), replace the rest
            kept = ("tune",) if args.test else ("tune", "test")
            rows = [row for row in _read(args.table) if row["stage"] in kept]
        rows += runs_table(args.test, "test") if args.test else []
        rows += runs_table(args.more_seeds, "more-seeds") if args.more_seeds else []
        with open(args.table, "w", newline="") as handle:
            writer = csv.DictWriter(handle, columns)
            writer.writeheader()
            writer.writerows(rows)
    rows = _read(args.table)
    if args.grid:
        write_grid(rows, args.tune_config, args.grid, args.seeds)
    print_report(rows)
    return 0


def _read(path: str) -> list[dict]:
    with open(path, newline="") as handle:
        return list(csv.DictReader(handle))


def write_test_grid(
    tune_config: str, name: str, cases: list[dict], seeds: list[int], report: dict, header: str, out: str
) -> None:
    """The test grid: the tuning grid's setting without its validation split and seed, the
    chosen ``cases`` crossed with ``seeds``, written to ``out`` after ``header``."""
    base = tomllib.loads(Path(tune_config).read_text())
    for key in ("cases", "grid", "report"):
        base.pop(key, None)
    base["experiment"]["name"] = name
    base["data"].pop("validation_fraction")
    base["run"].pop("seed")
    base["cases"] = cases
    base["grid"] = {"run.seed": seeds}
    base["report"] = report
    Path(out).write_text(header + tomli_w.dumps(base))
    print(f"{out}: {len(cases)} cases x {len(seeds)} seeds", file=sys.stderr)
