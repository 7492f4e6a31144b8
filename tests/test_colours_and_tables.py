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
