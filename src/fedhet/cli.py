"""The fedhet command line: run, reproduce, compare, plan, plot, report, list.

Errors in the input (config keys, values, data files, output folders) print one line
naming the problem and exit with status 2; no traceback. A run stopped by a non-finite
loss or model exits with status 1.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
from pathlib import Path

from fedhet.console import progress_printer, summary_table
from fedhet.errors import FedhetError, database_lost


def cmd_run(args: argparse.Namespace) -> int:
    from fedhet.config import apply_overrides, load_config, read_toml
    from fedhet.engine.launch import run

    if args.engine:
        args.set = [*args.set, f'run.engine="{args.engine}"']
    config = load_config(args.config, args.set)
    out = Path(args.out) if args.out else Path("runs") / config.run.name
    if not config.compare.algorithms:
        result = run(
            config,
            out,
            resume=args.resume,
            overwrite=args.overwrite,
            on_round=None if args.quiet else progress_printer(config, config.algorithm_name),
        )
        summary_table([result.summary], f"fedhet run -> {result.path}")
        return _exit_status([result.summary])
    from fedhet.studies.comparison import run_comparison
    from fedhet.studies.launcher import CellLaunch

    launch = CellLaunch(
        resume=args.resume,
        overwrite=args.overwrite,
        on_round=None if args.quiet else (lambda cell: progress_printer(cell.config, cell.name)),
        command="run",
        keep_going=False,  # a comparison with a failed algorithm says nothing: it stops
    )
    raw = apply_overrides(read_toml(args.config), args.set)
    comparison = run_comparison(raw, args.config, config, out, launch)
    summary_table(
        comparison.summaries,
        f"{config.run.name}: {config.data.dataset}, {config.model.name}, {config.system.model} -> {out}",
    )
    for path in comparison.figures:
        print(f"figure: {path}")
    return _exit_status(comparison.summaries)


STOPPED = {"non_finite": "non-finite values", "no_participants": "no participants"}


def _exit_status(summaries: list[dict]) -> int:
    """1 when a run stopped on a non-finite value or for want of participants (a warning
    said where), else 0."""
    return 1 if any(s.get("stopped_by") in STOPPED for s in summaries) else 0


def _cell_printer(console, total: int, quiet: bool):
    """The per-cell line of ``fedhet reproduce``: its final score (the task's), or failed."""
    from fedhet.data.task import Score

    done = {"n": 0}

    def on_cell(cell, summary):
        done["n"] += 1
        if quiet:
            return
        if summary.get("failed"):
            console.print(f"[{done['n']}/{total}] {cell.name}: failed", highlight=False)
            return
        key = f"final_test_{Score.from_summary(summary).metric}"
        value = summary.get(key)
        why = STOPPED.get(summary.get("stopped_by"))
        stopped = f" (stopped: {why})" if why else ""
        shown = value if value is None else round(value, 4)
        console.print(f"[{done['n']}/{total}] {cell.name}: {key} {shown}{stopped}", highlight=False)

    return on_cell


def _write_grid_files(experiment, summaries: dict, out: Path, fmt: str) -> str:
    """A grid's table (table.md and the format asked for), summaries.json, cells.csv; the
    table in ``fmt``."""
    from fedhet.results import dumps
    from fedhet.studies.grid import report_table
    from fedhet.studies.tables import TABLE_FORMATS, cells_csv

    out.mkdir(parents=True, exist_ok=True)
    for kind in {"md", fmt}:  # table.md always, and the format asked for
        table = report_table(experiment, summaries, fmt=kind)
        (out / TABLE_FORMATS[kind]).write_text(table, encoding="utf-8")
    (out / "summaries.json").write_text(dumps(summaries, indent=2, sort_keys=True))
    (out / "cells.csv").write_text(cells_csv(experiment, summaries), encoding="utf-8")
    return report_table(experiment, summaries, fmt=fmt)


def cmd_reproduce(args: argparse.Namespace) -> int:
    from rich.console import Console

    from fedhet.results import make_folder, write_run_order
    from fedhet.studies.grid import check_reference, load_experiment, run_experiment

    console = Console(stderr=True)
    experiment = load_experiment(args.experiment, args.set)
    if args.interval:
        experiment.interval = args.interval
    if args.reference:
        check_reference(experiment, args.reference, "--reference")
        experiment.reference = args.reference
    if args.correction:
        experiment.correction = args.correction
    out = Path(args.out) if args.out else Path("runs") / experiment.name
    if args.list:
        for cell in experiment.cells:
            print(cell.name)
        return 0
    make_folder(out, "output folder")
    write_run_order(out, [cell.name for cell in experiment.cells])
    console.print(f"{experiment.name}: {len(experiment.cells)} cells -> {out}", highlight=False)
    on_cell = _cell_printer(console, len(experiment.cells), args.quiet)
    summaries = run_experiment(experiment, out, jobs=args.jobs, on_cell=on_cell, ray=args.ray)
    print(_write_grid_files(experiment, summaries, out, args.format))
    failed = [name for name, summary in summaries.items() if summary.get("failed")]
    if failed:
        print(
            f"fedhet: {len(failed)} of {len(experiment.cells)} cells failed (marked in the table; each "
            f"cell's reason is in summaries.json), e.g. {failed[0]}: {summaries[failed[0]]['failed']}; run "
            "the same command again to retry them",
            file=sys.stderr,
        )
        return 1
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


def cmd_calibrate(args: argparse.Namespace) -> int:
    """Time each layer of the configuration's model at its batch size on this host."""
    from fedhet.config import apply_overrides, from_dict, read_toml
    from fedhet.system.measured import measure_layer_times
    from fedhet.world import build_world

    raw = apply_overrides(read_toml(args.config), args.set)
    # timing needs the model, data and batch only: no system model, no algorithm's options
    raw["system"], raw["algorithm"] = {"model": "full"}, {"name": "fedavg"}
    raw.pop("compare", None)
    config = from_dict(raw)
    if args.out:  # checked before anything is timed
        _check_output_file(Path(args.out), "calibration file")
    world = build_world(config)  # sets the run's threads
    batch = config.train.batch_size
    x, y = world.dataset.x_train[:batch], world.train_labels[:batch]
    times = measure_layer_times(world.flat.model, x, y, repeats=args.repeats, loss_of=world.dataset.task.loss)
    total = sum(times["forward"]) + sum(times["backward"])
    threads = f"{times['threads']} thread" + ("s" if times["threads"] != 1 else "")
    print(
        f"{config.model.name} on {config.data.dataset}, batch {batch}, {threads} (median of {args.repeats}):"
    )
    print(f"{'layer':>5} {'forward ms':>11} {'backward ms':>12} {'share':>7}")
    for layer, (fwd, bwd) in enumerate(zip(times["forward"], times["backward"], strict=True), start=1):
        print(f"{layer:>5} {1e3 * fwd:>11.4f} {1e3 * bwd:>12.4f} {100 * (fwd + bwd) / total:>6.1f}%")
    print(f"{'all':>5} {1e3 * sum(times['forward']):>11.4f} {1e3 * sum(times['backward']):>12.4f}")
    if args.out:
        from fedhet.results import dumps

        try:
            Path(args.out).write_text(dumps(times, indent=2))
        except OSError as exc:
            raise FedhetError(f"{args.out}: cannot write ({exc.strerror or exc})") from None
        print(f"written to {args.out} (use it with system.measured_times)")
    return 0


def _check_output_file(path: Path, what: str) -> None:
    """One line, before any work, when ``path`` cannot become the ``what`` a command writes:
    its folder is missing or a file, or it is itself a folder."""
    folder = path.parent
    if path.is_dir():
        raise FedhetError(f"{path}: is a folder; --out names the {what} to write")
    if not folder.is_dir():
        why = "is a file" if folder.exists() else "does not exist"
        raise FedhetError(f"{path}: its folder {folder} {why}; create it or choose another --out")
    if not os.access(folder, os.W_OK):
        raise FedhetError(f"{path}: cannot write in {folder} (permission denied)")


def cmd_trace(args: argparse.Namespace) -> int:
    """Convert FedScale's pickled client_behave_trace or FLASH's state_traces.json into
    fedhet's trace format."""
    source = Path(args.source)
    flash = args.format == "flash" or (args.format == "auto" and source.suffix.lower() == ".json")
    skipped = 0
    if flash:
        from fedhet.system.flash_trace import from_flash

        trace, skipped = from_flash(source, args.clients)
    else:
        from fedhet.system.traces import from_fedscale

        trace = from_fedscale(source)
        if args.clients is not None:
            if len(trace.intervals) < args.clients:
                raise FedhetError(f"{source}: {len(trace.intervals)} clients, --clients {args.clients} asked")
            trace.intervals = trace.intervals[: args.clients]
    try:
        Path(args.out).write_text(trace.to_text())
    except OSError as exc:
        raise FedhetError(f"{args.out}: cannot write ({exc.strerror or exc})") from None
    online = sum(trace.share(c) for c in range(len(trace.intervals))) / max(1, len(trace.intervals))
    clients = len(trace.intervals)
    left_out = f"; {skipped} devices FLASH never picks left out" if skipped else ""
    print(
        f"{args.out}: {clients} clients, period {trace.period:g} s, online {100 * online:.1f}% on average"
        + left_out
    )
    return 0


def cmd_devices(args: argparse.Namespace) -> int:
    """Convert FedScale's pickled device capacities into fedhet's device-profile format."""
    import numpy as np

    from fedhet.system.devices import from_fedscale

    profiles = from_fedscale(args.fedscale)
    try:
        Path(args.out).write_text(profiles.to_text(f"converted from FedScale's {Path(args.fedscale).name}"))
    except OSError as exc:
        raise FedhetError(f"{args.out}: cannot write ({exc.strerror or exc})") from None
    median = float(np.median(profiles.compute))
    print(
        f"{args.out}: {len(profiles)} devices, median {1000 * median:.3g} ms per example, "
        f"median upload {float(np.median(profiles.upload)) / 1e3:.4g} kB/s"
    )
    return 0


def cmd_plot(args: argparse.Namespace) -> int:
    from fedhet.studies.plots import plot_runs

    written = plot_runs(args.runs, args.out, x=args.x, title=args.title)
    for path in written:
        print(path)
    return 0


def cmd_compare(args: argparse.Namespace) -> int:
    from fedhet.studies.plots import find_runs

    summaries = [run.read_summary() for run in find_runs(args.runs, marker="summary.json")]
    summary_table(summaries, "fedhet compare")
    return 0


def cmd_report(args: argparse.Namespace) -> int:
    from fedhet.studies.report import write_report

    for path in write_report(args.path, args.out):
        print(path)
    return 0


def cmd_tune(args: argparse.Namespace) -> int:
    """Hyperparameter search on Optuna (fedhet.studies.tune): one line per finished trial
    and a progress bar on stderr, one line per study at the end."""
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from fedhet.studies.tune import tune

    if args.trials < 1:
        raise FedhetError(f"--trials {args.trials}: must be >= 1")
    if args.jobs < 1:
        raise FedhetError(f"--jobs {args.jobs}: must be >= 1")
    out = Path(args.out) if args.out else Path("runs") / f"tune-{Path(args.config).stem}"
    console = Console(stderr=True, highlight=False)
    columns = (
        TextColumn("tune"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("trials"),
        TimeElapsedColumn(),
    )
    with Progress(*columns, console=console, transient=True, disable=args.quiet) as progress:
        bar = progress.add_task("trials", total=None)

        def on_trial(line: str, counts: bool) -> None:
            if not args.quiet:
                progress.console.print(line, soft_wrap=True, markup=False)
            if counts:
                progress.advance(bar)

        results = tune(args.config, args.space, args.trials, out, args.jobs, args.storage, args.set,
                       max_failures=args.max_failures, allow_test_set=args.allow_test_set,
                       on_trial=on_trial, ray=args.ray)  # fmt: skip
    for result in results:
        print(
            f"{result['study']}: {result['finished']} trials finished, {result['pruned']} pruned, "
            f"{result['failed']} failed; best trial {result['best_trial']}, value {result['value']:.6g}, "
            f"{json.dumps(result['params'])} -> {result['best_toml']}"
        )
    return 0


def cmd_bench(args: argparse.Namespace) -> int:
    """Every method of a suite tuned under the same budget in every scenario, run over seeds,
    ranked (fedhet.bench); prints the leaderboard's files."""
    from fedhet.bench.command import BenchOptions, run_bench

    options = BenchOptions(args.suite, args.method, args.trials, args.seeds, args.tuning_repeats, args.jobs,
                           args.ray, args.out, args.set, quiet=args.quiet, rerun=tuple(args.rerun),
                           storage=args.storage, against=args.against)  # fmt: skip
    paths = run_bench(options)
    print(paths[0].read_text(encoding="utf-8"), end="")
    for path in paths:
        print(path, file=sys.stderr)
    return 0


def cmd_check(args: argparse.Namespace) -> int:
    """Try a plug-in (module:Class algorithm) or a configuration on a tiny run: one line per
    check (fedhet.plugin_check); exit status 1 when one fails."""
    from fedhet.plugin_check import ROUNDS, check

    return 0 if check(args.target, rounds=ROUNDS if args.rounds is None else args.rounds) else 1


def cmd_new(args: argparse.Namespace) -> int:
    """Scaffold a plug-in package (fedhet.scaffold) and say what to do next."""
    from fedhet.scaffold import new_rule

    folder = new_rule(args.name, Path(args.out))
    print(f"{folder}: the {args.name} rule's package; next:")
    print(f"  cd {folder} && python -m pip install -e '.[test]' && python -m pytest")
    return 0


def cmd_list(args: argparse.Namespace) -> int:
    """Every plug-in of every kind; with a kind, that kind's; with a kind and a name, that
    plug-in's full description and its options (key, type, default)."""
    from fedhet import registry

    if args.reference:  # what the site build renders, without the build
        from fedhet.reference import reference_markdown

        print(reference_markdown())
        return 0
    labels = {label.replace(" ", "-"): kind for kind, label in registry.KIND_LABELS.items()}
    labels.update({kind: kind for kind in registry.KINDS} | {"partition": "partitioner"})
    if args.kind is not None and args.kind not in labels:
        raise FedhetError(f"fedhet list {args.kind}: not a plug-in kind (known: {', '.join(sorted(labels))})")
    if args.name is not None:
        return _describe_plugin(labels[args.kind], args.name)
    for kind in registry.KINDS if args.kind is None else [labels[args.kind]]:
        print(f"{registry.KIND_LABELS[kind]} ({registry.KINDS[kind]}):")
        for entry in registry.entries(kind):
            origin = "" if entry.origin == "fedhet" else f"  [{entry.origin}]"
            print(f"  {entry.name:<18} {entry.summary}{origin}".rstrip())
    return 0


def _describe_plugin(kind: str, name: str) -> int:
    """One plug-in: where it comes from, its docstring, and its entry of the configuration
    reference (each option's type, default and meaning: fedhet.reference)."""
    import inspect

    from fedhet import registry
    from fedhet.reference import plugin_text

    entry = registry.resolve(kind, name, f"fedhet list {kind}")
    where = f"{entry.cls.__module__}.{entry.cls.__qualname__}"
    print(f"{registry.KIND_LABELS[kind]} {entry.name} ({entry.origin}; {where})")
    doc = inspect.getdoc(entry.cls) or ""
    if doc:
        print("\n" + doc)
    print("\n" + plugin_text(entry))
    if kind == "algorithm":
        from fedhet.algorithms.mechanisms import NO_TIME_LAW
        from fedhet.bench.suite import OWN_SERVER_LR
        from fedhet.search_space import declared_params

        own = [p for p in declared_params(entry.cls, name) if p.key != OWN_SERVER_LR]
        ranges = ", ".join(f"{p.key.split('.', 1)[1]} {p.describe()}" for p in own)
        print(f"\ntuned by fedhet bench: the suite's shared knobs (train.lr and server.lr by default)"
              f"{', and its own: ' + ranges if ranges else ''}")  # fmt: skip
        for mechanism in getattr(entry.cls, "mechanisms", ()):
            knobs = f" (reads {', '.join(mechanism.knobs)})" if mechanism.knobs else ""
            timed = f", and {NO_TIME_LAW}" if mechanism.needs_time_law else ""
            print(f"mechanism: {mechanism.name}{knobs}: acts with {mechanism.needs}{timed}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="fedhet",
        description="Federated learning on heterogeneous devices under time constraints: SALF, "
        "ADEL-FL, AMSFL, FedStale and their baselines on one simulated clock.",
        epilog="Start with: fedhet run examples/quickstart.toml. Help on one command: fedhet COMMAND --help.",
    )
    parser.add_argument("--version", action=_VersionAction)
    parser.add_argument(
        "--debug",
        action="store_true",
        help="after an error's one line, print its traceback (fedhet --debug run ...)",
    )
    sub = parser.add_subparsers(dest="command", required=True, title="commands", metavar="COMMAND")
    for add in (_add_run, _add_reproduce, _add_inspection, _add_outputs, _add_tune_and_list):
        add(sub)
    return parser


def _add_run(sub) -> None:
    p = sub.add_parser(
        "run", help="train one configuration (or each algorithm of its [compare]) and print a table"
    )
    p.add_argument("config", help="TOML configuration file")
    p.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="SECTION.KEY=VALUE",
        help="override a configuration value (repeatable)",
    )
    _add_unset(p)
    p.add_argument("--out", help="run directory (default runs/<run.name>)")
    p.add_argument("--resume", action="store_true", help="continue an interrupted run")
    p.add_argument("--overwrite", action="store_true", help="discard an existing run in --out")
    p.add_argument("--quiet", action="store_true", help="no progress output, only the final table")
    p.add_argument(
        "--engine",
        metavar="ENGINE",
        help="run.engine: embedded (one process, default), flower (Flower's simulation runtime) "
        "or an engine plug-in's name",
    )
    p.set_defaults(func=cmd_run)


def _add_reproduce(sub) -> None:
    p = sub.add_parser(
        "reproduce", help="run every cell of an experiment grid (resumable) and print its table"
    )
    p.add_argument("experiment", help="experiment TOML (see experiments/)")
    p.add_argument("--set", action="append", default=[], metavar="SECTION.KEY=VALUE")
    _add_unset(p)
    p.add_argument("--out", help="output folder (default runs/<experiment.name>)")
    p.add_argument("--jobs", type=_positive_int, help="cells run in parallel (default: experiment.jobs)")
    p.add_argument("--quiet", action="store_true", help="no line per finished cell, only the table")
    p.add_argument(
        "--ray",
        nargs="?",
        const="local",
        metavar="ADDRESS",
        help="run the cells as Ray tasks: on a local Ray (no ADDRESS; --jobs CPUs) or the cluster "
        "at ADDRESS (e.g. ray://head:10001; --out must be on a file system every node sees)",
    )
    p.add_argument("--list", action="store_true", help="list the cells and exit")
    p.add_argument(
        "--interval",
        choices=("std", "ci95"),
        help="after '±' in the table: the seeds' standard deviation or the 95%% confidence "
        "interval of their mean (default: report.interval, else std)",
    )
    p.add_argument(
        "--reference",
        metavar="COLUMN",
        help="mark cells significantly above/below this column of their row (paired t-test "
        "over seeds; default: report.reference)",
    )
    p.add_argument("--correction", choices=("holm", "none"),
                   help="the tests against --reference: Holm-corrected over the table (default: "
                   "report.correction, else holm) or uncorrected")  # fmt: skip
    p.add_argument("--format", choices=("md", "csv", "latex"), default="md",
                   help="the table printed and written beside table.md (table.csv, table.tex)")  # fmt: skip
    p.set_defaults(func=cmd_reproduce)


def _add_inspection(sub) -> None:
    """compare, plan, calibrate, trace."""
    p = sub.add_parser("compare", help="a table of finished runs side by side")
    p.add_argument("runs", nargs="+", help="run folders, or folders of runs")
    p.set_defaults(func=cmd_compare)

    p = sub.add_parser("plan", help="calibrate deadlines and show an algorithm's plan without training")
    p.add_argument("config", help="TOML configuration (or experiment file: its base configuration)")
    p.add_argument("--set", action="append", default=[], metavar="SECTION.KEY=VALUE")
    _add_unset(p)
    p.add_argument(
        "--depth-fraction",
        type=float,
        help="print the deadline (and budget) at which clients reach this share of layers on average",
    )
    p.add_argument("--out", help="write the plan (JSON) here")
    p.set_defaults(func=cmd_plan)

    p = sub.add_parser("calibrate", help="time each layer of a configuration's model on this host")
    p.add_argument("config", help="TOML configuration (its model, dataset and batch size)")
    p.add_argument("--set", action="append", default=[], metavar="SECTION.KEY=VALUE")
    _add_unset(p)
    p.add_argument("--repeats", type=_positive_int, default=7, help="timed passes (the median is kept)")
    p.add_argument("--out", help="write the times (JSON) for system.measured_times")
    p.set_defaults(func=cmd_calibrate)

    p = sub.add_parser("trace", help="convert FedScale's or FLASH's availability trace into fedhet's format")
    p.add_argument("source", help="FedScale's pickled client_behave_trace or FLASH's state_traces.json")
    p.add_argument(
        "--format",
        choices=("auto", "fedscale", "flash"),
        default="auto",
        help="the source's format (auto: FLASH for a .json file, else FedScale)",
    )
    p.add_argument("--clients", type=_positive_int, help="keep the first N clients (data.num_clients)")
    p.add_argument("--out", required=True, help="the trace file to write (system.availability_trace)")
    p.set_defaults(func=cmd_trace)
    p = sub.add_parser("devices", help="convert FedScale's device capacities into fedhet's device profiles")
    p.add_argument("fedscale", help="FedScale's pickled device-capacity dict")
    p.add_argument("--out", required=True, help="the profile file to write (system.device_profiles)")
    p.set_defaults(func=cmd_devices)


def _add_outputs(sub) -> None:
    """plot, report."""
    p = sub.add_parser("plot", help="figures of accuracy against simulated time and of deadlines")
    p.add_argument("runs", nargs="+", help="run directories (or folders holding them)")
    p.add_argument("--out", required=True, help="output file prefix, e.g. figures/fig2")
    p.add_argument("--x", default="sim_time", choices=("sim_time", "round"), help="x axis of accuracy")
    p.add_argument("--title", default="", help="figure title")
    p.set_defaults(func=cmd_plot)

    p = sub.add_parser("report", help="one self-contained HTML page for a run or a grid of runs")
    p.add_argument("path", help="a run folder, or a folder of runs (a grid or a [compare])")
    p.add_argument("--out", help="the HTML file (default <path>/report.html)")
    p.set_defaults(func=cmd_report)


def _add_bench(sub) -> None:
    """``fedhet bench``'s arguments."""
    p = sub.add_parser("bench", help="tune every method of a suite under one budget, run seeds, rank them")
    p.add_argument("suite", help="a suite TOML file (scenarios, methods, budget), e.g. suites/smoke.toml")
    p.add_argument("--method", action="append", default=[], metavar="NAME_OR_PATH",
                   help="add a method: a built-in name or package.module:Class (repeatable)")  # fmt: skip
    p.add_argument("--rerun", nargs="+", default=[], metavar="METHOD",
                   help="tune and run these methods again (changed code does it by itself)")  # fmt: skip
    p.add_argument("--trials", type=_positive_int, help="tuning trials per method and scenario (the suite's)")
    p.add_argument("--seeds", type=_positive_int, help="seeds 1..S of each tuned setting (the suite's)")
    p.add_argument("--tuning-repeats", type=_positive_int, metavar="R",
                   help="independent tunings per method and scenario (the suite's)")  # fmt: skip
    p.add_argument("--against", metavar="FIELD",
                   help="a field's leaderboard.csv or bench folder: run only --method, merge")  # fmt: skip
    p.add_argument(
        "--storage",
        metavar="URL",
        help="an Optuna database URL (postgresql://user@host/db; default <out>/bench.db)",
    )
    p.add_argument("--jobs", type=_positive_int, default=1, help="studies and seed runs at once (default 1)")
    p.add_argument("--ray", nargs="?", const="local", metavar="ADDRESS",
                   help="studies and seeds as Ray tasks: a local Ray, or the cluster at ADDRESS")  # fmt: skip
    p.add_argument("--out", help="the bench folder (default runs/bench-<suite name>)")
    p.add_argument("--set", action="append", default=[], metavar="SECTION.KEY=VALUE",
                   help="override a value of the suite's base configuration (repeatable)")  # fmt: skip
    p.add_argument("--quiet", action="store_true", help="no progress display, no line per study")
    p.set_defaults(func=cmd_bench)


def _add_tune_and_list(sub) -> None:
    p = sub.add_parser("tune", help="search hyperparameters on Optuna; each trial is a run folder")
    p.add_argument("config", help="TOML configuration file (a [compare] gives one study per algorithm)")
    p.add_argument("--space", required=True, help="the search space TOML file")
    p.add_argument("--trials", type=int, required=True, help="finished or pruned trials per study")
    p.add_argument("--jobs", type=int, default=1, help="processes running trials at once")
    p.add_argument("--storage", help="an Optuna storage URL (default: SQLite <out>/study.db)")
    p.add_argument("--ray", nargs="?", const="local", metavar="ADDRESS",
                   help="trial workers as Ray tasks: a local Ray, or the cluster at ADDRESS")  # fmt: skip
    p.add_argument("--out", help="the tune folder (default runs/tune-<config name>)")
    p.add_argument("--set", action="append", default=[], metavar="SECTION.KEY=VALUE",
                   help="override a configuration value (repeatable)")  # fmt: skip
    _add_unset(p)
    p.add_argument("--max-failures", type=int, default=3,
                   help="failed trials in a row that stop a study (default 3)")  # fmt: skip
    p.add_argument("--allow-test-set", action="store_true",
                   help="tune without data.validation_fraction, judging trials on the test set")  # fmt: skip
    p.add_argument("--quiet", action="store_true", help="no line per trial, no progress bar")
    p.set_defaults(func=cmd_tune)

    _add_bench(sub)

    p = sub.add_parser("check", help="try a plug-in or a configuration on a tiny run: which part fails, why")
    p.add_argument("target", help="an algorithm plug-in (package.module:ClassName) or a configuration file")
    p.add_argument("--rounds", type=int, default=None,
                   help="rounds of the tiny run (default 5, at least 2)")  # fmt: skip
    p.set_defaults(func=cmd_check)
    _add_new_and_list(sub)


def _add_new_and_list(sub) -> None:
    p = sub.add_parser("new", help="scaffold a plug-in package: fedhet new rule NAME")
    p.add_argument("kind", choices=["rule"], help="what to scaffold: rule (an aggregation rule)")
    p.add_argument("name", help="its name: lower case letters, digits, - or _")
    p.add_argument("--out", default=".", help="the folder to create it in (default: here)")
    p.set_defaults(func=cmd_new)

    p = sub.add_parser("list", help="the plug-ins there are (of a kind; one plug-in's options)")
    p.add_argument("kind", nargs="?", help="a plug-in kind: algorithm, system-model, dataset, ...")
    p.add_argument("name", nargs="?", help="a plug-in of that kind: its description and options")
    p.add_argument(
        "--reference",
        action="store_true",
        help="print the whole configuration reference (every key, type, default, meaning) as Markdown",
    )
    p.set_defaults(func=cmd_list)


def _show_warnings() -> None:
    """Print the library's warnings (e.g. a planner fallback) as one line each on stderr, and
    what an engine starts (``fedhet.start``: Ray for Flower) as plain lines."""
    logger = logging.getLogger("fedhet")
    if not logger.handlers:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("fedhet: warning: %(message)s"))
        handler.setLevel(logging.WARNING)
        logger.addHandler(handler)
    starting = logging.getLogger("fedhet.start")  # what an engine starts (Ray) and how long it took
    if not starting.handlers:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("fedhet: %(message)s"))
        starting.addHandler(handler)
        starting.setLevel(logging.INFO)
        starting.propagate = False


