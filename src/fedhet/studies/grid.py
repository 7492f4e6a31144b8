"""Experiment grids: one base configuration, axes of values, independent cells; and
``[compare]``, the grid of one axis (the algorithm) that ``fedhet run`` expands.

An experiment file is a run configuration plus:

- ``[experiment]``: ``name``, ``jobs`` (cells run in parallel, default: cores).
- ``[grid]``: dotted keys mapped to lists of values; cells are their Cartesian product. A
  section name may map to a list of tables, each setting several keys of that section
  together (``algorithm = [{name = "drop"}, {name = "salf", normalize = "all"}]``).
- ``[[cases]]`` (optional): tables of dotted overrides, each crossed with the grid (use
  them for settings that change together, e.g. a model with its learning rate and rounds).
- ``[report]``: ``rows`` and ``columns`` (dotted keys) and ``value`` (a summary field) of the
  table written to ``table.md``; cells that share a row and a column (seeds) show their
  mean ± ``interval`` ("std", the sample standard deviation, or "ci95", the half-width of
  the mean's 95% t-interval); with ``reference`` (a column's label as the table shows it),
  a cell significantly above or below the reference column of its row (two-sided paired
  t-test over the seeds, p < ``alpha``, default 0.05, no correction for the number of
  cells) is marked ↑ or ↓ (:mod:`fedhet.studies.stats`).

Each cell is an ordinary run directory under ``<out>/<cell name>/``; a cell with a finished
summary is skipped and a half-finished one resumes from its checkpoint, so an interrupted
grid continues where it stopped.
"""

from fedhet.studies.expansion import Cell, compare_cells
from fedhet.studies.launcher import run_experiment
from fedhet.studies.spec import (
    EXPERIMENT_SECTIONS,
    REPORT_VALUES,
    Experiment,
    check_reference,
    column_labels,
    load_experiment,
)
from fedhet.studies.tables import report_table

__all__ = [
    "EXPERIMENT_SECTIONS",
    "REPORT_VALUES",
    "Cell",
    "Experiment",
    "check_reference",
    "column_labels",
    "compare_cells",
    "load_experiment",
    "report_table",
    "run_experiment",
]
