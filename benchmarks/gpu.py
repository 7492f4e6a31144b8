"""fedhet on a GPU: rounds per second against pfl-research on the same device, and the
batched pool against one client at a time.

Goals (issue "fedhet on a GPU"): on pfl-research's CIFAR-10 benchmark shape, fedhet >= 1.5x
pfl's rounds per second; on cnn2, the batched pool >= 5x one client at a time.

1. **pfl-research's benchmark shape** (as benchmarks/pfl_research.py: 1,000 clients x 50
   CIFAR-shaped images, a cohort of 50 per round, 5 local SGD steps of batch 10, lr 0.1,
   ``simple-cnn``, the test set evaluated every 10 rounds). Three sides, each block a fresh
   child process on the GPU: pfl-research's SimulatedBackend (its PyTorch model on the GPU;
   the users' tensors handed to it already there), fedhet with the in-process pool (one
   client at a time) and with the batched pool. Blocks rotate (A B C, B C A, ...); each
   block's figure is its seconds per round after the first; ratios are the medians of the
   per-pass ratios. GPU utilisation: NVML's busy share, sampled every 50 ms during a block.
2. **SALF's Table II workloads** (Sec. IV-A; Fashion-MNIST-shaped 28x28 images): 30 users,
   one local SGD step of batch 16, momentum 0.5 kept per user, SALF at 50% stragglers, for
   cnn2 and the MLP; and cnn2 with 5 local steps of plain SGD. In-process against batched.

Data: random images in CIFAR-10's and MNIST's file formats (timing only: nothing to learn),
unless ``--cifar-dir`` names real CIFAR-10 batches. Needs a CUDA GPU and pfl-research
(``pip install -e ".[pfl]"``; ``--no-pfl`` leaves it out).

    python benchmarks/gpu.py                    # 3 passes of 21-round blocks
    python benchmarks/gpu.py --passes 1 --rounds 6 --no-pfl
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from _common import machine_header, ratio, rotate  # noqa: E402

DEVICE = "cuda"  # --device cpu: the same blocks on the CPU (to try the script; no goal there)


def write_mnist_shaped(folder: Path, n_train: int = 6000, n_test: int = 1000, seed: int = 0) -> Path:
    """Random 28x28 images and labels as the four (uncompressed) IDX files of MNIST."""
    rng = np.random.default_rng(seed)
    folder.mkdir(parents=True, exist_ok=True)

    def idx(path: Path, array: np.ndarray) -> None:
        header = bytes([0, 0, 8, array.ndim]) + b"".join(int(d).to_bytes(4, "big") for d in array.shape)
        path.write_bytes(header + array.astype(np.uint8).tobytes())

    idx(folder / "train-images-idx3-ubyte", rng.integers(0, 256, (n_train, 28, 28)))
    idx(folder / "train-labels-idx1-ubyte", rng.integers(0, 10, n_train))
    idx(folder / "t10k-images-idx3-ubyte", rng.integers(0, 256, (n_test, 28, 28)))
    idx(folder / "t10k-labels-idx1-ubyte", rng.integers(0, 10, n_test))
    return folder


def pfl_shape(data_dir: str, rounds: int, pool: str) -> dict:
    from pfl_research import BATCH, CLIENTS, COHORT, EVAL_EVERY, LR, STEPS

    return {
        "run": {
            "name": "gpu-pfl-shape",
            "seed": 1,
            "rounds": rounds,
            "eval_every": EVAL_EVERY,
            "threads": 4,
            "device": DEVICE,
            "pool": pool,
        },  # fmt: skip
        "data": {"dataset": "cifar10", "data_dir": data_dir, "partition": "iid", "num_clients": CLIENTS},
        "model": {"name": "simple-cnn"},
        "train": {"lr": LR, "batch_size": BATCH, "local_steps": STEPS},
        "system": {"model": "full", "participation": "cohort", "cohort_size": COHORT},
        "algorithm": {"name": "fedavg", "server_lr": 1.0},
    }


def table2(data_dir: str, rounds: int, pool: str, model: str, steps: int = 1, momentum: float = 0.5) -> dict:
    """SALF's Table II setting (benchmarks/_common.TABLE2_CNN) on MNIST-shaped files."""
    return {
        "run": {
            "name": "gpu-table2",
            "seed": 1,
            "rounds": rounds,
            "eval_every": 10,
            "threads": 4,
            "device": DEVICE,
            "pool": pool,
        },  # fmt: skip
        "data": {"dataset": "mnist", "data_dir": data_dir, "partition": "iid", "num_clients": 30},
        "model": {"name": model},
        "train": {
            "lr": 0.1,
            "batch_size": 16,
            "local_steps": steps,
            "momentum": momentum,
            "keep_momentum": momentum > 0,
        },  # fmt: skip
        "system": {"model": "straggler-ratio", "straggler_ratio": 0.5, "deadline": 1.0},
        "algorithm": {"name": "salf"},
    }


