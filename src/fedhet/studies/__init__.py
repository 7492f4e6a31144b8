"""Experiments and reports: grids of runs and ``[compare]``, tables, figures, and analyses
of particular papers (the FedStale beta map, a planner's plan). Built on the core's run
directories; nothing in the core imports it."""
