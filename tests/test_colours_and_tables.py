"""What a reader sees first: each method drawn in a colour of its own (a plug-in never in a
built-in's), and summary tables whole when a command's output goes to a pipe or a log."""

from __future__ import annotations

from fedhet.console import summary_table
from fedhet.registry import names
from fedhet.studies.plots import PALETTE, algorithm_color


def test_every_built_in_rule_has_a_colour_of_its_own_and_no_plug_in_takes_one():
    builtin = {algorithm_color(name) for name in names("algorithm")}
    assert len(builtin) == len(names("algorithm"))  # no two built-ins share a colour
    assert algorithm_color("fedavg") == PALETTE[1] and algorithm_color("drop") == PALETTE[2]  # as before
    others = ["TrimmedMean", "mine:Rule", "plug.rule:Scaled", "salf+oort", "fedavg+tifl"]
    others += [f"rule{n}" for n in range(200)]
    assert not {algorithm_color(name) for name in others} & builtin
    assert algorithm_color("TrimmedMean") == algorithm_color("TrimmedMean")  # the same in every figure


def test_a_summary_table_written_to_a_pipe_is_not_cut(capsys):
    """rich cuts a table to 80 columns when it does not write to a terminal; the summary
    table is written whole there (every name and number in full)."""
    name = "a-rather-long-plug-in-rule-name-that-a-researcher-might-give"
    summary = {"name": f"{name}-run", "algorithm": name, "rounds": 12, "sim_time": 60.0, "energy": 1234.5,
               "final_test_accuracy": 0.8944, "best_test_accuracy": 0.9083, "wall_time": 0.8,
               "targets": {"0.5": 12.5, "0.7": 30.25, "0.8": None}}  # fmt: skip
    summary_table([summary], "a comparison whose title is long enough to need the room as well")
    out = capsys.readouterr().out
    assert f"{name}-run" in out and name in out and "…" not in out
    assert all(len(line) > 80 for line in out.splitlines()[1:3])


def test_the_leaderboard_shows_the_energy_each_method_spent(tmp_path):
    """Energy is counted, so the leaderboard shows it: a column of the mean joules of each
    method's seed runs (kept per seed in leaderboard.csv, read back the same) and a figure
    of the energy spent against simulated time beside the score's."""
    from fedhet.bench import leaderboard

    def seeds(score: float, joules: float) -> dict:
        return {s: {"score": score + 0.01 * s, "score_metric": "accuracy", "higher_is_better": True,
                    "time_to_target": None, "energy": joules * s} for s in (1, 2, 3)}  # fmt: skip

    rows = [{"scenario": "s", "method": m, "status": "ok", "reason": "",
             "tunings": [{"repeat": 1, "params": {"train.lr": 0.1}, "validation": 0.5, "seeds": seeds(v, j)}]}
            for m, v, j in (("salf", 0.8, 100.0), ("fedavg", 0.6, 40.0))]  # fmt: skip
    board = leaderboard.build(rows)
    assert {e.method: e.mean_energy for e in board.scenarios["s"]} == {"salf": 200.0, "fedavg": 80.0}
    written = leaderboard.write(board, tmp_path, {"suite": "t", "settings": {}})
    again = leaderboard.build(leaderboard.read_csv(tmp_path / "leaderboard.csv"))
    assert {e.method: e.mean_energy for e in again.scenarios["s"]} == {"salf": 200.0, "fedavg": 80.0}
    page = (tmp_path / "leaderboard.md").read_text()
    assert "| energy J |" in page and "| 200 |" in page and "(leaderboard-energy.png)" in page
    assert tmp_path / "leaderboard-energy.png" in written
    # rows without run folders (as read from a field's CSV) have no curves, and the page says so
    html = (tmp_path / "leaderboard.html").read_text()
    assert "The curves lack fedavg, salf" in page and "The curves lack" in html
