"""Results pages against their committed data: every line a page's recompute script prints
from the committed per-run tables is on the page, and every p-value the page's prose quotes
is one that those scripts, or the page's benches' committed per-method tables, give for the
comparison the quoting sentence names (its methods), with the difference the prose writes
beside it: a page can neither drift from its data, nor quote a test nobody ran, nor attach a
p-value to another pair."""

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
    ("lora.md", "leaderboard_tables.py", "lora-leaderboard.csv", ("--target", "9.8")),
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
    ("leaderboard.md", "leaderboard_tables.py", "leaderboard.csv", ("--target", "0.7")),
    ("peers.md", "peers_pairs.py", "peers.csv", ()),
    ("peers.md", "peers_pairs.py", "peers-cnn.csv", ()),
    ("peers.md", "powd_table.py", "powd-fmnist.csv", ()),
    ("peers.md", "selection_pairs.py", "selection.csv", ()),
    (
        "peers.md",
        "leaderboard_tables.py",
        "selection.csv",
        ("--target", "0.6", "--reference", "fedavg+uniform", "--no-tuned"),
    ),
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


# names the pages give methods beside their registered names (normalised: lower case, letters
# and digits only; two words may make one name)
ALIASES = {"dropstragglers": "drop", "dropping": "drop", "wait": "fedavg", "waiting": "fedavg",
           "waitall": "fedavg", "waitforall": "fedavg", "vanillafl": "fedavg", "fedau": "fedau",
           "powd": "powerofchoice", "reflsel": "refl"}  # fmt: skip
# a page's variants of one method: naming the variant names the method too
VARIANTS = {
    "salf.md": {"reached": "salf", "inversereach": "salf", "all": "salf"},
    "amsfl.md": {"sqrt": "amsfl", "marginal": "amsfl"},
}


@functools.cache
def method_names() -> dict[str, str]:
    """Normalised name -> the method or selection it names."""
    from fedhet.registry import names

    vocabulary = {_key(n): _key(n) for kind in ("algorithm", "selection") for n in names(kind) if n != "all"}
    return {**vocabulary, **ALIASES}


def _key(word: str) -> str:
    return re.sub(r"[^a-z0-9]", "", re.sub(r"'s$", "", word.lower()))


def names_in(text: str, page: str = "") -> frozenset[str]:
    """The methods (and client selections, and the page's variants with their methods)
    ``text`` names."""
    vocabulary = {**method_names(), **{v: v for v in VARIANTS.get(page, {})}}
    words = [_key(token) for token in re.split(r"[\s,;:()\[\]{}|=/<>]+", text)]
    keys = words + [a + b for a, b in zip(words, words[1:], strict=False)]
    found = {vocabulary[k] for k in keys if k in vocabulary}
    return frozenset(found | {VARIANTS[page][v] for v in found if v in VARIANTS.get(page, {})})


def sentences(text: str) -> list[tuple[int, str]]:
    """(line number, sentence) of the prose: paragraphs (each list item apart) joined across
    their lines and split where a sentence ends; tables, code and headings left out."""
    found: list[tuple[int, str]] = []
    paragraph: list[str] = []
    first = 0
    fenced = False
    for number, line in enumerate([*text.splitlines(), ""], 1):
        fenced ^= line.startswith("```")
        ends = not line.strip() or line.startswith(("|", "#", "```")) or fenced
        if paragraph and (ends or re.match(r"\s*(?:[-*]|\d+\.)\s", line)):
            joined = " ".join(part.strip() for part in paragraph)
            found += [(first, part) for part in re.split(r"(?<=[.!?])\s+(?=[A-Z`*(\[])", joined)]
            paragraph = []
        if not ends:
            first = first if paragraph else number
            paragraph.append(line)
    return found


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


SIGNED = re.compile(r"(?<![\w.])[+\-−](\d+(?:\.\d+)?)(?![\d.]*%)")  # +0.074, -2.9 (points); not -5%


def quoted_comparisons(text: str, page: str = "") -> list[tuple[int, str, frozenset[str], str | None]]:
    """(line, p as written, the methods its sentence names, the signed difference written
    just before it, if any) of each p-value of the prose."""
    found = []
    for number, sentence in sentences(text):
        named = names_in(sentence, page)
        end = 0
        for match in QUOTED_P.finditer(sentence):
            values = re.split(LIST_SEPARATOR, match.group(1))
            before = SIGNED.findall(sentence[max(end, match.start() - 80) : match.start()])
            bound = re.search(r"[<>]", match.group(0))  # "p >= 0.15": a bound over several tests
            # a list "+2.7 and +2.9 (p = 0.10 and 0.11)" pairs in order
            paired = len(before) >= len(values) and not bound
            differences = before[-len(values) :] if paired else [None] * len(values)
            found += [(number, v, named, d) for v, d in zip(values, differences, strict=True)]
            end = match.end()
    return found


