"""``fedhet bench SUITE``: load and check the suite, run what is left of the bench with one
progress display, write the leaderboard."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from fedhet.bench import leaderboard
from fedhet.bench.runner import Bench, Progress
from fedhet.bench.suite import Suite, load_suite
from fedhet.errors import FedhetError


def header(suite: Suite, against: str | None = None) -> dict:
    """What the leaderboard page states about the bench (``against``: the field its suite's
    own methods' rows were read from)."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        fedhet_version = version("fedhet")
    except PackageNotFoundError:
        fedhet_version = "unknown"
    settings = {
        "fedhet version": fedhet_version,
        "scenarios": ", ".join(s.name for s in suite.scenarios),
        "methods": ", ".join(m.label + (" (plug-in)" if m.plugin else "") for m in suite.methods),
        "tuning budget": f"{suite.trials} trials per method and scenario (Optuna TPE, seeded; the first "
        f"{suite.random_trials} drawn at random; pruner: {suite.pruner})",
        "tuning objective": f"{suite.objective} on a validation split of {suite.validation_fraction:g} of "
        "each client's training examples",
        "seeds": f"{len(suite.seeds)} ({', '.join(map(str, suite.seeds))}) of each tuned setting, "
        "on the test set",
        **_search_settings(suite),
        "threads per run": str(suite.threads),
    }
    if against:
        settings["field"] = (
            f"the rows of {', '.join(m.label for m in suite.methods if not m.plugin)} read from {against} "
            "(same suite, data, budget and code: checked); only "
            f"{', '.join(m.label for m in suite.methods if m.plugin)} ran"
        )
    return {
        "suite": suite.name,
        "description": suite.description,
        "settings": settings,
        "target": suite.target,
        "scenarios": {s.name: s.description for s in suite.scenarios},
    }


def _search_settings(suite: Suite) -> dict[str, str]:
    """The page's lines on the search: the tunings, the shared knobs, each method's own."""
    spaces = "; ".join(
        f"{m.label}: " + ", ".join(f"{p.key} {p.describe()}" for p in m.params if p.key in m.own)
        for m in suite.methods
        if m.own
    )
    repeats = (
        f"{suite.tuning_repeats} independent tunings per method and scenario (sampler seeds "
        f"{suite.sampler_seed}..{suite.sampler_seed + suite.tuning_repeats - 1}, each mixed with the "
        "method's name), each best setting run "
        "on the seeds; the tuning is the unit of the intervals and tests"
        if suite.tuning_repeats > 1
        else "one tuning per method and scenario: the tests run over the seeds of one tuned setting, "
        "so a lucky or unlucky search can decide a mark. A smoke check, not a comparison "
        "(suite.tuning_repeats >= 2 makes one)"
    )
    return {
        "tunings": repeats,
        "shared knobs (every method)": ", ".join(f"{p.key} {p.describe()}" for p in suite.shared)
        + " (a server optimizer's preset, FedAdam, searches its own server_lr as the server rate)",
        "own knobs": spaces or "none",
        "knobs not tuned (their mechanism is inert there)": _inert_settings(suite),
    }


def _inert_settings(suite: Suite) -> str:
    """Per method, the own knobs left out of its search in the scenarios where the mechanism
    that reads them is inert (the rows' caveats say why)."""
    by_method: dict[tuple[str, str], list[str]] = {}
    for (scenario, label), keys in suite.inert.items():
        by_method.setdefault((label, " ".join(keys)), []).append(scenario)
    return "; ".join(f"{label}: {keys} in {', '.join(scenarios)}" for (label, keys), scenarios
                     in by_method.items()) or "none"  # fmt: skip


@dataclass
class BenchOptions:
    """What ``fedhet bench`` was asked: the suite, added methods, the budget's overrides,
    the placement (``jobs``, ``ray``), the Optuna ``storage`` (an RDB URL; default the
    folder's SQLite), ``against`` (a published field's leaderboard.csv or bench folder:
    run only the added methods and merge), ``rerun`` and the output."""

    suite: str | Path
    methods: list[str] = field(default_factory=list)
    trials: int | None = None
    seeds: int | None = None
    repeats: int | None = None
    jobs: int = 1
    ray: str | None = None
    out: str | Path | None = None
    overrides: list[str] = field(default_factory=list)
    quiet: bool = False
    figures: bool = True
    rerun: tuple[str, ...] = ()
    storage: str | None = None
    against: str | None = None


def run_bench(options: BenchOptions) -> list[Path]:
    """Run (or resume) a bench and write its leaderboard; return the files written. A method
    whose code changed since its studies ran, or named in ``rerun``, is tuned and run again;
    with ``against``, the suite's own methods' rows come from that field, checked to be the
    same suite, data, budget and code, and only the added methods run."""
    if options.jobs < 1:
        raise FedhetError(f"--jobs {options.jobs}: must be >= 1")
    try:
        import optuna  # noqa: F401
    except ImportError:
        raise FedhetError("fedhet bench needs Optuna: pip install 'fedhet[bench]'") from None
    suite = load_suite(options.suite, options.methods, options.trials, options.seeds, options.overrides,
                       options.repeats)  # fmt: skip
    labels = [m.label for m in suite.methods]
    for label in options.rerun:
        if label not in labels:
            raise FedhetError(f"--rerun {label}: not a method of this bench (methods: {', '.join(labels)})")
    field_rows: list[dict] = []
    if options.against:
        from fedhet.bench.against import field_rows as read_field

        from_field = [
            label for label in options.rerun if not next(m for m in suite.methods if m.label == label).plugin
        ]
        if from_field:
            raise FedhetError(
                f"--rerun {from_field[0]}: its rows come from --against {options.against}, which does not "
                "run it; run the whole bench (without --against) to rerun it"
            )

        field_rows = read_field(options.against, suite)
    storage = check_storage(options.storage)
    folder = Path(options.out) if options.out else Path("runs") / f"bench-{suite.name}"
    skip = tuple(m.label for m in suite.methods if not m.plugin) if options.against else ()
    with _Display(suite, options.quiet) as display:
        bench = Bench(suite, folder, options.jobs, options.ray, on_progress=display.update,
                      rerun=tuple(options.rerun), storage=storage, skip=skip)  # fmt: skip
        bench.live = display.live  # without a progress bar, nothing reads the database while it runs
        results = bench.run()
    results["rows"] = _merged(suite, field_rows, results["rows"])
    (folder / "bench.json").write_text(json.dumps(results, indent=1, default=str), encoding="utf-8")
    board = leaderboard.build(results["rows"], suite.alpha, suite.reference)
    return leaderboard.write(board, folder, header(suite, options.against), with_figures=options.figures)


def _merged(suite: Suite, field_rows: list[dict], own: list[dict]) -> list[dict]:
    """The field's rows and this bench's, in the suite's order (scenario, then method)."""
    by_key = {(r["scenario"], r["method"]): r for r in [*field_rows, *own]}
    return [by_key[(s.name, m.label)] for s in suite.scenarios for m in suite.methods
            if (s.name, m.label) in by_key]  # fmt: skip


def check_storage(url: str | None) -> str | None:
    """``--storage``: an Optuna RDB URL (``postgresql://...``, ``mysql://...``,
    ``sqlite:///...``) that opens; refused in one line otherwise
    (:func:`fedhet.studies.trials.check_storage`)."""
    if url is not None:
        from fedhet.studies.trials import check_storage as check

        check(url, "--storage")
    return url


class _Display:
    """One rich progress display for the whole bench: every unit (trial or seed run) on one
    bar with the time left, a bar per scenario, the counts of studies, trials and seeds,
    and one line per finished study. Off with ``quiet``; lines only where stderr is not a
    terminal."""

    def __init__(self, suite: Suite, quiet: bool):
        from rich.console import Console
        from rich.progress import (
            BarColumn,
            MofNCompleteColumn,
            TextColumn,
            TimeElapsedColumn,
            TimeRemainingColumn,
        )
        from rich.progress import Progress as RichProgress

        self.quiet = quiet
        self.console = Console(stderr=True, highlight=False)
        self.live = not quiet and self.console.is_terminal
        columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                   TextColumn("left"), TimeRemainingColumn())  # fmt: skip
        self.bar = RichProgress(*columns, console=self.console, transient=True, disable=quiet)
        self.total = self.bar.add_task(f"bench {suite.name}", total=None)
        self.scenarios = {s.name: self.bar.add_task(f"  {s.name}", total=None) for s in suite.scenarios}

    def __enter__(self) -> _Display:
        self.bar.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        self.bar.__exit__(*exc)

    def update(self, p: Progress) -> None:
        while p.lines:
            line = p.lines.pop(0)
            if not self.quiet:
                self.bar.console.print(line, soft_wrap=True, markup=False)
        counts = (
            f"bench: studies {p.studies_done}/{p.studies_total} · trials {p.trials_done}/{p.trials_total} "
            f"· seeds {p.seeds_done}/{p.seeds_total}"
        )
        self.bar.update(self.total, description=counts, completed=p.trials_done + p.seeds_done,
                        total=p.trials_total + p.seeds_total)  # fmt: skip
        for name, (done, total) in p.scenario_units.items():
            self.bar.update(self.scenarios[name], completed=done, total=total)