class _VersionAction(argparse.Action):
    """``--version``: the version and the commit of the checkout fedhet runs from, as a run's
    summary records it (:func:`fedhet.build.fedhet_build`), read only when asked."""

    def __init__(self, option_strings, dest=argparse.SUPPRESS, default=argparse.SUPPRESS, help=None):
        help = help or "print fedhet's version and the commit it runs from, then exit"
        super().__init__(option_strings, dest=dest, default=default, nargs=0, help=help)

    def __call__(self, parser, namespace, values, option_string=None):
        from fedhet.build import fedhet_build

        print(f"fedhet {fedhet_build()}")
        parser.exit()


def _add_unset(parser: argparse.ArgumentParser) -> None:
    """``--unset SECTION.KEY`` (repeatable): remove a key of the file, in order with --set."""
    from fedhet.config import UNSET

    parser.add_argument("--unset", action="append", dest="set", type=lambda key: UNSET + key,
                        metavar="SECTION.KEY", help="remove a key of the file (repeatable)")  # fmt: skip


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"{value}: must be >= 1")
    return value


INTERRUPTED = {
    "run": "finished rounds are saved up to the last checkpoint (run.checkpoint_every); continue with "
    "the same command and --resume",
    "reproduce": "finished cells are kept; run the same command again to continue "
    "(finished cells are skipped, unfinished ones resume)",
    "bench": "finished trials and seeds are kept; run the same command again to continue",
    "tune": "finished trials are kept; run the same command again to continue",
}


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    _show_warnings()
    try:
        status = args.func(args)
        sys.stdout.flush()  # inside the try: a reader that quit early is a BrokenPipeError here
        return status
    except FedhetError as exc:
        print(f"fedhet: error: {exc}", file=sys.stderr)
        if args.debug:  # the one line first; then where it came from (a plug-in's own traceback)
            import traceback

            print(getattr(exc, "details", "") or traceback.format_exc(), file=sys.stderr, end="")
        return 2
    except KeyboardInterrupt:
        print(f"fedhet: interrupted; {INTERRUPTED.get(args.command, 'nothing was lost')}", file=sys.stderr)
        return 130
    except BrokenPipeError:  # output piped into a reader that quit early (e.g. `| head`)
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # no error at exit
        return 141
    except Exception as exc:
        lost = database_lost(exc)
        if lost is None or args.debug:
            raise
        kept = INTERRUPTED.get(args.command, "nothing finished was lost")
        print(f"fedhet: error: {lost}; {kept} once it answers again", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