P_CELL = re.compile(rf"\b(?:p|Holm(?: p)?)\s*(?:=|<=|>=|<)?\s*{NUMBER}|\((?:[^;()|]*; )?{NUMBER}; {NUMBER}\)")


Comparison = tuple[float, frozenset[str], frozenset[float]]  # p, the methods, the differences


def _table_rows(text: str):
    """(header cells, row cells) of every body row of the markdown tables in ``text``."""
    header: list[str] | None = None
    for line in text.splitlines():
        if not line.startswith("|"):
            header = None
            continue
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        if header is None:
            header = cells
        elif not set("".join(cells)) <= set("-: "):
            yield header + [""] * (len(cells) - len(header)), cells


def _cell_p_values(cell: str, is_p_column: bool) -> list[str]:
    """The p-values of one table cell: all its numbers in a p column, else the ``(p; Holm
    p)`` pairs and the ``p = ...`` it writes."""
    if is_p_column:
        return re.findall(rf"(?<![\w.+\-]){NUMBER}", cell)
    pairs = re.findall(rf"\((?:[^;()|]*; )?({NUMBER}); ({NUMBER})\)", cell)
    return [v for pair in pairs for v in pair] + re.findall(rf"\b(?:p|Holm)\s*(?:=|<=|>=)\s*({NUMBER})", cell)


def _table_comparisons(text: str, page: str = "") -> list[Comparison]:
    """Each p-value in a markdown table of ``text`` with the methods its comparison names
    (in the row's other cells and their headers, and the p's own header: a row is one
    comparison, or one method against the columns' references) and the differences beside
    it (in its cell, else in the row's other cells; unsigned)."""
    given: list[Comparison] = []
    for header, cells in _table_rows(text):
        p_columns = {i for i, h in enumerate(header) if re.search(r"\bp\b|Holm", h)}
        plain = [i for i, c in enumerate(cells) if i not in p_columns and not P_CELL.search(c)]
        context = names_in(" ".join(f"{cells[i]} {header[i]}" for i in plain), page)
        row_differences = frozenset(float(d) for i in plain for d in SIGNED.findall(cells[i]))
        for i, cell in enumerate(cells):
            named = context | names_in(header[i], page)
            differences = frozenset(float(d) for d in SIGNED.findall(cell)) or row_differences
            given += [(float(v), named, differences) for v in _cell_p_values(cell, i in p_columns)]
    return given


def _line_comparisons(text: str, page: str = "") -> list[Comparison]:
    """The p-values a script prints outside tables, each with the methods and the signed
    differences its sentence names."""
    given = []
    for _, sentence in sentences(text):
        differences = frozenset(float(d) for d in SIGNED.findall(sentence))
        given += [(float(v), names_in(sentence, page), differences) for _, v in quoted_p_values(sentence)]
    return given


def _bench_comparisons(table: str) -> list[Comparison]:
    """A bench table's p-values: each row's method against its scenario's best (the
    difference of their mean accuracies)."""
    with open(RESULTS / "data" / table, newline="") as handle:
        rows = list(csv.DictReader(handle))
    best = {r["scenario"]: r for r in rows if r.get("rank") == "1"}
    given = []
    for row in rows:
        top = best.get(row["scenario"], row)
        gap = frozenset({abs(float(row["mean_accuracy"] or "nan") - float(top["mean_accuracy"] or "nan"))})
        named = names_in(f"{row['method']} {top['method']}")
        given += [(float(row[c]), named, gap) for c in BENCH_P_COLUMNS if row[c] not in ("", "None")]
    return given


def given_comparisons(page: str) -> list[Comparison]:
    """Every p-value the page's scripts print and its benches' tables hold, each with the
    methods its comparison names."""
    outputs = [script_output(s, t, e) for p, s, t, e in PAGE_TABLES if p == page]
    given = [item for out in outputs for item in _table_comparisons(out, page) + _line_comparisons(out, page)]
    return given + [item for table in BENCH_TABLES.get(page, ()) for item in _bench_comparisons(table)]


