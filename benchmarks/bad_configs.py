"""Feed ``fedhet run`` and ``fedhet reproduce`` a few hundred invalid inputs and count how
each one ends.

Every case below is invalid by construction (a value out of its documented range, a wrong
type, a broken file, an output folder that cannot be written). The expected outcome is one
line on stderr starting with ``fedhet: error:`` and exit status 2. The script reports:

- ``rejected``: exit 2 with one error line (the goal),
- ``tracebacks``: any other exception,
- ``accepted``: the run went ahead (exit 0) although the input is invalid,
- ``noisy``: rejected, but with more than one line on stderr.

    python benchmarks/bad_configs.py            # all cases, a summary, the failures listed
    python benchmarks/bad_configs.py --verbose  # every case and its message

Groups beyond single keys: ``tune --storage`` URLs, accuracy objectives on a regression
(tune and bench), device names a profile file cannot hold, suites with a bad seed or target,
quadratic entries that are no numbers, LEAF folders without examples or features; runs that
could never train (a plan no client can meet, nobody
present, a budget shorter than a round, nothing held out, a swap that swaps nothing),
damaged calibration and trace files, damaged run folders given to ``run --resume``,
``compare``, ``plot`` and ``report``, outputs that cannot be written, FedScale pickles with
broken finish times, and experiment files whose cases clash with their grid.

Runs in-process (one digits dataset, 1 round), a few minutes on 2 cores.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import math
import os
import pickle
import shutil
import signal
import sys
import tempfile
import traceback
from pathlib import Path

import tomli_w

BASE = {
    "run": {"name": "bad", "seed": 1, "rounds": 1, "threads": 1},
    "data": {"dataset": "digits", "num_clients": 4, "fraction": 0.3},
    "model": {"name": "mlp", "hidden": [8]},
    "train": {"lr": 0.1, "batch_size": 8},
    "system": {"model": "straggler-ratio", "straggler_ratio": 0.5, "deadline": 1.0},
    "algorithm": {"name": "salf"},
}

NAN, INF = math.nan, math.inf
NUMBERS_BAD = [NAN, INF, -INF, "1.0", True]  # for every float key
INTS_BAD = [1.5, "3", True, NAN]  # for every integer key

# key -> invalid values beyond the generic ones (section-level context in EXTRA below)
RANGES: dict[str, list] = {
    "run.name": ["", "a/b", ".hidden", "x" * 300, "a\x00b", " lead", "a\\b", 5],
    "run.seed": [-1, *INTS_BAD],
    "run.rounds": [0, -5, 10**12, *INTS_BAD],
    "run.time_budget": [-1.0, *NUMBERS_BAD],
    "run.energy_budget": [-1.0, 1e31, *NUMBERS_BAD],
    "run.checkpoint_every": [-1.0, 1e6, *NUMBERS_BAD],
    "run.eval_every": [0, -1, *INTS_BAD],
    "run.threads": [-1, 10**6, *INTS_BAD],
    "run.workers": [0, -1, 10**6, "many", *INTS_BAD],
    "run.device": ["gpu", "cuda:x", "", 0, "cuda", "cuda:7"],  # cuda: no GPU on a CPU machine
    "run.pool": ["gpu", 3],
    "run.clients_per_batch": [-1, *INTS_BAD],
    "run.client_eval": [1, "yes"],
    "run.client_eval_fraction": [0.0, 1.0, -0.1, 1.5, *NUMBERS_BAD],
    "run.targets": [[0], [1.5], ["a"], [NAN], 0.5, [True]],
    "run.on_non_finite": ["ignore", 1],
    "data.dataset": ["imagenet", 3],
    "data.partition": ["random", None],
    "data.num_clients": [0, -1, 10**7, 5000, *INTS_BAD],
    "data.fraction": [0.0, 1.5, -1.0, *NUMBERS_BAD],
    "data.alpha": [0.0, -1.0, *NUMBERS_BAD],
    "data.shards_per_client": [0, -2, *INTS_BAD],
    "data.swap_fraction": [-0.1, 1.1, *NUMBERS_BAD],
    "data.swap_pairs": [[[0]], [[0, 0]], [["a", "b"]], [[-1, 2]], 5, [[0, 1.5]]],
    "data.swap_clients": ["odd"],
    "data.label_mode": ["3-class"],
    "model.name": ["resnet", 3],
    "model.hidden": [[0], [-1], [10**9], ["a"], [1.5], 32, [True]],
    "train.lr": [0.0, -1.0, *NUMBERS_BAD],
    "train.lr_schedule": ["cosine"],
    "train.lr_rho_c": [0.0, -1.0, *NUMBERS_BAD],
    "train.lr_gamma": [0.0, -1.0, *NUMBERS_BAD],
    "train.lr_milestones": [[0], [3, 2], [2, 2], [1.5], ["a"], 5, [True]],
    "train.lr_decay": [0.0, 1.5, -0.5, *NUMBERS_BAD],
    "train.batch_size": [0, -1, *INTS_BAD],
    "train.local_steps": [0, -1, *INTS_BAD],
    "train.momentum": [1.0, -0.1, *NUMBERS_BAD],
    "train.weight_decay": [-1.0, *NUMBERS_BAD],
    "train.keep_momentum": ["no"],
    "system.model": ["gaussian"],
    "system.deadline": [-1.0, *NUMBERS_BAD],
    "system.compute_watts": [-0.1, 1e7, *NUMBERS_BAD],
    "system.upload_watts": [-1.0, *NUMBERS_BAD],
    "system.idle_watts": [-1.0, *NUMBERS_BAD],
    "system.device_correlation": [-0.6, 1.01, *NUMBERS_BAD],
    "system.straggler_ratio": [1.5, -0.1, *NUMBERS_BAD],
    "system.straggler_min_depth": [0, 100, *INTS_BAD],
    "system.time_per_sample_layer": [0.0, -1.0, *NUMBERS_BAD],
    "system.time_per_sample_step": [0.0, *NUMBERS_BAD],
    "system.comm_time": [-1.0, *NUMBERS_BAD],
    "system.step_jitter": [-1.0, *NUMBERS_BAD],
    "system.capability_profile": ["normal"],
    "system.capability_low": [0.0, -1.0, 5.0, *NUMBERS_BAD],
    "system.capability_sigma": [-1.0, 1e6, *NUMBERS_BAD],
    "system.capability_mu": [1e6, *NUMBERS_BAD],
    "system.capabilities": [["a"], [NAN], [0], [-1], [INF], "1.0"],
    "system.participation": ["sometimes"],
    "system.participation_min": [0.0, 1.5, *NUMBERS_BAD],
    "system.participation_low": [0.0, 1.5, *NUMBERS_BAD],
    "system.participation_high": [0.0, 1.5, *NUMBERS_BAD],
    "system.participation_probs": [[NAN], [0], [1.5], ["a"], 0.5],
    "system.dropout": ["sometimes", 3],
    "data.size_sigma": [-1.0, 11.0, *NUMBERS_BAD],
    "data.min_client_size": [0, -3, *INTS_BAD],
    "server.optimizer": ["lamb", 2],
    "server.lr": [0.0, -1.0, *NUMBERS_BAD],
}

# whole-section replacements that are invalid as a combination
EXTRA: list[tuple[str, dict]] = [
    ("capabilities of the wrong length", {"system": {"capability_profile": "list", "capabilities": [1.0]}}),
    ("list profile without capabilities", {"system": {"capability_profile": "list"}}),
    (
        "participation list of the wrong length",
        {"system": {"participation": "list", "participation_probs": [0.5]}},
    ),
    (
        "participation_low > high",
        {"system": {"participation": "uniform", "participation_low": 0.9, "participation_high": 0.2}},
    ),
    (
        "capability_low > high",
        {"system": {"capability_profile": "uniform", "capability_low": 2.0, "capability_high": 1.0}},
    ),
    (
        "label-swap without pairs",
        {"data": {"partition": "label-swap", "swap_pairs": [], "swap_fraction": 0.5}},
    ),
    (
        "label-swap label 100",
        {"data": {"partition": "label-swap", "swap_pairs": [[0, 100]], "swap_fraction": 0.5}},
    ),
    ("deadline 0 without budget", {"system": {"deadline": 0.0}}),
    ("salf-theorem with rho_c 0", {"train": {"lr_schedule": "salf-theorem", "lr_rho_c": 0.0}}),
    ("cnn2 on 8x8 digits", {"model": {"name": "cnn2"}}),
    ("fmnist from a missing folder", {"data": {"dataset": "fmnist", "data_dir": "/nonexistent/fmnist"}}),
    ("mnist from a missing folder", {"data": {"dataset": "mnist", "data_dir": "/nonexistent/mnist"}}),
    ("cifar10 from a missing folder", {"data": {"dataset": "cifar10", "data_dir": "/nonexistent/c10"}}),
    ("nsl-kdd from a missing folder", {"data": {"dataset": "nsl-kdd", "data_dir": "/nonexistent/kdd"}}),
    ("nsl-kdd unknown test set", {"data": {"dataset": "nsl-kdd", "data_dir": "kdd", "test_set": "train"}}),
    ("nsl-kdd test fraction 0", {"data": {"dataset": "nsl-kdd", "data_dir": "kdd", "test_fraction": 0.0}}),
    ("nsl-kdd test fraction 1", {"data": {"dataset": "nsl-kdd", "data_dir": "kdd", "test_fraction": 1.0}}),
    (
        "nsl-kdd unknown train file",
        {"data": {"dataset": "nsl-kdd", "data_dir": "kdd", "train_file": "x.txt"}},
    ),
    (
        "amsfl GDA charged on exponential",
        {
            "algorithm": {"name": "amsfl", "round_budget": 10.0, "costs": "estimated"},
            "system": {"model": "exponential"},
        },
    ),
    ("adel-fl without a budget", {"algorithm": {"name": "adel-fl"}, "system": {"model": "exponential"}}),
    ("amsfl with straggler-ratio", {"algorithm": {"name": "amsfl", "round_budget": 10.0}}),
    (
        "measured times from a missing file",
        {"system": {"model": "measured", "measured_times": "/nonexistent.json"}},
    ),
    ("trace availability without a file", {"system": {"availability": "trace"}}),
    (
        "trace availability from a missing file",
        {"system": {"availability": "trace", "availability_trace": "/nonexistent-trace.txt"}},
    ),
    ("unknown availability", {"system": {"availability": "sometimes"}}),
    ("heterofl with negative BatchNorm examples", {"algorithm": {"name": "heterofl", "bn_examples": -5}}),
    ("unknown input normalisation", {"data": {"normalize": "zscore"}}),
    ("normalisation of tabular data", {"data": {"dataset": "nsl-kdd", "normalize": "half"}}),
    ("unknown engine", {"run": {"engine": "spark"}}),
    ("negative round timeout", {"run": {"round_timeout": -1.0}}),
    ("unknown section", {"runs": {"rounds": 3}}),
    ("section that is not a table", {"run": 5}),
    ("unknown run key", {"run": {"round": 3}}),
    ("compare nested list", {"compare": {"algorithms": [["salf"]]}}),
    ("compare unknown", {"compare": {"algorithms": ["fedsgd"]}}),
    ("compare twice", {"compare": {"algorithms": ["salf", "salf"]}}),
    ("compare a string", {"compare": {"algorithms": "salf"}}),
    ("compare a number", {"compare": {"algorithms": [1]}}),
    ("compare unknown key", {"compare": {"algos": ["salf"]}}),
    # plug-ins: registry names, module paths, listed plug-ins and their options
    ("unknown local optimizer", {"train": {"optimizer": "lion"}}),
    ("adam beta1 = 1", {"train": {"optimizer": "adam", "beta1": 1.0}}),
    ("adam eps = 0", {"train": {"optimizer": "adam", "eps": 0.0}}),
    ("adam with keep_momentum", {"train": {"optimizer": "adam", "keep_momentum": "yes"}}),
    ("postprocess not a list of tables", {"train": {"postprocess": ["clip-noise"]}}),
    ("unknown postprocessor", {"train": {"postprocess": [{"name": "gzip"}]}}),
    ("clip-noise max_norm 0", {"train": {"postprocess": [{"name": "clip-noise", "max_norm": 0.0}]}}),
    (
        "clip-noise negative noise",
        {"train": {"postprocess": [{"name": "clip-noise", "noise_multiplier": -1}]}},
    ),
    ("compress unknown method", {"train": {"postprocess": [{"name": "compress", "method": "zip"}]}}),
    (
        "compress fraction 0",
        {"train": {"postprocess": [{"name": "compress", "method": "topk", "fraction": 0}]}},
    ),
    ("negative upload bandwidth", {"system": {"model": "per-step", "upload_bandwidth": -1.0}}),
    ("unknown callback", {"run": {"callbacks": [{"name": "wandb"}]}}),
    ("unknown tracker", {"run": {"track": ["wandb"]}}),
    ("tracker not in a list", {"run": {"track": "mlflow"}}),
    ("tracker listed twice", {"run": {"track": ["mlflow", "mlflow"]}}),
    ("empty mlflow uri", {"run": {"track": [{"name": "mlflow", "uri": " "}]}}),
    ("old mlflow_uri key", {"run": {"track": ["mlflow"], "mlflow_uri": "sqlite:///x.db"}}),
    ("callback without a name", {"run": {"callbacks": [{"every": 2}]}}),
    ("algorithm module path not importable", {"algorithm": {"name": "no_such_pkg_xyz.rules:Rule"}}),
    ("algorithm module path without a class", {"algorithm": {"name": "fedhet.algorithms.salf:Nope"}}),
    ("algorithm module path to a non-plug-in", {"algorithm": {"name": "fedhet.errors:ConfigError"}}),
    ("system model module path malformed", {"system": {"model": "fedhet.system:"}}),
    ("unknown dataset", {"data": {"dataset": "imagenet"}}),
    ("unknown model", {"model": {"name": "resnet50"}}),
    # mid-round dropout, device profiles, quantity skew, server optimizers
    *(
        (f"dropout hazard {v}", {"system": {"dropout": "hazard", "dropout_hazard": v}})
        for v in (-1.0, *NUMBERS_BAD)
    ),
    ("dropout hazards of the wrong length", {"system": {"dropout": "hazard", "dropout_hazards": [0.1]}}),
    ("dropout hazards negative", {"system": {"dropout": "hazard", "dropout_hazards": [-1.0] * 4}}),
    ("dropout with 0 marginal draws", {"system": {"dropout": "hazard", "dropout_marginal_draws": 0}}),
    (
        "quadratic with a singular matrix",
        {"data": {"dataset": "quadratic", "quadratic_matrices": [[[1, 0], [0, 0]], [[1, 0], [0, 1]]]}},
    ),
    ("quadratic optima of the wrong shape", {"data": {"dataset": "quadratic", "quadratic_optima": [[1.0]]}}),
    ("quadratic matrices not numbers", {"data": {"dataset": "quadratic", "quadratic_matrices": "eye"}}),
    ("linear model bias not a boolean", {"model": {"name": "linear", "bias": "yes"}}),
    ("vgg with an unknown classifier", {"model": {"name": "vgg11", "classifier": "three"}}),
    ("comm_times of the wrong length", {"system": {"model": "per-step", "comm_times": [0.1]}}),
    ("comm_times negative", {"system": {"model": "per-step", "comm_times": [-1.0] * 4}}),
    ("comm_times not numbers", {"system": {"model": "per-step", "comm_times": ["a"] * 4}}),
    ("dropout keeping an unknown share", {"system": {"dropout": "hazard", "dropout_keeps": "half"}}),
    ("dropout keeps a number", {"system": {"dropout": "hazard", "dropout_keeps": 1}}),
    ("trace dropout without a file", {"system": {"dropout": "trace"}}),
    (
        "trace dropout from a missing file",
        {"system": {"dropout": "trace", "dropout_trace": "/nonexistent-trace.txt"}},
    ),
    (
        "finished pieces on wall-clock clients",
        {"system": {"model": "wall-clock", "dropout": "hazard", "dropout_keeps": "finished"}},
    ),
    ("devices without a file", {"system": {"model": "per-step", "capability_profile": "devices"}}),
    (
        "devices from a missing file",
        {
            "system": {
                "model": "per-step",
                "capability_profile": "devices",
                "device_profiles": "/nonexistent.csv",
            }
        },
    ),
    ("device file without devices", {"system": {"model": "per-step", "device_profiles": "devices.csv"}}),
    (
        "devices with an unknown assignment",
        {
            "system": {
                "model": "per-step",
                "capability_profile": "devices",
                "device_profiles": "d.csv",
                "device_assignment": "round-robin",
            }
        },
    ),  # fmt: skip
    (
        "devices with measured times",
        {"system": {"model": "measured", "capability_profile": "devices", "device_profiles": "d.csv"}},
    ),
    ("quantity skew by zipf", {"data": {"partition": "quantity-skew", "size_distribution": "zipf"}}),
    ("quantity skew exponent 0", {"data": {"partition": "quantity-skew", "size_exponent": 0.0}}),
    (
        "quantity skew minimum above the data",
        {"data": {"partition": "quantity-skew", "min_client_size": 500}},
    ),
    ("server yogi beta2 = 1", {"server": {"optimizer": "yogi", "beta2": 1.0}}),
    ("server adam tau 0", {"server": {"optimizer": "adam", "tau": 0.0}}),
    ("server momentum 1", {"server": {"optimizer": "momentum", "momentum": 1.0}}),
    ("server unknown key", {"server": {"optimizer": "sgd", "betas": 0.9}}),
    ("depthfl on a model without exits", {"algorithm": {"name": "depthfl"}}),
    ("timelyfl without a time law", {"algorithm": {"name": "timelyfl"}}),
]

OORT_BAD = {
    "exploration": [-0.1, 1.5, *NUMBERS_BAD], "exploration_decay": [2.0, *NUMBERS_BAD],
    "exploration_min": [-1.0], "cutoff": [1.2], "straggler_penalty": [-1.0, *NUMBERS_BAD],
    "pacer_percentile": [101.0, -5.0], "pacer_step": [150.0], "pacer_window": [0, *INTS_BAD],
    "clients_per_round": [0],
}  # fmt: skip
# client selection: its options only mean something with their rule, so each case names it
SELECTION_BAD: list[tuple[str, dict]] = [
    ("selection rule unknown", {"selection": {"rule": "oortt"}}),
    ("selection rule not a name", {"selection": {"rule": 3}}),
    *[(f"uniform clients_per_round = {v!r}", {"selection": {"rule": "uniform", "clients_per_round": v}})
      for v in (0, -2, *INTS_BAD)],
    *[(f"power-of-choice candidates = {v!r}",
       {"selection": {"rule": "power-of-choice", "clients_per_round": 2, "candidates": v}})
      for v in (1, 0, *INTS_BAD)],
    *[(f"oort {key} = {v!r}", {"selection": {"rule": "oort", key: v}})
      for key, values in OORT_BAD.items() for v in values],
    *[(f"refl clients_per_round = {v!r}", {"selection": {"rule": "refl", "clients_per_round": v}})
      for v in (0, *INTS_BAD)],
    *[(f"tifl {key} = {v!r}", {"selection": {"rule": "tifl", key: v}})
      for key in ("tiers", "interval", "clients_per_round") for v in (0, -1, *INTS_BAD)],
    ("uniform selection of an event-driven rule",
     {"selection": {"rule": "uniform", "clients_per_round": 2}, "algorithm": {"name": "fedbuff"}}),
    # against the cohort of 4 clients
    ("uniform asking more clients than the run has",
     {"selection": {"rule": "uniform", "clients_per_round": 5}}),
    ("power-of-choice with more candidates than clients",
     {"selection": {"rule": "power-of-choice", "clients_per_round": 2, "candidates": 9}}),
    ("tifl with more tiers than clients",
     {"selection": {"rule": "tifl", "tiers": 6, "clients_per_round": 1}}),
    ("oort's exploration floor above its start",
     {"selection": {"rule": "oort", "exploration": 0.2, "exploration_min": 0.5}}),
]  # fmt: skip
EXTRA += SELECTION_BAD
EXTRA += [
    ("correlated devices with two-group participation",
     {"system": {"participation": "two-group", "device_correlation": 0.5}}),
    ("correlated devices with an availability trace",
     {"system": {"availability": "trace", "device_correlation": 0.5}}),
    ("correlated devices where nothing is drawn (a depth-only model, one availability)",
     {"system": {"device_correlation": 0.5}}),
    ("correlated devices with one speed for all",
     {"system": {"model": "per-step", "capability_profile": "constant", "device_correlation": 0.5}}),
]  # fmt: skip

ALGORITHM_BAD: list[dict] = [
    {"name": "fedsgd"},
    {"name": 5},
    {"name": "salf", "normalize": "x"},
    {"name": "salf", "bias_correction": "yes"},
    {"name": "salf", "unknown_option": 1},
    {"name": "drop", "normalize": "some"},
    *({"name": "fedavg", "server_lr": v} for v in (0.0, -1.0, NAN, INF)),
    {"name": "fedavg", "weights": "x"},
    *(
        {"name": "adel-fl", key: v}
        for key in ("rho_c", "rho_s", "grad_bound", "grad_variance")
        for v in (0.0, NAN, INF)
    ),
    *({"name": "adel-fl", "p1_margin": v} for v in (0.0, 0.5, NAN)),
    {"name": "adel-fl", "batch_scale_min": 10.0, "batch_scale_max": 1.0},
    {"name": "adel-fl", "warmup_batches": 1},
    *({"name": "fedstale", "beta": v} for v in (1.5, -0.1, NAN, INF)),
    {"name": "fedstale", "participation": "guess"},
    {"name": "u-fedavg", "fedau_cutoff": 0},
    *({"name": "amsfl", "round_budget": v} for v in (0.0, -1.0, NAN, INF)),
    {"name": "amsfl", "round_budget": 10.0, "mu": 0.0},
    {"name": "amsfl", "round_budget": 10.0, "allocation": "x"},
    {"name": "amsfl", "round_budget": 10.0, "max_steps": 0},
    {"name": "amsfl", "round_budget": 10.0, "gda_cost": "cheap"},
    {"name": "amsfl", "round_budget": 10.0, "allocation": "sqrt", "gda_cost": 1},
    *({"name": "fedprox", "mu": v} for v in (-1.0, NAN, INF)),
    *({"name": "feddyn", "alpha": v} for v in (0.0, NAN, INF)),
    *({"name": "scaffold", "server_lr": v} for v in (0.0, NAN)),
    *({"name": "heterofl", "rates": v} for v in ([0.5], [1.0, 2.0], [1.0, NAN], [], "1", [1.0, True])),
    *({"name": "heterofl", "fixed_rate": v} for v in (0.0, 1.5, NAN, -0.5, True)),
    {"name": "heterofl", "width_rule": "widest"},
    {"name": "heterofl", "sub_model_cost": "flops"},
    {"name": "heterofl", "aggregate": "mean"},
    *({"name": "fedbuff", "buffer_size": v} for v in (0, -1, 100)),
    *({"name": "fedbuff", "max_concurrency": v} for v in (-1, 1.5)),
    {"name": "fedbuff", "server_lr": NAN},
    *({"name": "ca2fl", "buffer_size": v} for v in (0, -1, 100)),
    *({"name": "fedrolex", "rates": v} for v in ([], [0.5], [1.0, 0.0], [1.0, "a"])),
    {"name": "fedrolex", "fixed_rate": 1.5},
    *({"name": "ca2fl", key: v} for key in ("memory_dtype", "memory_storage") for v in ("float64", 3)),
    {"name": "ca2fl", "server_lr": 0.0},
    *({"name": "fedasync", "alpha": v} for v in (0.0, 1.5, NAN)),
    {"name": "fedasync", "staleness": "exponential"},
    *({"name": "fedasync", key: v} for key in ("staleness_a", "staleness_b", "rho") for v in (-1.0, NAN)),
    {"name": "fedasync", "max_concurrency": -1},
    *(
        {"name": "fedbalancer", key: v}
        for key in ("under_share", "threshold_step", "deadline_step")
        for v in (-0.1, 1.5, NAN)
    ),
    *({"name": "fedbalancer", "low_share": v} for v in (0.0, 1.5, NAN)),
    *({"name": "fiarse", "rates": v} for v in ([], [0.5], [1.0, 0.0], [1.0, "a"], [1.0, True])),
    {"name": "fiarse", "scope": "unit"},
    *({"name": "fiarse", "server_lr": v} for v in (0.0, -1.0, INF, NAN)),
    *({"name": "fedbalancer", "window": v} for v in (0, -1, 1.5, True)),
    {"name": "fedbalancer", "inference": "free"},
    *({"name": "refl", "beta": v} for v in (-0.1, 1.5, NAN)),
    *({"name": "refl", "kappa": v} for v in (0.5, INF, NAN)),
    *({"name": "refl", "max_staleness": v} for v in (-1, 1.5, True)),
    *({"name": "fedcompass", "min_ratio": v} for v in (0.0, 1.5, NAN)),
    *({"name": "fedcompass", "latest_factor": v} for v in (0.5, INF, NAN)),
    *({"name": "fedcompass", key: v} for key in ("alpha", "speed_momentum") for v in (0.0, 1.5, NAN)),
    *({"name": "fedcompass", "max_steps": v} for v in (-1, 1.5, True)),
    {"name": "fedcompass", "staleness": "exponential"},
    {"name": "fedcompass", "weights": "equal"},
    *({"name": "fedcompass", key: v} for key in ("staleness_a", "staleness_b") for v in (-1.0, INF)),
    *({"name": "timelyfl", "aggregation_goal": v} for v in (-1, 99, 1.5)),
    *({"name": "timelyfl", "max_epochs": v} for v in (0, -2)),
    {"name": "timelyfl", "timing_draws": 0},
    *({"name": "fjord", "rates": v} for v in ([0.5], [1.0, 2.0], [])),
    {"name": "fjord", "aggregate": "padded"},
    {"name": "fjord", "distillation": "yes"},
    *({"name": "depthfl", "consistency_weight": v} for v in (-1.0, NAN)),
    {"name": "depthfl", "consistency_rampup": -1},
]

FILES: list[tuple[str, bytes | None]] = [
    ("empty file", b""),
    ("comment only", b"# nothing here\n\n"),
    ("non-UTF-8", b'[run]\nname = "\xff\xfe"\n'),
    ("binary", bytes(range(256)) * 4),
    ("invalid TOML", b"[run\nrounds = \n"),
    ("only [run]", b"[run]\nrounds = 3\n"),
    ("a directory", None),
]

EXPERIMENTS: list[tuple[str, dict]] = [
    ("jobs a string", {"experiment": {"jobs": "two"}}),
    ("jobs negative", {"experiment": {"jobs": -1}}),
    ("unknown experiment key", {"experiment": {"jbos": 2}}),
    ("report value typo", {"report": {"value": "final_test_acuracy"}}),
    ("report rows typo", {"report": {"rows": ["algorithm.nmae"]}}),
    ("report rows unknown section", {"report": {"rows": ["algo.name"]}}),
    ("report rows a string", {"report": {"rows": "algorithm.name"}}),
    ("unknown report key", {"report": {"value": "final_test_accuracy", "colums": []}}),
    ("grid value not a list", {"grid": {"run.seed": 1}}),
    ("grid empty list", {"grid": {"run.seed": []}}),
    ("grid bad key", {"grid": {"run.sed": [1, 2]}}),
    ("grid bad value", {"grid": {"train.lr": [0.1, -1.0]}}),
    ("cases not tables", {"cases": [1, 2]}),
    ("experiment name with a slash", {"experiment": {"name": "a/b"}}),
    ("grid that repeats a cell", {"grid": {"run.seed": [1, 1]}}),
]


# Valid but extreme values: they may run, stop on a non-finite value (exit 1) or be refused
# with one line; never a traceback.
EXTREMES: list[tuple[str, dict]] = [
    ("huge shards_per_client", {"data": {"partition": "shards", "shards_per_client": 10**9}}),
    ("huge batch", {"train": {"batch_size": 10**9}}),
    ("huge deadline", {"system": {"deadline": 1e30}}),
    ("tiny per-layer time", {"system": {"model": "exponential", "time_per_sample_layer": 1e-30}}),
    ("huge per-layer time", {"system": {"model": "exponential", "time_per_sample_layer": 1e30}}),
    ("tiny dirichlet alpha", {"data": {"partition": "dirichlet", "alpha": 1e-30}}),
    ("huge dirichlet alpha", {"data": {"partition": "dirichlet", "alpha": 1e30}}),
    ("tiny fraction", {"data": {"fraction": 1e-30}}),
    ("tiny held-out share", {"run": {"client_eval": True, "client_eval_fraction": 1e-30}}),
    ("tiny participation", {"system": {"participation": "two-group", "participation_min": 1e-30}}),
    ("largest jitter", {"system": {"model": "per-step", "step_jitter": 10.0}}),
    ("huge comm time", {"system": {"model": "per-step", "comm_time": 1e30}}),
    (
        "extreme lognormal fleet",
        {
            "system": {
                "model": "exponential",
                "capability_profile": "lognormal",
                "capability_mu": 50.0,
                "capability_sigma": 10.0,
            }
        },
    ),  # fmt: skip
    ("huge lr", {"train": {"lr": 1e30}}),
    ("huge server_lr", {"algorithm": {"name": "fedavg", "server_lr": 1e30}}),
    ("tiny feddyn alpha", {"algorithm": {"name": "feddyn", "alpha": 1e-30}}),
    ("huge fedprox mu", {"algorithm": {"name": "fedprox", "mu": 1e30}}),
    (
        "tiny amsfl budget",
        {"algorithm": {"name": "amsfl", "round_budget": 1e-30}, "system": {"model": "per-step"}},
    ),
    (
        "adel-fl tiny budget",
        {
            "algorithm": {"name": "adel-fl"},
            "run": {"time_budget": 1e-30},
            "system": {"model": "exponential", "deadline": 0.0},
        },
    ),  # fmt: skip
    (
        "adel-fl huge budget",
        {
            "algorithm": {"name": "adel-fl"},
            "run": {"time_budget": 1e30},
            "system": {"model": "exponential", "deadline": 0.0},
        },
    ),  # fmt: skip
    ("a huge mlp", {"model": {"hidden": [65536, 65536]}}),
]


# Runs that could never train: refused before training, in one line.
PER_STEP_SLOW = {"model": "per-step", "time_per_sample_step": 2.0, "deadline": 1.0}  # 16 s a step
NOTHING_ALGORITHMS = ["drop", "salf", "fedprox", "fednova", "scaffold", "feddyn", "fedvarp", "mifa",
                      "u-fedavg", "fedstale"]  # fmt: skip
NEVER_TRAINS: list[tuple[str, dict]] = [
    ("an energy budget below the first round's", {"run": {"energy_budget": 1e-9}}),
    *(
        (
            f"{name}: every step longer than the deadline",
            {"system": PER_STEP_SLOW, "algorithm": {"name": name}},
        )
        for name in NOTHING_ALGORITHMS
    ),
    *(
        (
            f"{name}: exponential, deadline far below a layer",
            {
                "system": {"model": "exponential", "time_per_sample_layer": 50.0, "deadline": 0.001},
                "algorithm": {"name": name},
            },
        )  # fmt: skip
        for name in NOTHING_ALGORITHMS
    ),
    *(
        (
            f"{name}: every client a straggler",
            {"system": {"model": "straggler-ratio", "straggler_ratio": 1.0}, "algorithm": {"name": name}},
        )  # fmt: skip
        for name in ("drop", "fedvarp", "mifa", "u-fedavg", "fedstale")
    ),
    *(
        (
            f"{name}: participation 1e-9",
            {
                "system": {
                    "model": "full",
                    "participation": "uniform",
                    "participation_low": 1e-9,
                    "participation_high": 1e-9,
                },
                "algorithm": {"name": name},
            },
        )  # fmt: skip
        for name in ("fedavg", "salf", "drop", "fedstale", "fedvarp")
    ),
    *(
        (
            f"time budget {budget} below one round of {deadline}",
            {
                "run": {"time_budget": budget, "rounds": 10},
                "system": {"model": "full", "deadline": deadline},
                "algorithm": {"name": "drop"},
            },
        )  # fmt: skip
        for budget, deadline in ((0.5, 1.0), (1e-9, 1.0), (0.99, 1.0), (2.0, 3.0))
    ),
    *(
        (
            f"amsfl budget {budget} below the communication time",
            {
                "system": {"model": "per-step", "time_per_sample_step": 0.01, "comm_time": 1.0},
                "algorithm": {"name": "amsfl", "round_budget": budget},
            },
        )  # fmt: skip
        for budget in (0.5, 2.0, 3.99, 1e-6)
    ),
    *(
        (
            f"client evaluation holding out nothing ({fraction})",
            {"run": {"client_eval": True, "client_eval_fraction": fraction}},
        )  # fmt: skip
        for fraction in (1e-6, 1e-4, 0.001)
    ),
    *(
        (
            f"label swap that swaps nothing ({fraction})",
            {"data": {"partition": "label-swap", "swap_fraction": fraction}},
        )  # fmt: skip
        for fraction in (1e-6, 0.001, 0.01)
    ),
]

# calibration files (system.measured_times): name -> JSON text
MEASURED_FILES: dict[str, str] = {
    "times of Infinity": '{"batch_size": 8, "forward": [Infinity, 0.001], "backward": [0.001, 0.001]}',
    "times of NaN": '{"batch_size": 8, "forward": [NaN, 0.001], "backward": [0.001, 0.001]}',
    "a negative time": '{"batch_size": 8, "forward": [-0.001, 0.001], "backward": [0.001, 0.001]}',
    "batch_size true": '{"batch_size": true, "forward": [0.001, 0.001], "backward": [0.001, 0.001]}',
    "batch_size a string": '{"batch_size": "8", "forward": [0.001, 0.001], "backward": [0.001, 0.001]}',
    "a time that is a string": '{"batch_size": 8, "forward": ["1", 0.001], "backward": [0.001, 0.001]}',
    "a time that is true": '{"batch_size": 8, "forward": [true, 0.001], "backward": [0.001, 0.001]}',
    "one layer missing": '{"batch_size": 8, "forward": [0.001], "backward": [0.001, 0.001]}',
    "forward a number": '{"batch_size": 8, "forward": 0.001, "backward": [0.001, 0.001]}',
    "every time zero": '{"batch_size": 8, "forward": [0, 0], "backward": [0, 0]}',
    "a JSON list": "[0.001, 0.001]",
    "truncated JSON": '{"batch_size": 8, "forward": [0.0',
}

# availability traces (4 clients): name -> text
TRACE_FILES: dict[str, str] = {
    "overlapping intervals": "0-10 5-20\n*\n*\n*\n",
    "an interval past the period": "# period: 10\n0-5 8-12\n*\n*\n*\n",
    "touching then overlapping": "0-5 5-9 8-12\n*\n*\n*\n",
    "nobody ever online": "-\n-\n-\n-\n",
    "three clients for four": "*\n*\n*\n",
    "an interval backwards": "5-2\n*\n*\n*\n",
}

# FedScale pickles given to `fedhet trace`: name -> client_behave_trace
FEDSCALE: dict[str, dict] = {
    "finish_time None": {0: {"active": [0.0], "inactive": [5.0], "finish_time": None}},
    "finish_time a string": {0: {"active": [0.0], "inactive": [5.0], "finish_time": "soon"}},
    "finish_time NaN": {0: {"active": [0.0], "inactive": [5.0], "finish_time": math.nan}},
    "finish_time infinite": {0: {"active": [0.0], "inactive": [5.0], "finish_time": math.inf}},
    "finish_time 0": {0: {"active": [0.0], "inactive": [5.0], "finish_time": 0}},
    "a negative active time": {0: {"active": [-3.0], "inactive": [5.0], "finish_time": 10.0}},
    "an infinite inactive time": {0: {"active": [0.0], "inactive": [math.inf], "finish_time": 10.0}},
    "active a number": {0: {"active": 1.0, "inactive": [5.0], "finish_time": 10.0}},
}

# experiment files whose cases clash with their grid or name no key
CASE_CLASHES: list[tuple[str, dict]] = [
    ("a case key the grid also sets", {"cases": [{"run.seed": 3}]}),
    (
        "a case table the grid also sets",
        {
            "grid": {"algorithm": [{"name": "salf"}, {"name": "drop"}]},
            "cases": [{"algorithm.name": "fedavg"}],
        },
    ),  # fmt: skip
    ("a case key without a section", {"cases": [{"lr": 0.1}]}),
    ("a case key of no section", {"cases": [{"trian.lr": 0.1}]}),
    ("a case value out of range", {"cases": [{"train.lr": -1.0}]}),
    ("a case value of the wrong type", {"cases": [{"train.batch_size": "eight"}]}),
]


def _write(path: Path, document: dict) -> None:
    path.write_text(tomli_w.dumps(document))


def _merge(base: dict, change: dict) -> dict:
    out = {k: dict(v) if isinstance(v, dict) else v for k, v in base.items()}
    for section, values in change.items():
        if isinstance(values, dict) and isinstance(out.get(section), dict):
            out[section] = {**out[section], **values}
        else:
            out[section] = values
    return out


def cases(tmp: Path):
    """(label, argv) pairs, each an invalid invocation."""
    n = 0

    def config(document: dict) -> str:
        nonlocal n
        n += 1
        path = tmp / f"c{n}.toml"
        _write(path, document)
        return str(path)

    for dotted, values in RANGES.items():
        section, key = dotted.split(".")
        for value in values:
            if value is None:
                continue
            if isinstance(value, float) and not math.isfinite(value):
                # TOML writes nan/inf natively
                doc = _merge(BASE, {section: {key: value}})
            else:
                doc = _merge(BASE, {section: {key: value}})
            if section == "system" and key.startswith("capabilit") and key != "capability_profile":
                profile = {
                    "capabilities": "list",
                    "capability_mu": "lognormal",
                    "capability_sigma": "lognormal",
                }
                doc["system"]["capability_profile"] = profile.get(key, "uniform")
            if key.startswith("participation_"):
                doc["system"]["participation"] = {
                    "participation_min": "two-group",
                    "participation_probs": "list",
                }.get(key, "uniform")
            if key == "lr_rho_c" or key == "lr_gamma":
                doc["train"]["lr_schedule"] = "salf-theorem"
            if key in ("lr_milestones", "lr_decay"):
                doc["train"]["lr_schedule"] = "step"
            if key.startswith("swap_") and key != "swap_pairs":
                doc["data"]["partition"] = "label-swap"
            if key == "alpha":
                doc["data"]["partition"] = "dirichlet"
            if key == "shards_per_client":
                doc["data"]["partition"] = "shards"
            if key == "time_per_sample_layer":
                doc["system"]["model"] = "exponential"
            if key in ("time_per_sample_step", "comm_time", "step_jitter"):
                doc["system"]["model"] = "per-step"
            if key == "label_mode":
                doc["data"]["dataset"] = "nsl-kdd"
            yield f"{dotted} = {value!r:.40}", ["run", config(doc)]
    for label, change in EXTRA:
        yield label, ["run", config(_merge(BASE, change))]
    for algorithm in ALGORITHM_BAD:
        doc = _merge(BASE, {"algorithm": algorithm})
        if algorithm.get("name") == "adel-fl":
            doc["system"] = {"model": "exponential", "deadline": 0.0}
            doc["run"]["time_budget"] = 10.0
        if algorithm.get("name") == "amsfl":
            doc["system"] = {"model": "per-step"}
        yield f"algorithm {algorithm}", ["run", config(doc)]
    for label, content in FILES:
        path = tmp / f"file{n}-{len(label)}.toml"
        n += 1
        if content is None:
            path.mkdir()
        else:
            path.write_bytes(content)
        yield f"config: {label}", ["run", str(path)]
    yield "config: missing file", ["run", str(tmp / "missing.toml")]
    yield "config: /dev/null", ["run", os.devnull]
    good = config(BASE)
    blocker = tmp / "a-file"
    blocker.write_text("x")
    yield "--out is a file", ["run", good, "--out", str(blocker)]
    yield "--out below a file", ["run", good, "--out", str(blocker / "sub")]
    yield "--out /dev/null", ["run", good, "--out", os.devnull]
    yield "--set without =", ["run", good, "--set", "run.rounds"]
    yield "--set a.b.c", ["run", good, "--set", "a.b.c=1"]
    yield "--set bad value", ["run", good, "--set", "run.rounds=abc"]
    yield "--set unknown key", ["run", good, "--set", "run.roundz=3"]
    yield "--resume with fewer rounds", ["__resume_fewer__", good]
    for label, change in EXTREMES:
        yield f"extreme: {label}", ["run", config(_merge(BASE, change))]
    for label, change in EXPERIMENTS:
        doc = _merge(BASE, {"grid": {"run.seed": [1, 2]}})
        doc = _merge(doc, change)
        yield f"experiment: {label}", ["reproduce", config(doc), "--list"]
    for label, change in CASE_CLASHES:
        doc = _merge(_merge(BASE, {"grid": {"run.seed": [1, 2]}}), change)
        yield f"experiment: {label}", ["reproduce", config(doc), "--list"]
    for label, change in NEVER_TRAINS:
        yield f"never trains: {label}", ["run", config(_merge(BASE, change))]
    yield from _file_cases(tmp, config)
    yield from _tune_cases(tmp, config)
    yield from _damaged_folders(tmp, config(BASE))
    yield from _last_wave(tmp, config)


def _always_raises():
    """A FedAvg whose aggregate raises (every trial of a tune fails)."""
    from fedhet.algorithms.fedavg import FedAvg

    class Raising(FedAvg):
        def aggregate(self, params, buffers, updates, state, context, layout):
            raise RuntimeError("boom in aggregate")

    return Raising


AlwaysRaises = _always_raises()


def _wrong_size():
    """A FedAvg whose aggregate returns five values too many (named at round 1)."""
    import torch

    from fedhet.algorithms.fedavg import FedAvg

    class WrongSize(FedAvg):
        def aggregate(self, params, buffers, updates, state, context, layout):
            new_params, new_buffers = super().aggregate(params, buffers, updates, state, context, layout)
            return torch.cat([new_params, torch.zeros(5)]), new_buffers

    return WrongSize


WrongSize = _wrong_size()

TUNE_SPACES = {
    "misspelt key": {"params": {"train.lrr": {"low": 0.01, "high": 0.1}}},
    "an algorithm's own key shared by a [compare]": {"params": {"algorithm.mu": {"low": 0.01, "high": 0.1}}},
    "[algorithm_params] of an algorithm not tuned": {
        "params": {"train.lr": {"low": 0.01, "high": 0.1}},
        "algorithm_params": {"fedprx": {"algorithm.mu": {"low": 0.01, "high": 0.1}}},
    },
    "int range of floats": {"params": {"train.local_steps": {"low": 1.5, "high": 4, "int": True}}},
    "a choice the configuration refuses": {"params": {"train.batch_size": {"choices": [8, 0]}}},
}


def _tune_cases(tmp: Path, config):
    """Search spaces refused before trial 0, tuning on the test set, a study whose trials
    all fail (it stops after 3)."""
    import importlib.util

    if importlib.util.find_spec("optuna") is None:
        return
    tuned = _merge(BASE, {"data": {"validation_fraction": 0.2}})
    compared = {**tuned, "compare": {"algorithms": ["fedavg", "fedprox"]}, "algorithm": {"name": "fedavg"}}
    for index, (label, space) in enumerate(TUNE_SPACES.items()):
        path = tmp / f"space{index}.toml"
        _write(path, space)
        base = compared if "compare" in label else tuned
        yield f"tune: {label}", ["tune", config(base), "--space", str(path), "--trials", "2",
                                 "--out", str(tmp / f"tune{index}"), "--quiet"]  # fmt: skip
    good = tmp / "space-good.toml"
    _write(good, {"params": {"train.lr": {"low": 0.01, "high": 0.1}}})
    yield "tune: on the test set, not asked", ["tune", config(BASE), "--space", str(good), "--trials", "1",
                                               "--out", str(tmp / "tune-test"), "--quiet"]  # fmt: skip
    for name in ("AlwaysRaises", "WrongSize"):
        yield (
            f"run: plug-in {name}",
            ["run", config(_merge(BASE, {"algorithm": {"name": f"bad_configs:{name}"}}))],
        )
    failing = _merge(tuned, {"algorithm": {"name": "bad_configs:AlwaysRaises"}})
    yield "tune: every trial fails", ["tune", config(failing), "--space", str(good), "--trials", "5",
                                      "--out", str(tmp / "tune-fails"), "--quiet"]  # fmt: skip


def _storage_cases(tmp: Path, config):
    """``tune --storage`` URLs Optuna cannot use: each one line before any trial."""
    import sqlite3

    (tmp / "noise.db").write_bytes(bytes(range(256)) * 8)
    other = sqlite3.connect(tmp / "other.db")
    other.execute("create table users (id integer)")
    other.commit()
    other.close()
    (tmp / "storage-blocker").write_text("x")
    urls = {
        "text that is not a URL": "not a url",
        "an unknown scheme": "nosuch://host/db",
        "a missing driver": "mysql://user@localhost/db",
        "in memory": "sqlite:///:memory:",
        "a SQLite file below a file": f"sqlite:///{tmp / 'storage-blocker' / 'study.db'}",
        "a file of random bytes": f"sqlite:///{tmp / 'noise.db'}",
        "another program's database": f"sqlite:///{tmp / 'other.db'}",
        "a folder as the file": f"sqlite:///{tmp}",
    }
    space = tmp / "space-storage.toml"
    _write(space, {"params": {"train.lr": {"low": 0.01, "high": 0.1}}})
    tuned = config(_merge(BASE, {"data": {"validation_fraction": 0.2}}))
    for index, (label, url) in enumerate(urls.items()):
        out = str(tmp / f"tune-storage{index}")
        argv = ["tune", tuned, "--space", str(space), "--trials", "1", "--storage", url, "--out", out]
        yield f"tune --storage: {label}", [*argv, "--quiet"]


LR_SPACE = {"params": {"train.lr": {"low": 0.01, "high": 0.1}}}
QUADRATIC_MATRICES = [[[1.0, "0"], [0.0, 0.3]], [[0.3, 0.0], [0.0, 1.0]]]


def _regression_cases(tmp: Path, config):
    """An accuracy objective on a regression (tune, bench) and suites with a bad seed or
    target: each refused before anything runs."""
    import re

    regression = {
        "data": {"dataset": "diabetes", "validation_fraction": 0.2},
        "algorithm": {"name": "fedavg"},
    }
    space = tmp / "space-accuracy.toml"
    _write(space, {"objective": {"value": "final_test_accuracy"}, **LR_SPACE})
    out = str(tmp / "tune-reg")
    argv = ["tune", config(_merge(BASE, regression)), "--space", str(space), "--trials", "1", "--out", out]
    yield "tune: accuracy objective on a regression", [*argv, "--quiet"]
    smoke = (Path(__file__).resolve().parents[1] / "suites" / "smoke.toml").read_text()
    diabetes = smoke.replace('dataset = "digits"', 'dataset = "diabetes"')
    suites = {
        "a seed no run accepts": re.sub(r"(?m)^seeds = 3$", "seeds = [1, -1]", smoke),
        "target = true": re.sub(r"(?m)^target = 0.7$", "target = true", smoke),
        "accuracy objective on a regression": diabetes.replace(
            'partition = "dirichlet"', 'partition = "iid"'
        ),
        "a selection without a rule": smoke + "\n[selections.uni]\nclients_per_round = 3\n",
        "a selection's bad option": smoke + '\n[selections.uni]\nrule = "uniform"\nclients_per_round = 0\n',
        "a selection rule that does not exist": smoke + '\n[selections.x]\nrule = "oortt"\n',
        "a selection that is no table": smoke + "\n[selections]\nuni = 3\n",
        "a selection named like no folder": smoke + '\n[selections."a/b"]\nrule = "uniform"\n',
    }
    for index, (label, text) in enumerate(suites.items()):
        path = tmp / f"suite{index}.toml"
        path.write_text(text)
        seeds = [] if "seed" in label else ["--seeds", "1"]  # the suite's own seeds, where they are the case
        argv = ["bench", str(path), "--trials", "1", *seeds, "--out", str(tmp / f"bench{index}")]
        yield f"bench: {label}", [*argv, "--quiet"]


def _leaf_folder(root: Path, test_users: dict) -> str:
    """A LEAF folder: one good training user, the given test users."""
    import json

    for split, users in (("train", {"a": ([[0.0, 1.0], [1.0, 0.0]], [0, 1])}), ("test", test_users)):
        (root / split).mkdir(parents=True, exist_ok=True)
        document = {
            "users": list(users),
            "num_samples": [len(y) for _, y in users.values()],
            "user_data": {u: {"x": x, "y": y} for u, (x, y) in users.items()},
        }
        (root / split / "all.json").write_text(json.dumps(document))
    return str(root)


def _last_wave(tmp: Path, config):
    """The features of the last wave under bad input: storage URLs, a regression judged by
    accuracy, device names a file cannot hold, suites with a bad seed or target, quadratic
    entries that are no numbers, LEAF folders without examples or features."""
    import importlib.util

    if importlib.util.find_spec("optuna") is not None:
        yield from _storage_cases(tmp, config)
        yield from _regression_cases(tmp, config)
    for index, name in enumerate(("#7", "a\nb", "   ")):
        path = tmp / f"devices{index}.pkl"
        capacities = {
            1: {"computation": 20.0, "communication": 800.0},
            name: {"computation": 5.0, "communication": 90.0},
        }
        path.write_bytes(pickle.dumps(capacities))
        yield f"devices: a name {name!r}", ["devices", str(path), "--out", str(tmp / f"devices{index}.csv")]
    quadratic = {"dataset": "quadratic", "partition": "natural", "num_clients": 2, "fraction": 1.0}
    entries = (("a boolean optimum", "quadratic_optima", [[5.0, True], [-3.0, 6.0]]),
               ("a text matrix entry", "quadratic_matrices", QUADRATIC_MATRICES))  # fmt: skip
    for label, key, value in entries:
        doc = _merge(BASE, {"data": {**quadratic, key: value}, "algorithm": {"name": "fedavg"}})
        doc["model"] = {"name": "linear"}
        yield f"quadratic: {label}", ["run", config(doc)]
    leaves = (
        ("a split without examples", {"b": ([], [])}),
        ("examples without features", {"b": ([[], []], [0, 1])}),
    )
    for index, (label, test_users) in enumerate(leaves):
        folder = _leaf_folder(tmp / f"leaf{index}", test_users)
        data = {"dataset": "leaf", "data_dir": folder, "partition": "natural", "num_clients": 1}
        yield f"leaf: {label}", ["run", config(_merge(BASE, {"data": data}))]


POWER_FILES = {  # device-profile files whose power columns are not watts
    "negative compute_watts": "device,compute,upload,download,compute_watts\na,0.01,1e6,1e6,-2\n",
    "idle_watts not a number": "device,compute,upload,download,idle_watts\na,0.01,1e6,1e6,low\n",
    "upload_watts infinite": "device,compute,upload,download,upload_watts\na,0.01,1e6,1e6,inf\n",
    "a power column misspelt": "device,compute,upload,download,compute_wats\na,0.01,1e6,1e6,2\n",
    "a power column twice": "device,compute,upload,download,idle_watts,idle_watts\na,0.01,1e6,1e6,1,2\n",
    "a power draw of a gigawatt": "device,compute,upload,download,compute_watts\na,0.01,1e6,1e6,1e9\n",
}


def _file_cases(tmp: Path, config):
    """Calibration files, traces, FedScale pickles and outputs that cannot be written."""
    for index, (label, text) in enumerate(MEASURED_FILES.items()):
        path = tmp / f"times{index}.json"
        path.write_text(text)
        doc = _merge(BASE, {"system": {"model": "measured", "measured_times": str(path)}})
        yield f"measured times: {label}", ["run", config(doc)]
    for index, (label, text) in enumerate(TRACE_FILES.items()):
        path = tmp / f"trace{index}.txt"
        path.write_text(text)
        system = {"model": "full", "availability": "trace", "availability_trace": str(path)}
        doc = _merge(BASE, {"system": system, "algorithm": {"name": "fedavg"}})
        yield f"trace: {label}", ["run", config(doc)]
        failures = {"model": "full", "dropout": "trace", "dropout_trace": str(path)}
        doc = _merge(BASE, {"system": failures, "algorithm": {"name": "fedavg"}})
        yield f"dropout trace: {label}", ["run", config(doc)]
    for index, (label, text) in enumerate(POWER_FILES.items()):
        path = tmp / f"devices{index}.csv"
        path.write_text(text)
        system = {"model": "per-step", "capability_profile": "devices", "device_profiles": str(path)}
        yield f"device power: {label}", ["run", config(_merge(BASE, {"system": system}))]
    for index, (label, trace) in enumerate(FEDSCALE.items()):
        path = tmp / f"fedscale{index}.pkl"
        path.write_bytes(pickle.dumps(trace))
        yield f"fedscale: {label}", ["trace", str(path), "--out", str(tmp / f"converted{index}.txt")]
    blocker = tmp / "blocker-file"
    blocker.write_text("x")
    good = config(BASE)
    yield "calibrate --out into a missing folder", ["calibrate", good, "--out", str(tmp / "no" / "t.json")]
    yield "calibrate --out below a file", ["calibrate", good, "--out", str(blocker / "t.json")]
    yield "calibrate --out a folder", ["calibrate", good, "--out", str(tmp)]
    valid = tmp / "fedscale-valid.pkl"
    valid.write_bytes(pickle.dumps({0: {"active": [0.0], "inactive": [5.0], "finish_time": 10.0}}))
    yield "trace --out below a file", ["trace", str(valid), "--out", str(blocker / "t.txt")]


def _damaged_folders(tmp: Path, good: str):
    """A finished run, copied and damaged once per case, given to the commands that read run
    folders (run --resume, compare, plot, report)."""
    import torch

    from fedhet.cli import main

    finished = tmp / "finished-run"
    with contextlib.redirect_stderr(io.StringIO()), contextlib.redirect_stdout(io.StringIO()):
        main(["run", good, "--out", str(finished), "--quiet"])
    saved = torch.load(finished / "checkpoint.pt", weights_only=False)
    count = {"n": 0}

    def copy() -> Path:
        count["n"] += 1
        target = tmp / f"damaged{count['n']}"
        shutil.copytree(finished, target)
        return target

    resume = ["--resume", "--set", "run.rounds=2"]

    def checkpoint(label: str, content) -> tuple[str, list[str]]:
        run = copy()
        torch.save(content, run / "checkpoint.pt")
        return f"damaged run: checkpoint {label}", ["run", good, "--out", str(run), *resume]

    yield checkpoint("is a list", [1, 2])
    yield checkpoint("is a string", "checkpoint")
    yield checkpoint("is a tensor", torch.zeros(3))
    for key in list(saved):
        if key in ("system", "engine", "server", "evaluating", "stopped_by_callback"):  # optional keys
            continue
        yield checkpoint(f"without {key!r}", {k: v for k, v in saved.items() if k != key})
    for key, value in (("round", "1"), ("round", 1.5), ("sim_time", "x"), ("params", [0.0]),
                       ("metrics", {}), ("config", []), ("client_states", None), ("stopped_by", 3),
                       ("params", torch.zeros(7)), ("params", torch.zeros(2, 2)),
                       ("params", torch.zeros(5, dtype=torch.int64)), ("metrics", [])):  # fmt: skip
        yield checkpoint(f"with {key} = {str(value)[:20]!r}", {**saved, key: value})
    yield checkpoint("of an older format", {**saved, "version": 1})
    for name in ("checkpoint.pt", ".lock", "metrics.csv", "summary.json"):
        run = copy()
        target = run / name
        if target.exists():
            target.unlink()
        target.mkdir()
        yield f"damaged run: {name} is a folder", ["run", good, "--out", str(run), *resume]
    run = copy()
    (run / "checkpoint.pt").unlink()
    yield (
        "damaged run: --resume without a checkpoint but with rows",
        ["run", good, "--out", str(run), *resume],
    )
    metrics = {
        "not UTF-8": b"round,sim_time\n1,\xff\n",
        "a word for a number": b"round,sim_time\n1,abc\n",
        "no round column": b"sim_time\n1.0\n",
        "a ragged row": b"round,sim_time\n1,2,3\n",
        "rows of another run": b"round,sim_time\n1,99.5\n",
        "more rows than the checkpoint": b"round,sim_time\n"
        + b"".join(f"{i},{i}.0\n".encode() for i in range(1, 9)),
    }
    for label, content in metrics.items():
        readers = (
            ("resume",)
            if label in ("rows of another run", "more rows than the checkpoint")
            else ("resume", "plot", "report")
        )
        for command in readers:
            run = copy()
            (run / "metrics.csv").write_bytes(content)
            if command == "resume":
                argv = ["run", good, "--out", str(run), *resume]
            else:
                argv = [command, str(run), "--out", str(tmp / f"out{count['n']}" / "x")]
            yield f"damaged run: metrics.csv {label} ({command})", argv
    summaries = {
        "truncated": b'{"name": "bad", "rou',
        "a list": b"[]",
        "empty": b"{}",
        "not UTF-8": b"\xff{}",
    }
    for label, content in summaries.items():
        for command in ("compare", "plot", "report"):
            run = copy()
            (run / "summary.json").write_bytes(content)
            out = [] if command == "compare" else ["--out", str(tmp / f"out{count['n']}" / "x")]
            yield f"damaged run: summary.json {label} ({command})", [command, str(run), *out]
    run = copy()
    header = (run / "metrics.csv").read_text().splitlines()[0]
    (run / "metrics.csv").write_text(header + "\n")
    yield "damaged run: header-only metrics.csv (plot)", ["plot", str(run), "--out", str(tmp / "hdr" / "x")]
    blocker = tmp / "plot-blocker"
    blocker.write_text("x")
    yield "plot --out below a file", ["plot", str(finished), "--out", str(blocker / "x")]
    yield "report --out below a file", ["report", str(finished), "--out", str(blocker / "page.html")]


class _Timeout(Exception):
    pass


def _alarm(signum, frame):  # pragma: no cover - only on a hang
    raise _Timeout()


def run_case(argv: list[str], tmp: Path, index: int, extreme: bool = False) -> tuple[str, str]:
    from fedhet.cli import main

    out_args = []
    if argv[0] == "run" and "--out" not in argv:
        out_args = ["--out", str(tmp / "runs" / f"r{index}")]
    if argv[0] == "__resume_fewer__":
        out = str(tmp / "runs" / f"r{index}")
        with contextlib.redirect_stderr(io.StringIO()), contextlib.redirect_stdout(io.StringIO()):
            main(["run", argv[1], "--out", out, "--quiet", "--set", "run.rounds=2"])
        argv = ["run", argv[1], "--out", out, "--resume", "--set", "run.rounds=1"]
    err = io.StringIO()
    signal.signal(signal.SIGALRM, _alarm)
    signal.alarm(60)
    try:
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
            code = main([*argv, *out_args, *(["--quiet"] if argv[0] == "run" else [])])
    except _Timeout:
        return "tracebacks", "hung for 60 s"
    except SystemExit as exc:  # argparse
        code = exc.code
    except BaseException:
        return "tracebacks", traceback.format_exc(limit=3).strip().splitlines()[-1]
    finally:
        signal.alarm(0)
    lines = [line for line in err.getvalue().splitlines() if line.strip()]
    errors = [line for line in lines if line.startswith("fedhet: error:")]
    if extreme and code in (0, 1):
        return "ran", lines[-1] if lines else ""
    if code == 0:
        return "accepted", err.getvalue().strip()[-200:]
    if code == 2 and len(errors) == 1 and len(lines) == 1:
        return "rejected", errors[0]
    if code == 2 and errors:
        return "noisy", " | ".join(lines)[:300]
    return "tracebacks", f"exit {code}: " + " | ".join(lines)[-300:]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--verbose", action="store_true", help="print every case and its outcome")
    args = parser.parse_args()
    import torch

    torch.set_num_threads(1)
    counts = {"rejected": 0, "tracebacks": 0, "accepted": 0, "noisy": 0}
    extremes = {"ran": 0, "rejected": 0, "tracebacks": 0, "noisy": 0}
    failures = []
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        for index, (label, argv) in enumerate(cases(tmp)):
            extreme = label.startswith("extreme:")
            outcome, message = run_case(argv, tmp, index, extreme)
            (extremes if extreme else counts)[outcome] += 1
            fine = outcome in (("ran", "rejected") if extreme else ("rejected",))
            if args.verbose or not fine:
                print(f"{outcome:<10} {label}: {message}")
            if not fine:
                failures.append(label)
    print(
        f"{sum(extremes.values())} extreme valid inputs: {extremes['ran']} ran (or stopped on a "
        f"non-finite value), {extremes['rejected']} refused with one line, "
        f"{extremes['tracebacks']} tracebacks"
    )
    print(
        f"{sum(counts.values())} invalid inputs: {counts['rejected']} rejected with one line, "
        f"{counts['tracebacks']} tracebacks, {counts['accepted']} accepted silently, "
        f"{counts['noisy']} rejected with extra output"
    )
    return 0 if not failures else 1


if __name__ == "__main__":
    sys.exit(main())
