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
  evaluation every 10 rounds.

The plain loop is what a researcher would write by hand for the same run: per round, a
random half of the clients straggle and reach a uniform depth; each client with any layer
copies the global weights into one working model, takes its step (plain SGD; truncated
back-propagation below its depth), and its layers' deltas are summed; the server divides
each layer's sum by the clients that reached it (SALF eq. (9) with p_l = 0); the same
evaluation. It uses the same model class, data tensors and batches of the same size.

The lower bound is the arithmetic at a GEMM rate measured in the same process: forward
2 x multiply-adds per example, backward twice that, over the tasks' examples (every task
counted whole) and the evaluations.

Sides alternate (A B, B A, ...) for ``--pairs`` pairs; each ratio is fedhet / plain per
pair, reported as the median with its range; the pools are measured in turn.

    python benchmarks/overhead.py --pairs 5
    python benchmarks/overhead.py --workload table2-cnn2 --pools in-process batched
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


WORKLOADS = {"leaderboard": lambda: LEADERBOARD, "table2-cnn2": table2}


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
        self.ratio = float(document["system"]["straggler_ratio"])

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
            stragglers = rng.random(len(data)) < self.ratio
            depths = np.where(stragglers, rng.integers(2, layers + 2, len(data)), 1)
            total, counts = torch.zeros_like(params), torch.zeros(layers)
            for c, client in enumerate(data):
                if depths[c] > layers:
                    continue
                delta = self._step(model, params, client, int(depths[c]), rng)
                total += delta
                counts[int(depths[c]) - 1 :] += 1
            for layer, (start, end) in enumerate(slices):
                if counts[layer] > 0:
                    params[start:end] += total[start:end] / counts[layer]
            if (t + 1) % self.eval_every == 0 or t + 1 == self.rounds:
                self._evaluate(model, params, x_test, y_test)
        return time.perf_counter() - began

    def _step(self, model, params, client, depth: int, rng) -> torch.Tensor:
        """Copy the global weights in, one SGD step from layer ``depth`` up, the delta out."""
        flat = self.world.flat
        flat.load(params)
        x, y = client.batch(rng, self.batch)
        loss = torch.nn.functional.cross_entropy(model(x, depth), y)
        trained = flat.parameters_from_depth(depth)
        grads = torch.autograd.grad(loss, trained)
        with torch.no_grad():
            for p, g in zip(trained, grads, strict=True):
                p.add_(g, alpha=-self.lr)
        return flat.params - params

    @staticmethod
    def _evaluate(model, params, x, y) -> float:
        with torch.no_grad():
            correct = 0
            for start in range(0, len(x), 1024):
                correct += int((model(x[start : start + 1024]).argmax(1) == y[start : start + 1024]).sum())
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
    batch = int(document["train"]["batch_size"])
    macs = tasks * batch * per_example * 3 + evaluations * len(world.dataset.y_test) * per_example
    return macs / gemm_rate()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workload", choices=sorted(WORKLOADS), default="leaderboard")
    parser.add_argument("--pools", nargs="+", default=["in-process", "batched"])
    parser.add_argument("--pairs", type=int, default=5)
    args = parser.parse_args()
    torch.set_num_threads(1)
    document = WORKLOADS[args.workload]()
    print(machine_header(f"overhead, {args.workload}, one thread"))
    with tempfile.TemporaryDirectory(prefix="fedhet-overhead-") as folder:
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
