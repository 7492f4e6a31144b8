"""Goal: on pfl-research's own CIFAR-10 benchmark shape, fedhet's FedAvg runs >= 1.5x the
rounds per second of pfl's simulated backend, on this CPU, both using both cores.

The shape (pfl-research's image-classification benchmark, "cifar10_iid" with "simple_cnn"):
1,000 clients x 50 images, a cohort of 50 clients per round, 5 local SGD steps of batch 10
(one epoch), local lr 0.1, server lr 1.0, the whole test set evaluated every 10 rounds. Both
frameworks train the same network (fedhet's ``simple-cnn``: pfl's simple_cnn without its
dropout) on the same tensors split the same way (fedhet's loader and IID split, handed to
pfl as per-user slices); each times its rounds after the first, evaluations included.

Data: ``--data cifar10`` reads CIFAR-10's python batches from ``--cifar-dir``; without it,
random images of the same shape written in that format (timing only: nothing to learn).
``--data fmnist`` runs both on real Fashion-MNIST (1,000 clients x 60 images) to check that
they learn the same before their speeds are compared.

Needs the benchmark extra: pip install -e ".[pfl]"   (pfl[pytorch], pinned)

Both sides use both cores, each in its best configuration, chosen by measurement first
(alternated blocks): pfl-research as one process with two torch threads, or as two
processes of one thread under ``torchrun`` (pfl's own distributed simulation: each rank
trains part of the cohort, gloo all-reduce); fedhet with ``run.workers = 1`` and two
threads, or ``run.workers = 2``. Each block is one run in a fresh child process; its figure
is the time per round after the first. Blocks alternate (A B, B A, ...); the ratio is the
median of the per-pair ratios.

    python benchmarks/pfl_research.py                     # 5 pairs of 11-round blocks
    python benchmarks/pfl_research.py --data fmnist --rounds 50 --pairs 1
    python benchmarks/pfl_research.py --memory-format channels_last
"""

from __future__ import annotations

import argparse
import os
import pickle
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import machine_header, with_workers  # noqa: E402

CLIENTS, COHORT, BATCH, STEPS, LR, EVAL_EVERY = 1000, 50, 10, 5, 0.1, 10


