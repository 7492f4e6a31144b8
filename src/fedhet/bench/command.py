"""``fedhet bench SUITE``: load and check the suite, run what is left of the bench with one
progress display, write the leaderboard."""

from __future__ import annotations

import json
from pathlib import Path

from fedhet.bench import leaderboard
from fedhet.bench.runner import Bench, Progress
from fedhet.bench.suite import Suite, load_suite
from fedhet.errors import FedhetError


def header(suite: Suite) -> dict:
    """What the leaderboard page states about the bench."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        fedhet_version = version("fedhet")
    except PackageNotFoundError:
        fedhet_version = "unknown"
    spaces = "; ".join(
        f"{m.label}: " + ", ".join(f"{p.key} {p.describe()}" for p in m.params) for m in suite.methods
    )
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
        "searched": spaces,
        "threads per run": str(suite.threads),
    }
    return {
        "suite": suite.name,
        "description": suite.description,
        "settings": settings,
        "target": suite.target,
        "scenarios": {s.name: s.description for s in suite.scenarios},
    }


def run_bench(suite_path: str | Path, methods: list[str], trials: int | None, seeds: int | None, jobs: int,
              ray: str | None, out: str | Path | None, overrides: list[str], quiet: bool = False,
              figures: bool = True, rerun: tuple[str, ...] = ()) -> list[Path]:  # fmt: skip
    """Run (or resume) a bench and write its leaderboard; return the files written. A method
    whose code changed since its studies ran, or named in ``rerun``, is tuned and run again."""
    if jobs < 1:
        raise FedhetError(f"--jobs {jobs}: must be >= 1")
    try:
        import optuna  # noqa: F401
    except ImportError:
        raise FedhetError("fedhet bench needs Optuna: pip install 'fedhet[bench]'") from None
    suite = load_suite(suite_path, methods, trials, seeds, overrides)
    labels = [m.label for m in suite.methods]
    for label in rerun:
        if label not in labels:
            raise FedhetError(f"--rerun {label}: not a method of this bench (methods: {', '.join(labels)})")
    folder = Path(out) if out else Path("runs") / f"bench-{suite.name}"
    with _Display(suite, quiet) as display:
        bench = Bench(suite, folder, jobs, ray, on_progress=display.update, rerun=tuple(rerun))
        results = bench.run()
    (folder / "bench.json").write_text(json.dumps(results, indent=1, default=str), encoding="utf-8")
    board = leaderboard.build(results["rows"], suite.alpha)
    return leaderboard.write(board, folder, header(suite), with_figures=figures)


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
