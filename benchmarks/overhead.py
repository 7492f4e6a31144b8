"""What a small-model run costs beyond its arithmetic: fedhet's loop time against a plain
PyTorch loop doing the same client steps, and against the arithmetic's lower bound.

Workloads (one torch thread, the run's data already loaded; a fedhet side is a whole run
whose loop time, ``summary.json``'s ``wall_time``, is the figure):
- ``leaderboard``: the heterogeneity leaderboard's run shape (suites/heterogeneity.toml,
  random-50): Fashion-MNIST with 20% held out for validation, 20 Dirichlet(0.5) clients,
  the 25,818-parameter MLP, SALF with half the clients straggling, one SGD step of batch 16,
  a 30-simulated-second budget (150 rounds), evaluation every 10 rounds on the 12,000
  validation images;
- ``table2-cnn2``: SALF's Table II CNN setting (benchmarks/_common.TABLE2_CNN), 30 IID
  clients, cnn2, one step of batch 16 with momentum 0.5, 50% stragglers, 60 rounds,
  evaluation every 10 rounds;
- ``pfl-cifar``: pfl-research's CIFAR-10 benchmark shape (benchmarks/pfl_research.py):
  1,000 IID clients of 50 images, a cohort of 50 a round, FedAvg, 5 local steps of batch 10,
  lr 0.1, its ``simple-cnn``, ``--rounds`` rounds (10 by default), the 10,000 test images
  evaluated every 10 rounds. Its images are random ones written in CIFAR-10's python-batch
  format (the files are not on this machine): timing only, nothing to learn.

The plain loop is what a researcher would write by hand for the same run: per round, the
cohort (every client, or ``cohort_size`` of them drawn without replacement), of which the
straggler share reaches a uniform depth; each client with any layer copies the global
weights into one working model, takes its local steps (plain SGD; truncated
back-propagation below its depth), and its layers' deltas are summed; the server divides
each layer's sum by the clients that reached it (SALF eq. (9) with p_l = 0; FedAvg's equal-
weight mean when nobody straggles); the same evaluation. It uses the same model class,
data tensors and batches of the same size.

The lower bound is the arithmetic at a GEMM rate measured in the same process: forward
2 x multiply-adds per example, backward twice that, over the tasks' local steps' examples
(every task counted whole) and the evaluations.

Sides alternate (A B, B A, ...) for ``--pairs`` pairs; each ratio is fedhet / plain per
pair, reported as the median with its range; the pools are measured in turn.

    python benchmarks/overhead.py --pairs 5
    python benchmarks/overhead.py --workload table2-cnn2 --pools in-process batched
    python benchmarks/overhead.py --workload pfl-cifar --rounds 10
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
import tomllib
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import TABLE2_CNN, alternate, describe_ratio, machine_header  # noqa: E402

LEADERBOARD = {
    "run": {"name": "overhead", "seed": 1, "rounds": 100000, "time_budget": 30.0, "eval_every": 10,
            "threads": 1, "device": "cpu"},
    "data": {"dataset": "fmnist", "partition": "dirichlet", "alpha": 0.5, "num_clients": 20,
             "validation_fraction": 0.2},
    "model": {"name": "mlp"},
    "train": {"batch_size": 16, "local_steps": 1, "lr": 0.1},
    "system": {"model": "straggler-ratio", "deadline": 0.2, "straggler_ratio": 0.5},
    "algorithm": {"name": "salf"},
}  # fmt: skip


def table2() -> dict:
    document = tomllib.loads(TABLE2_CNN)
    document["system"]["straggler_ratio"] = 0.5
    document["run"] = {"name": "overhead", "seed": 1, "rounds": 60, "eval_every": 10, "threads": 1,
                       "device": "cpu"}  # fmt: skip
    document["algorithm"] = {"name": "salf"}
    return document


def pfl_cifar(rounds: int, scratch: Path) -> dict:
    """pfl-research's CIFAR-10 shape (benchmarks/pfl_research.py) on random images written
    in CIFAR-10's format under ``scratch``."""
    from pfl_research import BATCH, CLIENTS, COHORT, EVAL_EVERY, LR, STEPS, synthetic_cifar

    folder = synthetic_cifar(scratch / "cifar-10-batches-py")
    return {
        "run": {"name": "overhead", "seed": 1, "rounds": rounds, "eval_every": EVAL_EVERY, "threads": 1,
                "device": "cpu"},
        "data": {"dataset": "cifar10", "data_dir": str(folder), "partition": "iid", "num_clients": CLIENTS},
        "model": {"name": "simple-cnn"},
        "train": {"lr": LR, "batch_size": BATCH, "local_steps": STEPS},
        "system": {"model": "full", "participation": "cohort", "cohort_size": COHORT},
        "algorithm": {"name": "fedavg", "server_lr": 1.0},
    }  # fmt: skip