def child(args) -> int:
    """One block in this (fresh) process; prints its figures as JSON last."""
    import torch

    torch.set_num_threads(4)
    os.environ.setdefault("PFL_DISABLE_MULTIPROCESSING", "1")
    from fedhet.config import from_dict

    document = json.loads(args.child)
    side = document.pop("side")
    rounds = document["run"]["rounds"]
    with tempfile.TemporaryDirectory(prefix="fedhet-gpu-") as tmp:
        if side == "pfl":
            import logging

            from pfl_research import run_pfl

            from fedhet.world import build_world

            logging.getLogger("pfl").setLevel(logging.WARNING)
            world = build_world(from_dict(document))  # the data on the GPU, handed to pfl there
            per_round, accuracy = run_pfl(world, rounds, 1)
            device = str(world.device)
        else:
            from fedhet.engine.loop import RunLoop

            stamps: list[float] = []
            loop = RunLoop(
                from_dict(document),
                Path(tmp) / "run",
                on_round=lambda row: stamps.append(time.perf_counter()),
            )
            result = loop.run(overwrite=True)
            per_round = (stamps[-1] - stamps[0]) / (len(stamps) - 1)
            accuracy = [
                (int(r["round"]), r["test_accuracy"])
                for r in result.metrics
                if r.get("test_accuracy") is not None
            ]
            device = result.summary["device"]
    print(json.dumps({"per_round": per_round, "accuracy": accuracy[-1:], "device": device}))
    return 0


class Utilisation:
    """NVML's GPU busy share, sampled every 50 ms while a block runs (None without NVML)."""

    def __init__(self):
        try:
            import pynvml

            pynvml.nvmlInit()
            self.nvml, self.handle = pynvml, pynvml.nvmlDeviceGetHandleByIndex(0)
        except Exception:  # noqa: BLE001  (no NVML: no figure)
            self.nvml = self.handle = None

    def during(self, work):
        if self.nvml is None:
            return work(), None
        samples: list[int] = []
        stop = threading.Event()

        def sample():
            while not stop.is_set():
                samples.append(self.nvml.nvmlDeviceGetUtilizationRates(self.handle).gpu)
                time.sleep(0.05)

        thread = threading.Thread(target=sample, daemon=True)
        thread.start()
        try:
            return work(), samples
        finally:
            stop.set()
            thread.join()


def block(document: dict, side: str, results: dict, util: Utilisation) -> float:
    env = {**os.environ, "PFL_DISABLE_MULTIPROCESSING": "1", "PYTHONUNBUFFERED": "1"}
    command = [
        sys.executable,
        str(Path(__file__).resolve()),
        "--child",
        json.dumps({**document, "side": side}),
    ]

    def work():
        return subprocess.run(command, capture_output=True, text=True, env=env, timeout=1800)

    done, samples = util.during(work)
    if done.returncode != 0:
        raise RuntimeError(f"{side} failed:\n{done.stderr[-3000:]}")
    figures = json.loads(done.stdout.strip().splitlines()[-1])
    figures["utilisation"] = statistics.mean(samples) if samples else None
    results.setdefault(side, []).append(figures)
    return figures["per_round"]


