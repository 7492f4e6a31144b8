"""A configuration's ``[compare]``: a grid of one axis, the algorithm, run through the same
launcher as ``fedhet reproduce``'s grids (:func:`fedhet.studies.launcher.run_experiment`)
and shown as a summary table and accuracy-against-time figures beside its runs."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from fedhet.config import Config
from fedhet.studies.expansion import compare_cells
from fedhet.studies.launcher import CellLaunch, run_experiment
from fedhet.studies.spec import Experiment


@dataclass
class Comparison:
    """What a comparison ran: the summaries in ``[compare]`` order and the figures drawn."""

    summaries: list[dict]
    figures: list[Path] = field(default_factory=list)


def comparison_experiment(raw: dict, where: str | Path, config: Config) -> Experiment:
    """The ``[compare]`` of the parsed configuration ``raw`` as an experiment: one cell per
    algorithm on the same setting, a table of the task's final score with one column per
    algorithm."""
    return Experiment(
        name=config.run.name,
        jobs=1,
        cells=compare_cells(raw, where),
        rows=[],
        columns=["algorithm.name"],
        value=f"final_test_{_score(config)}",
    )


def _score(config: Config) -> str:
    """The score of the setting's task (accuracy when its dataset does not open here)."""
    from fedhet.studies.trials import first_task

    task = first_task([config])
    return task.score if task is not None else "accuracy"


def run_comparison(raw: dict, where: str | Path, config: Config, out: Path, launch: CellLaunch) -> Comparison:
    """Run every algorithm of the ``[compare]`` of ``raw`` (parsed and validated as
    ``config``) into ``out/<algorithm>`` (the run order recorded in ``out``), then draw the
    comparison's figures in ``out``."""
    from fedhet.results import make_folder, write_run_order

    experiment = comparison_experiment(raw, where, config)
    make_folder(out, "output folder")
    write_run_order(out, [cell.name for cell in experiment.cells])
    by_name = run_experiment(experiment, out, jobs=1, launch=launch)
    summaries = [by_name[cell.name] for cell in experiment.cells]
    return Comparison(summaries, comparison_figures([out / c.name for c in experiment.cells], out, config))


def comparison_figures(runs: list[Path], out: Path, config: Config) -> list[Path]:
    """Accuracy against simulated time for the runs of a comparison, as ``out/comparison*``."""
    from fedhet.studies.plots import plot_runs

    setting = f"{config.data.dataset} ({config.data.partition}), {config.system.model}"
    return list(plot_runs(runs, out / "comparison", title=setting, deadlines=False))