WORKLOADS = {
    "leaderboard": lambda rounds, scratch: LEADERBOARD,
    "table2-cnn2": lambda rounds, scratch: table2(),
    "pfl-cifar": pfl_cifar,
}


class FedhetSide:
    """One fedhet run of the workload with ``pool``; its figure is the loop time."""

    runs = 0  # every side's, for fresh folder names

    def __init__(self, document: dict, pool: str, scratch: Path):
        self.document, self.pool, self.scratch = document, pool, scratch
        self.tasks = 0
        self.rounds = 0

    def __call__(self) -> float:
        from fedhet.config import from_dict
        from fedhet.engine.launch import run

        FedhetSide.runs += 1
        document = {k: dict(v) for k, v in self.document.items()}
        document["run"]["pool"] = self.pool
        result = run(from_dict(document), self.scratch / f"{self.pool}-{FedhetSide.runs}")
        self.tasks = sum(int(r["participants"] or 0) for r in result.metrics)
        self.rounds = len(result.metrics)
        return float(result.summary["wall_time"])


class PlainLoop:
    """The hand-written loop of the module's docstring on fedhet's world (the same model,
    data tensors, client index arrays and evaluation set)."""

    def __init__(self, document: dict, rounds: int):
        from fedhet.config import from_dict
        from fedhet.world import build_world

        self.world = build_world(from_dict(document))
        self.rounds = rounds
        self.lr = float(document["train"]["lr"])
        self.batch = int(document["train"]["batch_size"])
        self.eval_every = int(document["run"]["eval_every"])
        self.ratio = float(document["system"].get("straggler_ratio", 0.0))
        self.steps = int(document["train"].get("local_steps", 1))
        cohort = document["system"].get("participation") == "cohort"
        self.cohort = int(document["system"]["cohort_size"]) if cohort else None

    def __call__(self) -> float:
        from fedhet.client.state import ClientData
        from fedhet.data.compact import ByteImages

        world, model = self.world, self.world.flat.model
        layers = model.num_layers
        slices = world.flat.layout.param_slices.bounds
        params = world.initial_params.clone()
        x_test, y_test = world.dataset.test_features(), world.dataset.y_test
        rng = np.random.default_rng(1)
        # a plain loop holds its images as float tensors (fedhet keeps them as bytes)
        x_train = world.dataset.x_train
        features = x_train.decoded() if isinstance(x_train, ByteImages) else x_train
        data = [
            ClientData(features, world.train_labels, world.client_indices[c])
            for c in range(world.num_clients)
        ]
        began = time.perf_counter()
        for t in range(self.rounds):
            cohort = data
            if self.cohort is not None:
                cohort = [data[c] for c in rng.choice(len(data), self.cohort, replace=False)]
            stragglers = rng.random(len(cohort)) < self.ratio
            depths = np.where(stragglers, rng.integers(2, layers + 2, len(cohort)), 1)
            total, counts = torch.zeros_like(params), torch.zeros(layers)
            for c, client in enumerate(cohort):
                if depths[c] > layers:
                    continue
                delta = self._steps(params, client, int(depths[c]), rng)
                total += delta
                counts[int(depths[c]) - 1 :] += 1
            for layer, (start, end) in enumerate(slices):
                if counts[layer] > 0:
                    params[start:end] += total[start:end] / counts[layer]
            if (t + 1) % self.eval_every == 0 or t + 1 == self.rounds:
                world.flat.load(params)  # the global model, evaluated
                self._evaluate(model, params, x_test, y_test)
        return time.perf_counter() - began

    def _steps(self, params, client, depth: int, rng) -> torch.Tensor:
        """Copy the global weights in, the local SGD steps from layer ``depth`` up, the delta
        out."""
        flat = self.world.flat
        flat.load(params)
        trained = flat.parameters_from_depth(depth)
        for _ in range(self.steps):
            x, y = client.batch(rng, self.batch)
            loss = torch.nn.functional.cross_entropy(flat.model(x, depth), y)
            grads = torch.autograd.grad(loss, trained)
            with torch.no_grad():
                for p, g in zip(trained, grads, strict=True):
                    p.add_(g, alpha=-self.lr)
        return flat.params - params

    @staticmethod
    def _evaluate(model, params, x, y) -> float:
        """Accuracy in batches of fedhet's evaluation size (on the MLP 1,024 were 2 ms faster
        an evaluation, on simple-cnn 256 a quarter faster than 1,024)."""
        from fedhet.client.evaluate import EVAL_BATCH

        with torch.no_grad():
            correct = 0
            for start in range(0, len(x), EVAL_BATCH):
                out = model(x[start : start + EVAL_BATCH])
                correct += int((out.argmax(1) == y[start : start + EVAL_BATCH]).sum())
        return correct / len(x)


