"""Goals: achieved GFLOP/s of cnn-fedstale rounds (batch 128, 5 local steps) >= 50% of this
machine's fp32 matmul peak, measured in the same run with the same threads; truncated
back-propagation saves >= 80% of the ideal (FLOP-proportional) host time at every depth.

Part 1 alternates two kinds of short block in one process: a second of 2048 x 2048 fp32
matrix products (the block's best product is the peak) and a fresh run of cnn-fedstale
rounds on the embedded engine (FedAvg, 10 clients, every client 5 steps of 128
Fashion-MNIST images, checkpoints included, no evaluation until the last round, which is not
timed), whose FLOPs (fedhet.models.cost: forward, weight and input gradients of every Conv2d
and Linear, 2 FLOPs per multiply-add) over its time per round give its GFLOP/s. The share of
the peak is taken per pair of neighbouring blocks; the median and min-max over the pairs are
reported (A B, B A, ...; benchmarks/_common.py).

Part 2 times one SGD step at every depth d (layers d..L trained) in blocks that rotate over
the depths (1 2 .. L, 2 .. L 1, ...), and compares the time saved against depth 1 in the same
pass with the saving the FLOP count predicts:
achieved share = (1 - t_d / t_1) / (1 - flops_d / flops_1); median and min-max over passes.

    python benchmarks/hardware.py [--threads N] [--models cnn2 cnn-fedstale vgg11]
    python benchmarks/hardware.py --memory-format channels_last
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import alternate, load_average, machine_header, ratio, rotate  # noqa: E402


def matmul_peak(seconds: float = 1.0, size: int = 2048) -> float:
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
    """(GFLOP/s, seconds per round, GFLOP per round) of cnn-fedstale FedAvg rounds: one fresh
    run of ``rounds + 2`` rounds in this process: the ``rounds`` between the first (warm-up)
    and the last (which evaluates) are timed."""
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
            "rounds": rounds + 2,
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


def share_of_peak(rounds: int, threads: int, memory_format: str, pairs: int) -> tuple[dict, float]:
    """Alternated blocks of matmul peak and cnn-fedstale rounds: per pair, the rounds' GFLOP/s
    over the neighbouring block's peak (as :func:`ratio` of seconds per GFLOP). Also returns
    the GFLOP of one round."""
    round_throughput(1, threads, memory_format)  # decode the dataset, warm the kernels
    work = [0.0]

    def rounds_block() -> float:
        gflops, _, work[0] = round_throughput(rounds, threads, memory_format)
        return 1 / gflops

    figures = alternate(lambda: 1 / matmul_peak(), rounds_block, pairs)
    return figures, work[0]


def truncation(name: str, batch: int, repeats: int, memory_format: str, pairs: int) -> list[tuple]:
    """Per depth: (depth, median ms per step, FLOP share of depth 1, achieved share of the
    ideal saving: median, min, max over passes). Blocks rotate over the depths."""
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
    rng = np.random.default_rng(0)

    def block(depth: int):
        def timed() -> float:
            task = ClientTask(0, 0, 0.01, batch, repeats, Coverage(depth))
            start = time.perf_counter()
            worker.train(task, params, buffers, data, {}, rng)
            return (time.perf_counter() - start) / repeats

        return timed

    depths = range(1, flat.num_layers + 1)
    for depth in depths:  # warm-up
        worker.train(ClientTask(0, 0, 0.01, batch, 3, Coverage(depth)), params, buffers, data, {}, rng)
    times, _, _ = rotate({depth: block(depth) for depth in depths}, pairs)
    full = training_step_flops(layers, batch, 1)
    rows = []
    for depth in depths:
        share = training_step_flops(layers, batch, depth) / full
        ms = 1000 * statistics.median(times[depth])
        if depth == 1:
            rows.append((depth, ms, share, None))
            continue
        r = ratio(times[depth], times[1])
        saving = [(1 - r[key]) / (1 - share) for key in ("median", "max", "min")]  # max t -> min saving
        rows.append((depth, ms, share, saving))
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--threads", type=int, default=0, help="0: as run.threads = 'auto' picks (free cores)"
    )
    parser.add_argument("--rounds", type=int, default=3, help="timed rounds per block")
    parser.add_argument("--pairs", type=int, default=5, help="passes over the sides (>= 5 for a figure)")
    parser.add_argument("--memory-format", choices=["contiguous", "channels_last"], default="contiguous")
    parser.add_argument("--models", nargs="+", default=["cnn2", "cnn-fedstale", "vgg11"])
    args = parser.parse_args()
    from fedhet.threads import free_cores

    threads = args.threads or free_cores()
    torch.set_num_threads(threads)
    print(machine_header(f"{threads} threads for both parts; run.memory_format = {args.memory_format}"))
    figures, work = share_of_peak(args.rounds, threads, args.memory_format, args.pairs)
    peak = statistics.median(1 / x for x in figures["first"])
    achieved = statistics.median(1 / x for x in figures["second"])
    print(f"fp32 matmul peak: {peak:.1f} GFLOP/s (median of {len(figures['first'])} one-second blocks)")
    print(f"cnn-fedstale rounds: {work:.1f} GFLOP per round, {achieved:.1f} GFLOP/s (median of blocks); "
          f"share of the neighbouring peak {100 * figures['median']:.0f}% "
          f"(pairs {100 * figures['min']:.0f}-{100 * figures['max']:.0f}%; goal >= 50%); "
          f"load {figures['load_before']:.2f} -> {figures['load_after']:.2f}")  # fmt: skip
    sys.stdout.flush()
    torch.set_num_threads(threads)
    for name in args.models:
        batch = 16 if name != "cnn-fedstale" else 128
        repeats = {"cnn2": 200, "cnn-fedstale": 10, "vgg11": 15}.get(name, 20)
        before = load_average()
        rows = truncation(name, batch, repeats, args.memory_format, args.pairs)
        worst = min(rows[1:], key=lambda row: row[3][0])
        print(
            f"{name}, batch {batch}: worst share of the ideal saving achieved {100 * worst[3][0]:.0f}% "
            f"at depth {worst[0]} (pairs {100 * worst[3][1]:.0f}-{100 * worst[3][2]:.0f}%; goal 80%); "
            f"load {before:.2f} -> {load_average():.2f}"
        )
        print(f"  {'depth':>5} {'ms/step':>9} {'FLOPs vs d=1':>13} {'saving achieved':>16} {'pairs':>11}")
        for depth, ms, share, saving in rows:
            shown = "-" if saving is None else f"{100 * saving[0]:.0f}%"
            spread = "" if saving is None else f"{100 * saving[1]:.0f}-{100 * saving[2]:.0f}%"
            print(f"  {depth:>5} {ms:>9.3f} {100 * share:>12.0f}% {shown:>16} {spread:>11}")
        sys.stdout.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
