"""Experiment grids expand to independent cells, tabulate, and skip finished cells."""

from __future__ import annotations

import csv
import io

from conftest import SALF_DIGITS_TOML

import fedhet
from fedhet.studies.grid import load_experiment, report_table, run_experiment
from fedhet.studies.tables import cells_csv

GRID = (
    SALF_DIGITS_TOML.replace("rounds = 5", "rounds = 4")
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
    # the per-run table: one row per cell, its grid values, its summary's numbers and build
    rows = list(csv.DictReader(io.StringIO(cells_csv(experiment, summaries))))
    assert [r["cell"] for r in rows] == [c.name for c in experiment.cells]
    assert [r["system.straggler_ratio"] for r in rows] == ["0.3", "0.3", "0.9", "0.9"]
    assert [r["algorithm.normalize"] for r in rows] == ["", "all", "", "all"]
    assert [float(r["final_test_accuracy"]) for r in rows] == [
        s["final_test_accuracy"] for s in summaries.values()
    ]
    assert all(r["fedhet"].startswith(fedhet.__version__) for r in rows)
    # and the table comes back from it alone, reference marks included
    from fedhet.studies.tables import summaries_from_cells

    experiment.reference = "drop"
    assert report_table(experiment, summaries_from_cells(cells_csv(experiment, summaries))) == report_table(
        experiment, summaries
    )


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


def test_intervals_are_the_sample_std_or_the_t_interval_of_the_mean():
    from scipy.stats import t

    from fedhet.studies.stats import estimate

    values = [0.70, 0.74, 0.78, 0.72, 0.76]
    std = estimate(values, "std")
    ci = estimate(values, "ci95")
    assert std.n == ci.n == 5 and abs(std.mean - 0.74) < 1e-12
    assert abs(std.spread - 0.0316227766) < 1e-9
    assert abs(ci.spread - t.ppf(0.975, 4) * 0.0316227766 / 5**0.5) < 1e-9
    assert estimate([0.5], "ci95").spread == 0.0


def test_paired_p_values_pair_seeds_and_fall_back_to_welch():
    from scipy.stats import ttest_ind, ttest_rel

    from fedhet.studies.stats import difference_p_value

    a = {1: 0.80, 2: 0.71, 3: 0.77, 4: 0.69}
    b = {1: 0.78, 2: 0.70, 3: 0.74, 4: 0.68}  # below a in every seed, seeds vary a lot
    paired = difference_p_value(a, b)
    assert abs(paired - ttest_rel(list(a.values()), list(b.values())).pvalue) < 1e-12
    assert paired < 0.05 < ttest_ind(list(a.values()), list(b.values())).pvalue  # pairing matters
    assert difference_p_value({1: 0.5, 2: 0.6}, {1: 0.4, 2: 0.5}) == 0.0  # constant difference
    assert difference_p_value({1: 0.5, 2: 0.6}, {1: 0.5, 2: 0.6}) == 1.0
    unpaired = difference_p_value({1: 0.5, 2: 0.6, 3: 0.55}, {7: 0.4, 8: 0.45})
    assert abs(unpaired - ttest_ind([0.5, 0.6, 0.55], [0.4, 0.45], equal_var=False).pvalue) < 1e-12
    assert difference_p_value({1: 0.5}, {2: 0.4}) is None


def test_a_reference_column_marks_significant_cells_and_bad_references_are_refused(tmp_path):
    import pytest

    from fedhet.errors import ConfigError

    path = tmp_path / "seeds.toml"
    text = GRID.replace('"system.straggler_ratio" = [0.3, 0.9]', '"run.seed" = [1, 2, 3, 4]').replace(
        'rows = ["system.straggler_ratio"]', "rows = []"
    )
    path.write_text(text.replace("[report]\n", '[report]\ninterval = "ci95"\nreference = "drop"\n'))
    experiment = load_experiment(path)
    drop = [0.60, 0.70, 0.65, 0.75]
    salf = [0.62, 0.73, 0.66, 0.78]  # above drop in every seed
    values = [v for pair in zip(drop, salf, strict=True) for v in pair]
    fake = {c.name: {"final_test_accuracy": v} for c, v in zip(experiment.cells, values, strict=True)}
    table = report_table(experiment, fake)
    body = "".join(line for line in table.splitlines() if line.startswith("|"))
    assert "↑" in body and "↓" not in body and "paired t-test" in table and "95% confidence" in table
    salf[2] = 0.60  # one seed below: no longer significant
    values = [v for pair in zip(drop, salf, strict=True) for v in pair]
    fake = {c.name: {"final_test_accuracy": v} for c, v in zip(experiment.cells, values, strict=True)}
    body = "".join(line for line in report_table(experiment, fake).splitlines() if line.startswith("|"))
    assert "↑" not in body
    path.write_text(text.replace("[report]\n", '[report]\nreference = "fedavg"\n'))
    with pytest.raises(ConfigError, match=r"report.reference = 'fedavg': not a column .*drop"):
        load_experiment(path)
    path.write_text(text.replace("[report]\n", '[report]\ninterval = "sem"\n'))
    with pytest.raises(ConfigError, match="report.interval = 'sem'"):
        load_experiment(path)


def test_the_marks_against_a_reference_are_holm_corrected_over_the_table_unless_asked_not_to(tmp_path):
    """Two rows, each testing salf against drop over 4 seeds with p = 0.046: uncorrected both
    cells are marked; Holm over the table's 2 tests adjusts the smaller p to 2p > 0.05, and
    neither is."""
    from scipy.stats import ttest_rel

    path = tmp_path / "holm.toml"
    seeds = '"system.straggler_ratio" = [0.3, 0.9]\n"run.seed" = [1, 2, 3, 4]'
    text = GRID.replace('"system.straggler_ratio" = [0.3, 0.9]', seeds)
    path.write_text(text.replace("[report]\n", '[report]\nreference = "drop"\n'))
    experiment = load_experiment(path)
    assert experiment.correction == "holm"
    drop = {0.3: [0.60, 0.70, 0.65, 0.75], 0.9: [0.50, 0.55, 0.52, 0.58]}
    salf = {0.3: [0.64, 0.71, 0.67, 0.80], 0.9: [0.54, 0.56, 0.54, 0.63]}
    for ratio in drop:
        assert 0.025 < ttest_rel(salf[ratio], drop[ratio]).pvalue < 0.05
    fake = {}
    for cell in experiment.cells:
        ratio, seed = cell.config.system.get("straggler_ratio"), cell.config.run.seed
        column = drop if cell.config.algorithm.name == "drop" else salf
        fake[cell.name] = {"final_test_accuracy": column[ratio][seed - 1]}

    def marked() -> int:
        lines = report_table(experiment, fake).splitlines()
        return sum(line.count("↑") for line in lines if line.startswith("| 0."))

    assert marked() == 0 and "Holm-corrected over the table's 2 tests" in report_table(experiment, fake)
    experiment.correction = "none"
    assert marked() == 2 and "uncorrected" in report_table(experiment, fake)


def test_a_per_client_list_in_a_case_names_its_cells_shortly(tmp_path):
    """One value per client makes a label too long for a folder: 10 equal values are named
    0.01x10, unequal ones by a digest, so the two cases' cells differ and are usable folders."""
    path = tmp_path / "lists.toml"
    path.write_text(
        GRID.replace('"system.straggler_ratio" = [0.3, 0.9]\n', "")
        + '\n[[cases]]\n"system.participation_probs" = ['
        + ", ".join(["0.01"] * 10)
        + ']\n\n[[cases]]\n"system.participation_probs" = ['
        + ", ".join(f"0.{i + 10}" for i in range(10))
        + "]\n"
    )
    text = path.read_text().replace('rows = ["system.straggler_ratio"]', "rows = []")
    path.write_text(text.replace("[system]", '[system]\nparticipation = "list"'))
    names = [c.name for c in load_experiment(path).cells]
    assert names[:2] == ["0.01x10-drop", "0.01x10-salf-all"]
    assert names[2].startswith("list-") and len(names[2]) == len("list-12345678-drop")


def test_a_significance_mark_shows_the_corrected_verdict_and_an_uncorrected_one_in_parentheses():
    """↑/↓ only when the Holm-corrected p is below alpha; a difference that is significant
    only before the correction is shown in parentheses; neither, no mark."""
    from fedhet.studies.stats import significance_mark

    assert significance_mark(True, 0.001, 0.01) == " ↑"
    assert significance_mark(False, 0.001, 0.01) == " ↓"
    assert significance_mark(False, 0.01, 0.3) == " (↓)"
    assert significance_mark(True, 0.2, 1.0) == "" and significance_mark(True, None, None) == ""


def test_a_second_grid_into_a_folder_in_use_is_refused_in_one_line(tmp_path, capsys):
    """Two ``fedhet reproduce`` into one --out: the second is refused before any cell runs
    (it would mark the first's cells failed in its table), naming the folder's holder."""
    from fedhet.cli import main
    from fedhet.results import RunLock
    from fedhet.studies.launcher import GRID_LOCK

    path = tmp_path / "tiny.toml"
    path.write_text(GRID)
    out = tmp_path / "out"
    out.mkdir()
    first = RunLock(out / GRID_LOCK)
    first.acquire()  # a grid running into the folder
    try:
        assert main(["reproduce", str(path), "--out", str(out), "--quiet"]) == 2  # a fedhet error
    finally:
        first.release()
    err = capsys.readouterr().err
    assert "in use by another fedhet run" in err and "Traceback" not in err
    assert not any(p.is_dir() for p in out.iterdir())  # no cell ran
    assert main(["reproduce", str(path), "--out", str(out), "--quiet"]) == 0  # free again: it runs
