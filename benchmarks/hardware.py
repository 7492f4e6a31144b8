"""Goals: achieved GFLOP/s of cnn-fedstale rounds (batch 128, 5 local steps) >= 50% of this
machine's fp32 matmul peak, measured in the same run with the same threads; truncated
back-propagation saves >= 80% of the ideal (FLOP-proportional) host time at every depth.

Part 1 times whole rounds on the embedded engine (FedAvg, 10 clients, every client 5 steps of
128 Fashion-MNIST images, checkpoints included, no evaluation until the last round) and
divides the FLOPs of the clients' steps (fedhet.models.cost: forward, weight and input
gradients of every Conv2d and Linear, 2 FLOPs per multiply-add) by the time. The peak is the
best of several 2048 x 2048 fp32 matrix products.

Part 2 times one SGD step at every depth d (layers d..L trained) and compares the time saved
against depth 1 with the saving the FLOP count predicts:
achieved share = (t_1 - t_d) / (t_1 - t_1 * flops_d / flops_1).

    python benchmarks/hardware.py [--threads N] [--models cnn2 cnn-fedstale vgg11]
    python benchmarks/hardware.py --memory-format channels_last
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import machine_header  # noqa: E402


def matmul_peak(seconds: float = 3.0, size: int = 2048) -> float:
    """Best fp32 GFLOP/s of size x size matrix products over ``seconds``."""
    a, b = torch.randn(size, size), torch.randn(size, size)
    out = torch.empty(size, size)
    torch.mm(a, b, out=out)
    best, end = 0.0, time.perf_counter() + seconds
    while time.perf_counter() < end:
        start = time.perf_counter()
        torch.mm(a, b, out=out)
        best = max(best, 2 * size**3 / (time.perf_counter() - start) / 1e9)
    return best


def round_throughput(rounds: int, threads: int, memory_format: str) -> tuple[float, float, float]:
    """(GFLOP/s, seconds per round, GFLOP per round) of cnn-fedstale FedAvg rounds."""
    from fedhet.config import from_dict
    from fedhet.engine.loop import RunLoop
    from fedhet.models import build_model
    from fedhet.models.cost import multiply_adds, training_step_flops

    clients, steps, batch = 10, 5, 128
    document = {
        "run": {
            "name": "hw",
            "seed": 1,
            "threads": threads,
            "rounds": rounds + 1,
            "eval_every": 10_000,
            "memory_format": memory_format,
        },  # fmt: skip
        "data": {"dataset": "fmnist", "partition": "iid", "num_clients": clients},
        "model": {"name": "cnn-fedstale"},
        "train": {"lr": 0.01, "batch_size": batch, "local_steps": steps},
        "system": {"model": "full"},
        "algorithm": {"name": "fedavg"},
    }
    stamps: list[float] = []
    with tempfile.TemporaryDirectory() as out:
        RunLoop(from_dict(document), out, on_round=lambda row: stamps.append(time.perf_counter())).run()
    per_round = (stamps[-2] - stamps[0]) / (len(stamps) - 2)  # the last round also evaluates
    layers = multiply_adds(build_model("cnn-fedstale", (1, 28, 28), 10), (1, 28, 28))
    flops = clients * steps * training_step_flops(layers, batch)
    return flops / per_round / 1e9, per_round, flops / 1e9


def truncation(
    name: str, batch: int, repeats: int, memory_format: str
) -> list[tuple[int, float, float, float]]:
    """Per depth: (depth, ms per step, FLOP share of depth 1, achieved share of the ideal saving)."""
    from fedhet.client import ClientData, LocalTrainer
    from fedhet.messages import ClientTask, Coverage
    from fedhet.models import FlatModel, build_model
    from fedhet.models.cost import multiply_adds, training_step_flops

    torch.manual_seed(0)
    model = build_model(name, (1, 28, 28), 10)
    layers = multiply_adds(model, (1, 28, 28))
    flat = FlatModel(model, channels_last=memory_format == "channels_last")
    worker = LocalTrainer(flat)
    n = 1024
    data = ClientData(torch.randn(n, 1, 28, 28), torch.randint(0, 10, (n,)), np.arange(n))
    params, buffers = flat.params.clone(), flat.buffers.clone()
    rows = []
    for depth in range(1, flat.num_layers + 1):
        rng = np.random.default_rng(0)
        worker.train(ClientTask(0, 0, 0.01, batch, 3, Coverage(depth)), params, buffers, data, {}, rng)
        best = float("inf")
        for _ in range(3):  # best of three: the least disturbed measurement
            start = time.perf_counter()
            worker.train(
                ClientTask(0, 0, 0.01, batch, repeats, Coverage(depth)), params, buffers, data, {}, rng
            )
            best = min(best, (time.perf_counter() - start) / repeats)
        share = training_step_flops(layers, batch, depth) / training_step_flops(layers, batch, 1)
        rows.append((depth, 1000 * best, share, float("nan")))
    full = rows[0][1]
    return [
        (d, ms, share, (full - ms) / (full - full * share) if d > 1 else float("nan"))
        for d, ms, share, _ in rows
    ]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--threads", type=int, default=0, help="0: as run.threads = 'auto' picks (free cores)"
    )
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--memory-format", choices=["contiguous", "channels_last"], default="contiguous")
    parser.add_argument("--models", nargs="+", default=["cnn2", "cnn-fedstale", "vgg11"])
    args = parser.parse_args()
    from fedhet.threads import free_cores

    threads = args.threads or free_cores()
    torch.set_num_threads(threads)
    print(machine_header(f"{threads} threads for both parts; run.memory_format = {args.memory_format}"))
    peak = matmul_peak()
    gflops, per_round, work = round_throughput(args.rounds, threads, args.memory_format)
    print(f"fp32 matmul peak: {peak:.1f} GFLOP/s")
    print(f"cnn-fedstale rounds: {work:.1f} GFLOP in {per_round:.3f} s per round = {gflops:.1f} GFLOP/s, "
          f"{100 * gflops / peak:.0f}% of peak (goal >= 50%)")  # fmt: skip
    torch.set_num_threads(threads)
    for name in args.models:
        batch = 16 if name != "cnn-fedstale" else 128
        repeats = {"cnn2": 200, "cnn-fedstale": 10, "vgg11": 5}.get(name, 20)
        rows = truncation(name, batch, repeats, args.memory_format)
        worst = min(r[3] for r in rows[1:])
        print(
            f"{name}, batch {batch}: worst share of the ideal saving achieved {100 * worst:.0f}% (goal 80%)"
        )
        print(f"  {'depth':>5} {'ms/step':>9} {'FLOPs vs d=1':>13} {'saving achieved':>16}")
        for depth, ms, share, achieved in rows:
            shown = "-" if depth == 1 else f"{100 * achieved:.0f}%"
            print(f"  {depth:>5} {ms:>9.3f} {100 * share:>12.0f}% {shown:>16}")
        sys.stdout.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