def synthetic_cifar(folder: Path, seed: int = 0) -> Path:
    """Random 32x32x3 images and labels in CIFAR-10's python-batch format."""
    rng = np.random.default_rng(seed)
    folder.mkdir(parents=True, exist_ok=True)
    names = [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"]
    for name in names:
        batch = {b"data": rng.integers(0, 256, (10_000, 3072), dtype=np.uint8),
                 b"labels": rng.integers(0, 10, 10_000).tolist()}  # fmt: skip
        with open(folder / name, "wb") as out:
            pickle.dump(batch, out)
    return folder


def fedhet_config(
    data: str, data_dir: str, rounds: int, threads: int, seed: int, memory_format: str = "contiguous"
):
    from fedhet.config import from_dict

    return from_dict(
        {
            "run": {
                "name": "pfl-shape",
                "seed": seed,
                "rounds": rounds,
                "eval_every": EVAL_EVERY,
                "threads": threads,
                "memory_format": memory_format,
            },
            "data": {"dataset": data, "data_dir": data_dir, "partition": "iid", "num_clients": CLIENTS},
            "model": {"name": "simple-cnn"},
            "train": {"lr": LR, "batch_size": BATCH, "local_steps": STEPS},
            "system": {"model": "full", "participation": "cohort", "cohort_size": COHORT},
            "algorithm": {"name": "fedavg", "server_lr": 1.0},
        }
    )


def run_fedhet(config, out: Path) -> tuple[float, list[tuple[int, float]]]:
    """(seconds per round after the first, [(round, test accuracy)])."""
    from fedhet.engine.loop import RunLoop

    stamps: list[float] = []
    result = RunLoop(config, out, on_round=lambda row: stamps.append(time.perf_counter())).run(overwrite=True)
    accuracy = [
        (int(r["round"]), r["test_accuracy"]) for r in result.metrics if r.get("test_accuracy") is not None
    ]
    return (stamps[-1] - stamps[0]) / (len(stamps) - 1), accuracy


def run_pfl(world, rounds: int, seed: int) -> tuple[float, list[tuple[int, float]]]:
    """The same training on pfl's SimulatedBackend; a callback evaluates every 10 rounds as
    fedhet does (batches of 256, eval mode) and stamps the time."""
    from pfl.aggregate.simulate import SimulatedBackend
    from pfl.aggregate.weighting import WeightByUser
    from pfl.algorithm import FederatedAveraging, NNAlgorithmParams
    from pfl.callback.base import TrainingProcessCallback
    from pfl.data import FederatedDataset
    from pfl.data.sampling import get_user_sampler
    from pfl.hyperparam import NNEvalHyperParams, NNTrainHyperParams
    from pfl.metrics import Metrics, Weighted
    from pfl.model.pytorch import PyTorchModel

    from fedhet.models import build_model

    torch.manual_seed(seed)
    np.random.seed(seed)
    dataset = world.dataset
    network = build_model("simple-cnn", dataset.input_shape, dataset.num_classes)
    with torch.no_grad():  # the same initial weights
        for mine, theirs in zip(network.parameters(), world.flat.model.parameters(), strict=True):
            mine.copy_(theirs)

    def loss(self, x, y, eval=False):
        self.eval() if eval else self.train()
        return F.cross_entropy(self(x), y)

    @torch.no_grad()
    def metrics(self, x, y, eval=True):
        self.eval() if eval else self.train()
        out = self(x)
        return {"loss": Weighted(float(F.cross_entropy(out, y, reduction="sum")), len(y)),
                "accuracy": Weighted(float((out.argmax(1) == y).sum()), len(y))}  # fmt: skip

    network.loss = loss.__get__(network)
    network.metrics = metrics.__get__(network)
    x, y = dataset.x_train, world.train_labels
    users = {u: [x[idx], y[idx]] for u, idx in enumerate(world.client_indices)}
    federated = FederatedDataset.from_slices(users, get_user_sampler("random", list(users)))
    model = PyTorchModel(
        model=network,
        local_optimizer_create=torch.optim.SGD,
        central_optimizer=torch.optim.SGD([p for p in network.parameters() if p.requires_grad], 1.0),
    )
    stamps: list[float] = []
    accuracy: list[tuple[int, float]] = []
    x_test, y_test = dataset.test_features(), dataset.y_test

    class Clock(TrainingProcessCallback):
        def after_central_iteration(self, aggregate_metrics, model, *, central_iteration):
            done = central_iteration + 1
            if done % EVAL_EVERY == 0 or done == rounds:
                network.eval()
                correct = 0
                with torch.no_grad():
                    for start in range(0, len(y_test), 256):
                        correct += int(
                            (
                                network(x_test[start : start + 256]).argmax(1) == y_test[start : start + 256]
                            ).sum()
                        )
                accuracy.append((done, correct / len(y_test)))
            stamps.append(time.perf_counter())
            return False, Metrics()

    FederatedAveraging().run(
        algorithm_params=NNAlgorithmParams(
            central_num_iterations=rounds, evaluation_frequency=EVAL_EVERY, train_cohort_size=COHORT,
            val_cohort_size=0,
        ),
        backend=SimulatedBackend(training_data=federated, val_data=None, postprocessors=[WeightByUser()]),
        model=model,
        model_train_params=NNTrainHyperParams(
            local_learning_rate=LR, local_num_epochs=None, local_num_steps=STEPS, local_batch_size=BATCH
        ),
        model_eval_params=NNEvalHyperParams(local_batch_size=256),
        callbacks=[Clock()],
    )  # fmt: skip
    return (stamps[-1] - stamps[0]) / (len(stamps) - 1), accuracy


def child_block(args) -> int:
    """One block (a child process): one framework's run; prints its JSON last (rank 0)."""
    os.environ.setdefault("PFL_DISABLE_MULTIPROCESSING", "1")
    import json
    import logging

    logging.getLogger("pfl").setLevel(logging.WARNING)
    torch.set_num_threads(args.threads)
    from fedhet.world import build_world

    threads = "auto" if args.threads == 0 else args.threads
    config = with_workers(
        fedhet_config(args.data, args.cifar_dir, args.rounds, threads, args.seed, args.memory_format),
        args.workers,
    )
    with tempfile.TemporaryDirectory(prefix="fedhet-bench-") as tmp:
        if args.side == "pfl":
            world = build_world(config)
            torch.set_num_threads(args.threads)
            per_round, accuracy = run_pfl(world, args.rounds, args.seed)
        else:
            per_round, accuracy = run_fedhet(config, Path(tmp) / "fedhet")
    if int(os.environ.get("RANK", "0")) == 0:
        print(json.dumps({"per_round": per_round, "accuracy": accuracy, "threads": torch.get_num_threads()}))
    return 0


SIDES = {
    # name: (framework, processes, threads per process, fedhet run.workers)
    "pfl 1 process x 2 threads": ("pfl", 1, 2, 1),
    "pfl 2 processes x 1 thread (torchrun, gloo)": ("pfl", 2, 1, 1),
    "fedhet workers 1, 2 threads": ("fedhet", 1, 2, 1),
    "fedhet workers 2 x 1 thread": ("fedhet", 1, 1, 2),
}


def block(side: str, args, data_dir: str, results: dict) -> float:
    """Run one block of ``side`` in a fresh child process; its seconds per round."""
    import json
    import subprocess

    framework, processes, threads, workers = SIDES[side]
    script = [str(Path(__file__).resolve()), "--side", framework, "--threads", str(threads),
              "--workers", str(workers), "--rounds", str(args.rounds), "--data", args.data,
              "--cifar-dir", data_dir, "--seed", str(args.seed),
              "--memory-format", args.memory_format]  # fmt: skip
    if processes > 1:
        launcher = [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--standalone",
            f"--nproc_per_node={processes}",
        ]
        command = launcher + script
    else:
        command = [sys.executable] + script
    env = {**os.environ, "OMP_NUM_THREADS": str(threads), "PFL_DISABLE_MULTIPROCESSING": "1"}
    done = subprocess.run(command, capture_output=True, text=True, env=env, timeout=3600)
    if done.returncode != 0:
        raise RuntimeError(f"{side} failed:\n{done.stderr[-3000:]}")
    figures = json.loads(done.stdout.strip().splitlines()[-1])
    results.setdefault(side, []).append(figures)
    return figures["per_round"]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", choices=["cifar10", "fmnist"], default="cifar10")
    parser.add_argument("--cifar-dir", default="")
    parser.add_argument("--rounds", type=int, default=11, help="rounds per block (the first is not timed)")
    parser.add_argument("--pairs", type=int, default=5)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument(
        "--memory-format",
        choices=["contiguous", "channels_last"],
        default="contiguous",
        help="fedhet's run.memory_format (pfl's model stays contiguous, as pfl builds it)",
    )
    parser.add_argument("--side", choices=["pfl", "fedhet"], help=argparse.SUPPRESS)
    parser.add_argument("--threads", type=int, default=2, help=argparse.SUPPRESS)
    parser.add_argument("--workers", type=int, default=1, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.side:
        return child_block(args)
    from _common import alternate, describe_ratio

    results: dict[str, list] = {}
    with tempfile.TemporaryDirectory(prefix="fedhet-bench-") as tmp:
        data_dir, what = "", "real Fashion-MNIST"
        if args.data == "cifar10":
            data_dir = args.cifar_dir or str(synthetic_cifar(Path(tmp) / "cifar"))
            what = (
                "CIFAR-10 from " + args.cifar_dir
                if args.cifar_dir
                else "synthetic CIFAR-shaped data (timing only)"
            )
        print(
            machine_header(
                f"{what}; {args.rounds} rounds per block; fedhet run.memory_format = {args.memory_format}"
            )
        )

        def side(name):
            return lambda: block(name, args, data_dir, results)

        names = list(SIDES)
        best = {}
        for framework, (a, b) in (("pfl", names[:2]), ("fedhet", names[2:])):
            figures = alternate(side(a), side(b), max(3, args.pairs // 2))
            print(describe_ratio(f"{a} vs {b}, s/round", figures))
            best[framework] = b if figures["median"] > 1 else a
        print(f"best configurations: {best['pfl']}; {best['fedhet']}")
        figures = alternate(side(best["pfl"]), side(best["fedhet"]), args.pairs)
        label = "fedhet vs pfl-research, both on both cores at their best (pfl s/round / fedhet)"
        print(describe_ratio(label, figures))
        print("goal: >= 1.5x")
    for name, runs in results.items():
        accuracy = runs[0]["accuracy"]
        print(f"test accuracy, {name} (first block): " + ", ".join(f"{r}: {a:.3f}" for r, a in accuracy))
    return 0


if __name__ == "__main__":
    sys.exit(main())