def report(
    title: str, sides: dict, passes: int, util: Utilisation, pairs_of: list[tuple[str, str, str]]
) -> None:
    results: dict[str, list] = {}
    runners = {
        name: (lambda d=document, n=name: block(d, n, results, util)) for name, document in sides.items()
    }
    times, before, after = rotate(runners, passes)
    print(f"\n## {title}")
    for name in sides:
        runs = results[name]
        shares = [r["utilisation"] for r in runs if r["utilisation"] is not None]
        busy = f"{statistics.mean(shares):.0f}%" if shares else "n/a"
        middle = statistics.median(times[name])
        blocks = ", ".join(f"{t:.4f}" for t in times[name])
        print(f"{name}: {middle:.4f} s/round (median of {len(runs)} blocks: {blocks}); "
              f"{1 / middle:.1f} rounds/s; GPU busy {busy}; device {runs[0]['device']}; "
              f"last accuracy {runs[0]['accuracy']}")  # fmt: skip
    for label, slow, fast in pairs_of:
        figures = ratio(times[slow], times[fast], (before, after))
        spread = f"passes {figures['min']:.2f}-{figures['max']:.2f}, n={passes}"
        print(f"{label}: {figures['median']:.2f}x ({spread})")


def attempt(section, title: str, *args) -> None:
    """One section; a failure is printed and the next section runs."""
    try:
        section(title, *args)
    except Exception as exc:  # noqa: BLE001
        print(f"\n## {title}\nFAILED: {type(exc).__name__}: {str(exc)[-2000:]}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=21, help="rounds per block (the first is not timed)")
    parser.add_argument("--passes", type=int, default=3, help="passes over the sides, pfl-research's shape")
    parser.add_argument("--table2-passes", type=int, default=3, help="passes, SALF's Table II workloads")
    parser.add_argument("--cifar-dir", default="")
    parser.add_argument("--no-pfl", action="store_true", help="leave pfl-research out")
    parser.add_argument(
        "--sections", default="pfl-shape,table2", help="which: pfl-shape, table2 (comma-separated)"
    )
    parser.add_argument("--device", default="cuda", help="cuda (default) or cpu, to try the script")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        return child(args)
    import torch

    global DEVICE
    DEVICE = args.device
    if DEVICE == "cpu":
        print(machine_header("on the CPU: a trial of the script, not a GPU figure"))
    elif not torch.cuda.is_available():
        print("benchmarks/gpu.py needs a CUDA GPU: torch sees none here")
        return 2
    else:
        print(machine_header(f"GPU {torch.cuda.get_device_name(0)}, CUDA {torch.version.cuda}"))
    util = Utilisation()
    with tempfile.TemporaryDirectory(prefix="fedhet-gpu-") as tmp:
        from pfl_research import synthetic_cifar

        cifar = args.cifar_dir or str(synthetic_cifar(Path(tmp) / "cifar"))
        mnist = str(write_mnist_shaped(Path(tmp) / "mnist"))
        sides = {"fedhet one at a time": pfl_shape(cifar, args.rounds, "in-process"),
                 "fedhet batched": pfl_shape(cifar, args.rounds, "batched")}  # fmt: skip
        pairs = [("batched over one at a time", "fedhet one at a time", "fedhet batched")]
        if not args.no_pfl:
            sides = {"pfl-research": pfl_shape(cifar, args.rounds, "in-process"), **sides}
            pairs += [
                ("fedhet batched over pfl-research (goal >= 1.5x)", "pfl-research", "fedhet batched"),
                ("fedhet one at a time over pfl-research", "pfl-research", "fedhet one at a time"),
            ]
        what = "CIFAR-10 from " + args.cifar_dir if args.cifar_dir else "CIFAR-shaped random images"
        if "pfl-shape" in args.sections:
            attempt(report, f"pfl-research's benchmark shape ({what})", sides, args.passes, util, pairs)
        for title, model, steps, momentum in [
            ("SALF Table II, cnn2 (1 step, momentum 0.5, 50% stragglers)", "cnn2", 1, 0.5),
            ("SALF Table II, MLP (1 step, momentum 0.5, 50% stragglers)", "mlp", 1, 0.5),
            ("cnn2, 5 local steps, plain SGD, 30 users, 50% stragglers", "cnn2", 5, 0.0),
        ]:
            sides = {name: table2(mnist, args.rounds, pool, model, steps, momentum)
                     for name, pool in (("one at a time", "in-process"), ("batched", "batched"))}  # fmt: skip
            goal = " (goal >= 5x)" if model == "cnn2" else ""
            pair = [(f"batched over one at a time{goal}", "one at a time", "batched")]
            if "table2" in args.sections:
                attempt(report, title, sides, args.table2_passes, util, pair)
    return 0


if __name__ == "__main__":
    sys.exit(main())