def gemm_rate(size: int = 512, repeats: int = 50) -> float:
    """Multiply-adds per second of a size x size float32 matrix product on this thread."""
    a, b = torch.randn(size, size), torch.randn(size, size)
    a @ b
    began = time.perf_counter()
    for _ in range(repeats):
        a @ b
    return size**3 * repeats / (time.perf_counter() - began)


def arithmetic_seconds(document: dict, tasks: int, evaluations: int) -> float:
    """The workload's multiply-adds at :func:`gemm_rate`: per task one step of a batch
    (forward, and a backward of twice its cost), per evaluation the evaluation set."""
    from fedhet.config import from_dict
    from fedhet.world import build_world

    world = build_world(from_dict(document))
    per_example = sum(world.layer_multiply_adds) if world.layer_multiply_adds else 0.0
    examples = int(document["train"]["batch_size"]) * int(document["train"].get("local_steps", 1))
    macs = tasks * examples * per_example * 3 + evaluations * len(world.dataset.y_test) * per_example
    return macs / gemm_rate()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workload", choices=sorted(WORKLOADS), default="leaderboard")
    parser.add_argument("--pools", nargs="+", default=["in-process", "batched"])
    parser.add_argument("--pairs", type=int, default=5)
    parser.add_argument("--rounds", type=int, default=10, help="pfl-cifar's rounds (the others' are fixed)")
    args = parser.parse_args()
    torch.set_num_threads(1)
    print(machine_header(f"overhead, {args.workload}, one thread"))
    with tempfile.TemporaryDirectory(prefix="fedhet-overhead-") as folder:
        document = WORKLOADS[args.workload](args.rounds, Path(folder))
        probe = FedhetSide(document, "in-process", Path(folder))
        probe()  # warm-up; the run's shape: tasks and rounds
        plain = PlainLoop(document, probe.rounds)
        evaluations = -(-probe.rounds // int(document["run"]["eval_every"]))
        bound = arithmetic_seconds(document, probe.tasks, evaluations)
        print(f"{probe.rounds} rounds, {probe.tasks} client tasks, {evaluations} evaluations; "
              f"arithmetic lower bound {bound:.3f} s")  # fmt: skip
        for pool in args.pools:
            side = FedhetSide(document, pool, Path(folder))
            figures = alternate(side, plain, args.pairs)
            print(describe_ratio(f"{pool} / plain loop", figures))
            fedhet_s = statistics.median(figures["first"])
            print(f"  {pool}: {fedhet_s:.3f} s = {fedhet_s / bound:.1f}x the arithmetic; "
                  f"plain loop {statistics.median(figures['second']) / bound:.1f}x; "
                  f"{fedhet_s / probe.tasks * 1e3:.3f} ms a task")  # fmt: skip


if __name__ == "__main__":
    main()
