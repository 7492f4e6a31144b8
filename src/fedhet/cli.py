"""The ``fedhet`` command: run, reproduce, compare, list.

Errors in the input (config keys, values, data files) print one line naming the problem
and exit with status 2; no traceback.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from pathlib import Path

from fedhet.errors import FedhetError


def _progress_printer(total_rounds: int, label: str):
    """A per-round callback: a live progress bar on a terminal, evaluation lines otherwise."""
    from rich.console import Console

    console = Console(stderr=True)
    if console.is_terminal:
        from rich.progress import (
            BarColumn,
            MofNCompleteColumn,
            Progress,
            TextColumn,
            TimeElapsedColumn,
        )

        progress = Progress(
            TextColumn(f"[bold]{label}[/]"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("{task.fields[info]}"),
            TimeElapsedColumn(),
            console=console,
            transient=True,
        )
        task = progress.add_task(label, total=total_rounds, info="")
        state = {"acc": None}

        def on_round(row: dict) -> None:
            if not progress.live.is_started:
                progress.start()
            if row.get("test_accuracy") is not None:
                state["acc"] = row["test_accuracy"]
            acc = "" if state["acc"] is None else f" acc {state['acc']:.3f}"
            progress.update(task, completed=row["round"], info=f"sim {row['sim_time']:.4g}s{acc}")
            if row["round"] >= total_rounds:
                progress.stop()

        return on_round

    def on_round_plain(row: dict) -> None:
        if row.get("test_accuracy") is not None:
            console.print(
                f"{label} round {int(row['round'])}/{total_rounds} sim_time {row['sim_time']:.4g} "
                f"test_accuracy {row['test_accuracy']:.4f}",
                highlight=False,
            )

    return on_round_plain


def _summary_table(summaries: list[dict], title: str) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title=title)
    targets = sorted({t for s in summaries for t in (s.get("targets") or {})}, key=float)
    columns = ["run", "algorithm", "rounds", "sim_time", "final acc", "best acc"]
    columns += [f"time to {t}" for t in targets] + ["wall s"]
    for col in columns:
        table.add_column(col, justify="left" if col in ("run", "algorithm") else "right")

    def fmt(v, spec):
        return "-" if v is None else format(v, spec)

    for s in summaries:
        table.add_row(
            s.get("name", ""),
            s["algorithm"],
            str(s["rounds"]),
            fmt(s["sim_time"], ".4g"),
            fmt(s["final_test_accuracy"], ".4f"),
            fmt(s["best_test_accuracy"], ".4f"),
            *[_reached((s.get("targets") or {}).get(t)) for t in targets],
            fmt(s["wall_time"], ".1f"),
        )
    Console().print(table)


def _reached(hit: dict | None) -> str:
    """``sim_time (round)`` of a target's first hit, ``-`` if never reached."""
    return "-" if not hit else f"{hit['sim_time']:.4g} (r{hit['round']})"


def cmd_run(args: argparse.Namespace) -> int:
    from fedhet.config import apply_overrides, load_config, read_toml
    from fedhet.engine.simulator import run
    from fedhet.studies.grid import compare_cells

    config = load_config(args.config, args.set)
    out = Path(args.out) if args.out else Path("runs") / config.run.name
    if not config.compare.algorithms:
        result = run(
            config,
            out,
            resume=args.resume,
            overwrite=args.overwrite,
            on_round=None if args.quiet else _progress_printer(config.run.rounds, config.algorithm_name),
        )
        _summary_table([result.summary], f"fedhet run -> {result.path}")
        return 0
    summaries = []
    for cell in compare_cells(apply_overrides(read_toml(args.config), args.set), args.config):
        result = run(
            cell.config,
            out / cell.name,
            resume=args.resume,
            overwrite=args.overwrite,
            on_round=None if args.quiet else _progress_printer(cell.config.run.rounds, cell.name),
        )
        summaries.append(result.summary)
    _summary_table(
        summaries,
        f"{config.run.name}: {config.data.dataset}, {config.model.name}, {config.system.model} -> {out}",
    )
    return 0


def cmd_reproduce(args: argparse.Namespace) -> int:
    from rich.console import Console

    from fedhet.studies.grid import load_experiment, report_table, run_experiment

    console = Console(stderr=True)
    experiment = load_experiment(args.experiment, args.set)
    out = Path(args.out) if args.out else Path("runs") / experiment.name
    if args.list:
        for cell in experiment.cells:
            print(cell.name)
        return 0
    console.print(f"{experiment.name}: {len(experiment.cells)} cells -> {out}", highlight=False)
    done = {"n": 0}

    def on_cell(cell, summary):
        done["n"] += 1
        acc = summary.get("final_test_accuracy")
        console.print(
            f"[{done['n']}/{len(experiment.cells)}] {cell.name}: final_test_accuracy "
            f"{acc if acc is None else round(acc, 4)}",
            highlight=False,
        )

    summaries = run_experiment(experiment, out, jobs=args.jobs, on_cell=on_cell)
    table = report_table(experiment, summaries)
    out.mkdir(parents=True, exist_ok=True)
    (out / "table.md").write_text(table)
    (out / "summaries.json").write_text(json.dumps(summaries, indent=2, sort_keys=True) + "\n")
    print(table)
    return 0


