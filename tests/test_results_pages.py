"""Results pages against their committed data: every line a page's recompute script prints
from the committed per-run tables is on the page, and every p-value the page's prose quotes
is one that those scripts, or the page's benches' committed per-method tables, give: a page
can neither drift from its data nor quote a test nobody ran."""

from __future__ import annotations

import csv
import functools
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "docs" / "results"

PAGE_TABLES = [  # (results page, script, its committed per-run table, the script's other arguments)
    ("amsfl.md", "amsfl_variance.py", "amsfl-variance.csv", ()),
    ("fedstale.md", "fedstale_fig1.py", "fedstale-fig1.csv", ()),
    ("amsfl.md", "amsfl_allocation.py", "amsfl-allocation.csv", ()),
    ("fedstale.md", "fedstale_protocol.py", "fedstale-protocol.csv", ()),
    ("adel-fl.md", "adelfl_protocol.py", "adelfl-protocol.csv", ()),
    ("amsfl.md", "amsfl_report.py", "amsfl-nslkdd.csv", ()),
    ("amsfl.md", "amsfl_report.py", "amsfl-fmnist.csv", ()),
    ("amsfl.md", "amsfl_report.py", "amsfl-mu.csv", ("--baseline", "docs/results/data/amsfl-fmnist.csv")),
    (
        "adel-fl.md",
        "grid_table.py",
        "adelfl-questions.csv",
        (
            "experiments/adelfl_questions.toml",
            "--differences",
            "adel-fl(estimate_constants=True,rho_s=0.25) - salf",
            "adel-fl(rho_c=0.3,rho_s=1.0,grad_bound=0.1) - salf",
            "adel-fl(estimate_constants=True,rho_s=0.25) - adel-fl(plan=equal,batch_scale=1.0)",
            "adel-fl(estimate_constants=True,rho_s=0.25,time_aware_lr=True)"
            " - adel-fl(estimate_constants=True,rho_s=0.25)",
            "adel-fl(plan=equal,batch_scale=1.0) - salf",
        ),
    ),
    (
        "adel-fl.md",
        "grid_table.py",
        "adelfl-table1.csv",
        ("experiments/adelfl_table1.toml", "--differences", "fedavg - salf", "drop - salf", "fedavg - drop"),
    ),
    ("adel-fl.md", "grid_table.py", "adelfl-fig2.csv", ("experiments/adelfl_fig2.toml",)),
    ("adel-fl.md", "accuracy_at_times.py", "adelfl-fig2-times.csv", ()),
    ("salf.md", "salf_tables.py", "salf-study.csv", ("docs/results/data/salf-study-fedbuff.csv",)),
    ("salf.md", "salf_persistent_tests.py", "salf-persistent.csv", ()),
    ("salf.md", "salf_persistent_tests.py", "salf-persistent-cnn.csv", ()),
    ("salf.md", "salf_tables.py", "salf-study-half.csv", ()),
    ("salf.md", "grid_table.py", "salf-cnn-rounds.csv", ("experiments/salf_cnn_rounds.toml",)),
    ("salf.md", "salf_fig5_plot.py", "salf-fig5.csv", ("docs/results/data/salf-fig5-fedbuff.csv",)),
    ("leaderboard.md", "leaderboard_pairs.py", "leaderboard.csv", ()),
    ("peers.md", "peers_pairs.py", "peers.csv", ()),
    ("peers.md", "peers_pairs.py", "peers-cnn.csv", ()),
    ("peers.md", "powd_table.py", "powd-fmnist.csv", ()),
    ("peers.md", "selection_pairs.py", "selection.csv", ()),
    (
        "peers.md",
        "grid_table.py",
        "peers-dropout-pieces.csv",
        ("experiments/peers_dropout_pieces.toml", "--differences", "finished - nothing"),
    ),
    (
        "peers.md",
        "grid_table.py",
        "peers-fedcompass-step.csv",
        ("experiments/peers_fedcompass_step.toml", "--differences", "5.12 - 1.28"),
    ),
    (
        "fedstale.md",
        "fedstale_figures.py",
        "fedstale-study.csv",
        ("--fedau", "docs/results/data/fedstale-fedau-study.csv"),
    ),
    ("baselines.md", "grid_table.py", "baselines-scaffold.csv", ("experiments/baselines_scaffold.toml",)),
    (
        "baselines.md",
        "baselines_tables.py",
        "baselines-steps.csv",
        (
            "--times",
            "docs/results/data/baselines-steps-times.csv",
            "--tuned",
            "docs/results/data/baselines-tuned.csv",
        ),
    ),
]


BENCH_TABLES = {  # the benches' committed per-method tables whose p columns a page quotes
    "leaderboard.md": ("leaderboard.csv",),
    "peers.md": ("peers.csv", "peers-cnn.csv", "peers-dropout.csv", "selection.csv"),
}
BENCH_P_COLUMNS = ("p_vs_best", "p_holm")
NUMBER = r"(?:\d+(?:\.\d+)?(?:e-?\d+)?)"
# "p = 0.12", "p 0.03-0.04", "Holm p >= 0.2", "Holm 0.14", "Holm = 0.510", "p = 0.62, 0.90 and 0.99"
QUOTED_P = re.compile(
    rf"\b(?:p|Holm(?: p)?|p \(Holm\))\s*(?:=|<=|>=|≈)?\s*({NUMBER}(?:(?:-|, | and ){NUMBER})*)"
)
LIST_SEPARATOR = r"(?<=[0-9])-(?=[0-9])|, | and "


