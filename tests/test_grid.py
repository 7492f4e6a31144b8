"""Experiment grids expand to independent cells, tabulate, and skip finished cells."""

from __future__ import annotations

from conftest import SALF_DIGITS_TOML

from fedhet.studies.grid import load_experiment, report_table, run_experiment

GRID = (
    SALF_DIGITS_TOML.replace("rounds = 30", "rounds = 4")
    + """
[experiment]
name = "tiny"
jobs = 1

[grid]
"system.straggler_ratio" = [0.3, 0.9]
algorithm = [{ name = "drop" }, { name = "salf", normalize = "all" }]

[report]
rows = ["system.straggler_ratio"]
columns = ["algorithm"]
"""
)


def test_grid_cells_run_once_and_fill_the_table(tmp_path):
    path = tmp_path / "tiny.toml"
    path.write_text(GRID)
    experiment = load_experiment(path)
    assert [c.name for c in experiment.cells] == ["0.3-drop", "0.3-salf-all", "0.9-drop", "0.9-salf-all"]
    assert experiment.cells[1].config.algorithm.to_dict() == {"name": "salf", "normalize": "all"}
    summaries = run_experiment(experiment, tmp_path / "out")
    assert len(summaries) == 4 and all(s["finished"] for s in summaries.values())
    table = report_table(experiment, summaries)
    assert "salf(normalize=all)" in table and table.count("\n") == 4
    stamp = (tmp_path / "out" / "0.3-drop" / "summary.json").stat().st_mtime_ns
    seen = []
    run_experiment(experiment, tmp_path / "out", on_cell=lambda cell, s: seen.append(cell.name))
    assert len(seen) == 4  # reported from disk, not rerun
    assert (tmp_path / "out" / "0.3-drop" / "summary.json").stat().st_mtime_ns == stamp


def test_cells_sharing_a_table_entry_show_mean_and_spread(tmp_path):
    """Seeds left out of rows and columns are averaged: mean ± sample standard deviation."""
    path = tmp_path / "seeds.toml"
    path.write_text(
        GRID.replace('"system.straggler_ratio" = [0.3, 0.9]', '"run.seed" = [1, 2]').replace(
            'rows = ["system.straggler_ratio"]', "rows = []"
        )
    )
    experiment = load_experiment(path)
    assert [c.name for c in experiment.cells] == ["1-drop", "1-salf-all", "2-drop", "2-salf-all"]
    values = [0.5, 0.7, 0.6, 0.7]
    fake = {c.name: {"final_test_accuracy": v} for c, v in zip(experiment.cells, values, strict=True)}
    table = report_table(experiment, fake)
    assert "| 0.550 ± 0.071 | 0.700 ± 0.000 |" in table