def cmd_plan(args: argparse.Namespace) -> int:
    """Show the round deadline's expected depth, calibrate a deadline for a depth share, and
    run the algorithm's planner (ADEL-FL) without training."""
    from fedhet.config import apply_overrides, from_dict, read_toml
    from fedhet.studies.grid import EXPERIMENT_SECTIONS
    from fedhet.studies.plans import describe_plan

    raw = {k: v for k, v in read_toml(args.config).items() if k not in EXPERIMENT_SECTIONS}
    config = from_dict(apply_overrides(raw, args.set))  # an experiment file's base configuration
    for line in describe_plan(config, args.depth_fraction, args.out):
        print(line)
    return 0


def cmd_plot(args: argparse.Namespace) -> int:
    from fedhet.studies.plots import plot_runs

    written = plot_runs(args.runs, args.out, x=args.x, title=args.title)
    for path in written:
        print(path)
    return 0


def cmd_compare(args: argparse.Namespace) -> int:
    from fedhet.results import RunDirectory

    summaries = []
    for path in args.runs:
        run_dir = RunDirectory(path)
        if not run_dir.summary_path.exists():
            raise FedhetError(f"{run_dir.summary_path}: not found (is {path} a finished run?)")
        summaries.append(run_dir.read_summary())
    _summary_table(summaries, "fedhet compare")
    return 0


def cmd_list(args: argparse.Namespace) -> int:
    from fedhet import registries
    from fedhet.algorithms import ALGORITHMS

    for kind, names in registries().items():
        print(f"{kind}:")
        for name in names:
            note = ALGORITHMS[name].summary if kind == "algorithms" else ""
            print(f"  {name:<18} {note}".rstrip())
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="fedhet", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("run", help="run a configuration (or the algorithms of its [compare])")
    p.add_argument("config", help="TOML configuration file")
    p.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="SECTION.KEY=VALUE",
        help="override a configuration value (repeatable)",
    )
    p.add_argument("--out", help="run directory (default runs/<run.name>)")
    p.add_argument("--resume", action="store_true", help="continue an interrupted run")
    p.add_argument("--overwrite", action="store_true", help="discard an existing run in --out")
    p.add_argument("--quiet", action="store_true", help="no progress output, only the final table")
    p.set_defaults(func=cmd_run)

    p = sub.add_parser("reproduce", help="run an experiment grid and print its table")
    p.add_argument("experiment", help="experiment TOML (see experiments/)")
    p.add_argument("--set", action="append", default=[], metavar="SECTION.KEY=VALUE")
    p.add_argument("--out", help="output folder (default runs/<experiment.name>)")
    p.add_argument("--jobs", type=int, help="cells run in parallel (default: experiment.jobs)")
    p.add_argument("--list", action="store_true", help="list the cells and exit")
    p.set_defaults(func=cmd_reproduce)

    p = sub.add_parser("compare", help="table of finished runs' summaries")
    p.add_argument("runs", nargs="+", help="run directories")
    p.set_defaults(func=cmd_compare)

    p = sub.add_parser("plan", help="calibrate deadlines and show an algorithm's plan, without training")
    p.add_argument("config", help="TOML configuration (or experiment file: its base configuration)")
    p.add_argument("--set", action="append", default=[], metavar="SECTION.KEY=VALUE")
    p.add_argument(
        "--depth-fraction",
        type=float,
        help="print the deadline (and budget) at which clients reach this share of layers on average",
    )
    p.add_argument("--out", help="write the plan (JSON) here")
    p.set_defaults(func=cmd_plan)

    p = sub.add_parser("plot", help="figures from run directories (needs the plot extra)")
    p.add_argument("runs", nargs="+", help="run directories (or folders holding them)")
    p.add_argument("--out", required=True, help="output file prefix, e.g. figures/fig2")
    p.add_argument("--x", default="sim_time", choices=("sim_time", "round"), help="x axis of accuracy")
    p.add_argument("--title", default="", help="figure title")
    p.set_defaults(func=cmd_plot)

    p = sub.add_parser("list", help="algorithms, datasets, models, system models")
    p.set_defaults(func=cmd_list)
    return parser


def _show_warnings() -> None:
    """Print the library's warnings (e.g. a planner fallback) as one line each on stderr."""
    logger = logging.getLogger("fedhet")
    if not logger.handlers:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("fedhet: warning: %(message)s"))
        logger.addHandler(handler)


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    _show_warnings()
    try:
        return args.func(args)
    except FedhetError as exc:
        print(f"fedhet: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("fedhet: interrupted; finished rounds are saved, continue with --resume", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