@functools.cache
def script_output(script: str, table: str, extra: tuple) -> str:
    """What ``experiments/<script>`` prints from ``docs/results/data/<table>``."""
    done = subprocess.run(
        [sys.executable, str(ROOT / "experiments" / script), str(RESULTS / "data" / table), *extra],
        capture_output=True, text=True, check=True, cwd=ROOT,
    )  # fmt: skip
    return done.stdout


@pytest.mark.parametrize(("page", "script", "table", "extra"), PAGE_TABLES)
def test_a_results_page_shows_what_its_committed_table_gives(page, script, table, extra):
    """Every line a page's recompute script prints from the committed per-run table is on
    the page, word for word: a page and its data cannot drift apart."""
    text = (RESULTS / page).read_text()
    lines = [line for line in script_output(script, table, extra).splitlines() if line.strip()]
    missing = [line for line in lines if line not in text]
    assert len(lines) >= 4 and not missing, missing[:3]


def quoted_p_values(text: str, tables: bool = False) -> list[tuple[int, str]]:
    """(line number, number as written) of each p-value quoted in ``text``; table lines
    (already checked word for word) only with ``tables``."""
    found = []
    for number, line in enumerate(text.splitlines(), 1):
        if line.startswith("|") and not tables:
            continue
        for match in QUOTED_P.finditer(line):
            found += [(number, value) for value in re.split(LIST_SEPARATOR, match.group(1))]
    return found


def _table_column_p_values(text: str) -> list[float]:
    """Unsigned numbers in the columns of a markdown table whose header names a p-value,
    and the ``(p; Holm p)`` pairs of the scripts' differences (``(20 seeds; p; Holm p)``)."""
    values, header = [], None
    for line in text.splitlines():
        if not line.startswith("|"):
            header = None
            continue
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        if header is None:
            header = [bool(re.search(r"\bp\b|Holm", cell)) for cell in cells]
            continue
        for is_p, cell in zip(header, cells, strict=False):
            values += [float(v) for v in re.findall(rf"(?<![\w.+\-]){NUMBER}", cell)] if is_p else []
    pairs = re.findall(rf"\((?:[^;()|]*; )?({NUMBER}); ({NUMBER})\)", text)
    return values + [float(v) for pair in pairs for v in pair]


def given_p_values(page: str) -> list[float]:
    """Every p-value the page's scripts print and its benches' tables hold."""
    outputs = "\n".join(script_output(s, t, e) for p, s, t, e in PAGE_TABLES if p == page)
    given = [float(v) for _, v in quoted_p_values(outputs, tables=True)] + _table_column_p_values(outputs)
    for table in BENCH_TABLES.get(page, ()):
        with open(RESULTS / "data" / table, newline="") as handle:
            rows = list(csv.DictReader(handle))
        given += [float(row[c]) for row in rows for c in BENCH_P_COLUMNS if row[c] not in ("", "None")]
    return given


def same_p_value(quoted: str, given: float) -> bool:
    """``quoted`` is ``given`` as written: rounded to the quoted decimals (``1e-14``: the
    same order of magnitude and leading digit; ``1``: exactly 1)."""
    if "e" in quoted:
        return abs(given - float(quoted)) <= 0.5 * float(quoted)
    decimals = len(quoted.split(".")[1]) if "." in quoted else 0
    tolerance = 0.5 * 10**-decimals if decimals else 5e-4
    return abs(given - float(quoted)) <= tolerance + 1e-12


def unsupported_p_values(text: str, given: list[float]) -> list[tuple[int, str]]:
    """The p-values quoted in ``text``'s prose that no given p-value matches."""
    return [(n, v) for n, v in quoted_p_values(text) if not any(same_p_value(v, g) for g in given)]


def test_a_quoted_p_value_nobody_computed_is_found():
    """The check reads p-values in the forms the pages write them, and a number no script
    gave fails it (one written with more digits than given, too)."""
    text = "SALF is ahead (p = 0.012, Holm p = 0.13); the others (p = 0.62, 0.90 and 0.99)."
    assert [v for _, v in quoted_p_values(text)] == ["0.012", "0.13", "0.62", "0.90", "0.99"]
    assert unsupported_p_values(text, [0.0121, 0.131, 0.62, 0.9, 0.989]) == []
    assert unsupported_p_values(text, [0.0121, 0.131, 0.62, 0.9]) == [(1, "0.99")]
    assert unsupported_p_values("p = 0.0123", [0.012]) == [(1, "0.0123")]
    assert unsupported_p_values("| a | p = 0.5 |", []) == []  # table lines are checked word for word


@pytest.mark.parametrize("page", sorted(path.name for path in RESULTS.glob("*.md")))
def test_every_p_value_a_page_quotes_comes_from_its_scripts(page):
    """Each p-value in a results page's prose is one its recompute scripts print from the
    committed data (or its benches' committed tables hold), as written."""
    missing = unsupported_p_values((RESULTS / page).read_text(), given_p_values(page))
    assert not missing, missing
