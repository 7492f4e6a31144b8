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

Runs in-process (one digits dataset, 1 round), about a minute on 2 cores.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import math
import os
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
    "run.eval_every": [0, -1, *INTS_BAD],
    "run.threads": [-1, 10**6, *INTS_BAD],
    "run.workers": [0, -1, 10**6, "many", *INTS_BAD],
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
    "train.batch_size": [0, -1, *INTS_BAD],
    "train.local_steps": [0, -1, *INTS_BAD],
    "train.momentum": [1.0, -0.1, *NUMBERS_BAD],
    "train.weight_decay": [-1.0, *NUMBERS_BAD],
    "train.keep_momentum": ["no"],
    "system.model": ["gaussian"],
    "system.deadline": [-1.0, *NUMBERS_BAD],
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
    ("unknown callback", {"run": {"callbacks": [{"name": "tensorboard"}]}}),
    ("callback without a name", {"run": {"callbacks": [{"every": 2}]}}),
    ("algorithm module path not importable", {"algorithm": {"name": "no_such_pkg_xyz.rules:Rule"}}),
    ("algorithm module path without a class", {"algorithm": {"name": "fedhet.algorithms.salf:Nope"}}),
    ("algorithm module path to a non-plug-in", {"algorithm": {"name": "fedhet.errors:ConfigError"}}),
    ("system model module path malformed", {"system": {"model": "fedhet.system:"}}),
    ("unknown dataset", {"data": {"dataset": "imagenet"}}),
    ("unknown model", {"model": {"name": "resnet50"}}),
]

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
    *({"name": "fedprox", "mu": v} for v in (-1.0, NAN, INF)),
    *({"name": "feddyn", "alpha": v} for v in (0.0, NAN, INF)),
    *({"name": "scaffold", "server_lr": v} for v in (0.0, NAN)),
    *({"name": "heterofl", "rates": v} for v in ([0.5], [1.0, 2.0], [1.0, NAN], [], "1", [1.0, True])),
    *({"name": "fedbuff", "buffer_size": v} for v in (0, -1, 100)),
    *({"name": "fedbuff", "max_concurrency": v} for v in (-1, 1.5)),
    {"name": "fedbuff", "server_lr": NAN},
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