def same_p_value(quoted: str, given: float) -> bool:
    """``quoted`` is ``given`` as written: rounded to the quoted decimals (``1e-14``: the
    same order of magnitude and leading digit; ``1``: exactly 1)."""
    if "e" in quoted:
        return abs(given - float(quoted)) <= 0.5 * float(quoted)
    decimals = len(quoted.split(".")[1]) if "." in quoted else 0
    tolerance = 0.5 * 10**-decimals if decimals else 5e-4
    return abs(given - float(quoted)) <= tolerance + 1e-12


def same_difference(quoted: str | None, given: frozenset[float]) -> bool:
    """No difference is written, or ``quoted`` is one of ``given`` as written (unsigned, in
    accuracy or in points)."""
    if quoted is None:
        return True
    decimals = len(quoted.split(".")[1]) if "." in quoted else 0
    tolerance = 0.5 * 10**-decimals + 1e-9
    return any(abs(abs(d) * scale - float(quoted)) <= tolerance for d in given for scale in (1, 100))


def unsupported_p_values(text: str, given: list[Comparison], page: str = "") -> list[tuple[int, str]]:
    """The p-values quoted in ``text``'s prose that no given comparison matches: none with
    that value whose methods the quoting sentence all names and (where the prose writes a
    signed difference just before the p) whose difference that is."""
    return [
        (n, v) for n, v, named, gap in quoted_comparisons(text, page)
        if not any(same_p_value(v, p) and ms <= named and same_difference(gap, d) for p, ms, d in given)
    ]  # fmt: skip


def test_a_quoted_p_value_nobody_computed_is_found():
    """The check reads p-values in the forms the pages write them, and a number no script
    gave fails it (one written with more digits than given, too)."""
    text = "SALF is ahead (p = 0.012, Holm p = 0.13); the others (p = 0.62, 0.90 and 0.99)."
    assert [v for _, v in quoted_p_values(text)] == ["0.012", "0.13", "0.62", "0.90", "0.99"]
    given = [(v, frozenset(), frozenset()) for v in (0.0121, 0.131, 0.62, 0.9, 0.989)]
    assert unsupported_p_values(text, given) == []
    assert unsupported_p_values(text, given[:-1]) == [(1, "0.99")]
    assert unsupported_p_values("p = 0.0123", [(0.012, frozenset(), frozenset())]) == [(1, "0.0123")]
    assert unsupported_p_values("| a | p = 0.5 |", []) == []  # table lines are checked word for word


def test_a_p_value_attached_to_another_comparison_is_found():
    """A quoted p must come from the comparison its sentence names, and a difference written
    beside it must be that comparison's: the same number given for another pair of methods,
    or beside another difference, does not support it."""
    given = _table_comparisons(
        "| scenario | salf vs | difference | p |\n|---|---|---|---|\n"
        "| random-50 | fedbuff | +0.080 | 0.012 |\n| random-50 | drop | +0.010 | 0.43 |\n"
    )
    assert sorted(given) == [
        (0.012, frozenset({"salf", "fedbuff"}), frozenset({0.08})),
        (0.43, frozenset({"salf", "drop"}), frozenset({0.01})),
    ]
    assert unsupported_p_values("SALF is ahead of FedBuff (p = 0.012).", given) == []
    assert unsupported_p_values("SALF is ahead of drop-stragglers (p = 0.012).", given) == [(1, "0.012")]
    assert unsupported_p_values("SALF leads\nFedBuff's rounds (p = 0.012).", given) == []  # across lines
    assert unsupported_p_values("SALF leads FedBuff. Drop is level (p = 0.012).", given) == [(1, "0.012")]
    assert unsupported_p_values("SALF leads FedBuff by 8.0 points (+8.0, p = 0.012).", given) == []
    assert unsupported_p_values("SALF leads FedBuff (+0.01, p = 0.012).", given) == [(1, "0.012")]


@pytest.mark.parametrize("page", sorted(path.name for path in RESULTS.glob("*.md")))
def test_every_p_value_a_page_quotes_comes_from_its_scripts(page):
    """Each p-value in a results page's prose is one its recompute scripts print from the
    committed data (or its benches' committed tables hold), as written, for a comparison
    of the methods its sentence names."""
    missing = unsupported_p_values((RESULTS / page).read_text(), given_comparisons(page), page)
    assert not missing, missing
