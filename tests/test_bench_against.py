"""``fedhet bench --against FIELD``: a new method compared with a published field without
running the field again gives the leaderboard of the whole bench; a field made with other
settings or other code is refused in one line. And the tuning as the unit: with
``tuning_repeats`` R > 1 the interval and the tests run over the tunings' means (Welch),
and leaderboard.csv reads back to the same leaderboard."""

from __future__ import annotations

import csv
from pathlib import Path

import numpy as np
import pytest
from conftest import BENCH_PLUGIN, SMOKE_BENCH_ARGS, SMOKE_SUITE, bench_in_process, fedhet_in_process
from conftest import BENCH_PLUGIN_RULE as PLUGIN


@pytest.mark.slow
@pytest.mark.extended
def test_a_method_against_a_published_field_runs_alone_and_gives_the_whole_benchs_leaderboard(
    smoke_bench, tmp_path
):
    """The finished smoke bench (its own four methods and TrimmedMean, tuned twice each) is
    the published field and the whole bench at once: TrimmedMean against it, from its CSV or
    its folder, runs alone and gives the whole bench's leaderboard."""
    expected = (smoke_bench / "leaderboard.csv").read_text()
    assert list(smoke_bench.glob("seeds/*/fedavg/tuning-2/seed-1/summary.json"))  # tuned twice
    for name, source in (("from-csv", smoke_bench / "leaderboard.csv"), ("from-folder", smoke_bench)):
        bench_in_process(tmp_path / name, "--against", str(source))
        assert (tmp_path / name / "leaderboard.csv").read_text() == expected, name
        ran = {
            p.relative_to(tmp_path / name / "seeds").parts[1]
            for p in (tmp_path / name).glob("seeds/**/seed-*")
        }
        assert ran == {"TrimmedMean"}, ran  # only the new method ran
        page = (tmp_path / name / "leaderboard.md").read_text()
        assert f"read from {source}" in page and "only TrimmedMean ran" in page


def _refused(out: Path, *args: str, words: tuple[str, ...]) -> None:
    argv = ["bench", str(SMOKE_SUITE), *args, "--out", str(out), "--quiet"]
    status, stderr = fedhet_in_process(argv, paths=(BENCH_PLUGIN,))
    assert status == 2 and stderr.count("\n") == 1, stderr
    assert "Traceback" not in stderr and all(w in stderr for w in words), stderr


def _edited(rows: list[dict], path: Path, method: str, **values: str) -> Path:
    """The field's rows with ``values`` set in every row of ``method``, written to ``path``."""
    rows = [dict(row, **values) if row["method"] == method else dict(row) for row in rows]
    with path.open("w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=list(rows[0]), lineterminator="\n")
        writer.writeheader()
        writer.writerows(rows)
    return path


@pytest.mark.extended
def test_a_field_of_another_budget_or_other_behaviour_is_refused_in_one_line(smoke_bench, tmp_path):
    """Other settings, a method whose canary differs on this build (named, with the build
    that made the field), a field from before canaries made by other code: one line each."""
    against = [*SMOKE_BENCH_ARGS, "--against", str(smoke_bench / "leaderboard.csv")]
    _refused(tmp_path / "a", *against, "--seeds", "3",
             words=("scenario random-50, method fedavg: made with other settings",))  # fmt: skip
    rows = list(csv.DictReader((smoke_bench / "leaderboard.csv").open()))
    assert all(row["canary"] for row in rows if row["status"] == "ok")
    behaved = _edited(rows, tmp_path / "behaved.csv", "drop", canary="0" * 16)  # drop ran otherwise
    build = rows[0]["fedhet"]
    _refused(tmp_path / "b", *SMOKE_BENCH_ARGS, "--against", str(behaved),
             words=("drop in random-50, drop in", "behave otherwise", build))  # fmt: skip
    older = _edited(rows, tmp_path / "older.csv", "drop", canary="", code="0" * 16)  # no canaries then
    _refused(tmp_path / "e", *SMOKE_BENCH_ARGS, "--against", str(older),
             words=("method drop: made by other code",))  # fmt: skip
    without_method = [a for a in SMOKE_BENCH_ARGS if a not in ("--method", PLUGIN)]
    _refused(tmp_path / "c", *without_method, "--against", str(smoke_bench),
             words=("give the method to compare with --method",))  # fmt: skip
    _refused(
        tmp_path / "d", *SMOKE_BENCH_ARGS, "--against", str(tmp_path / "none.csv"), words=("no such file",)
    )
    assert not any((tmp_path / name).exists() for name in "abcde")


@pytest.mark.slow
@pytest.mark.extended
def test_a_field_made_by_another_build_whose_methods_behave_alike_is_taken(smoke_bench, tmp_path):
    """A commit that changes no method's behaviour (here: every row's code fingerprint as
    if fedhet's sources had changed, say a page or an unrelated module) keeps the field
    usable: the canaries match, only the new method runs, and the leaderboard is the whole
    bench's."""
    rows = list(csv.DictReader((smoke_bench / "leaderboard.csv").open()))
    field = tmp_path / "field.csv"
    for method in {row["method"] for row in rows}:
        field = _edited(rows, field, method, code="f" * 16)
        rows = list(csv.DictReader(field.open()))
    bench_in_process(tmp_path / "out", "--against", str(field))
    seeds = tmp_path / "out" / "seeds"
    ran = {p.relative_to(seeds).parts[1] for p in seeds.glob("**/seed-*")}
    assert ran == {"TrimmedMean"}, ran

    def without_code(path: Path) -> list[dict]:
        return [{k: v for k, v in row.items() if k != "code"} for row in csv.DictReader(path.open())]

    assert without_code(tmp_path / "out" / "leaderboard.csv") == without_code(smoke_bench / "leaderboard.csv")


def _rows(methods: dict[str, list[list[float]]]) -> list[dict]:
    return [
        {"scenario": "s", "method": m, "status": "ok", "reason": "", "tunings": [
            {"repeat": r + 1, "params": {"train.lr": 0.1 * (r + 1)}, "validation": 0.5,
             "seeds": {s + 1: {"score": v, "score_metric": "accuracy", "higher_is_better": True,
                               "time_to_target": None} for s, v in enumerate(values)}}
            for r, values in enumerate(tunings)]}
        for m, tunings in methods.items()
    ]  # fmt: skip


def test_with_several_tunings_the_tuning_is_the_unit_of_the_interval_and_the_welch_test(tmp_path):
    """Tuned R = 3 times: a method's mean is that of its 3 tunings' means, its interval a
    bootstrap over tunings and seeds, its test against the best Welch's over those means, so
    that one lucky tuning cannot make a difference significant on its own; the CSV reads
    back to the same leaderboard."""
    from scipy import stats

    from fedhet.bench import leaderboard

    methods = {
        "steady": [[0.90, 0.91, 0.90], [0.89, 0.90, 0.91], [0.90, 0.90, 0.89]],
        "lucky": [[0.95, 0.95, 0.96], [0.70, 0.71, 0.70], [0.72, 0.71, 0.73]],
    }
    board = leaderboard.build(_rows(methods))
    entries = {e.method: e for e in board.scenarios["s"]}
    means = {m: [float(np.mean(t)) for t in tunings] for m, tunings in methods.items()}
    for method, values in means.items():
        assert entries[method].mean == pytest.approx(np.mean(values))
        interval = entries[method].interval  # tunings and seeds drawn: inside the scores' range
        scores = np.ravel(methods[method])
        assert scores.min() <= interval.low <= np.mean(values) <= interval.high <= scores.max()
    assert entries["steady"].best
    assert entries["lucky"].p == pytest.approx(
        stats.ttest_ind(means["steady"], means["lucky"], equal_var=False).pvalue
    )
    seeds_alone = stats.ttest_rel(methods["steady"][0], methods["lucky"][0]).pvalue  # one tuning's seeds
    assert seeds_alone < 0.05 < entries["lucky"].p  # the seeds of one tuning would have called it
    path = leaderboard.write_csv(board, tmp_path / "leaderboard.csv")
    again = leaderboard.build(leaderboard.read_csv(path))
    assert leaderboard.write_csv(again, tmp_path / "again.csv").read_text() == path.read_text()
    assert "1/2:0.91;1/3:0.9;2/1:0.89" in path.read_text()  # tuning/seed keys
