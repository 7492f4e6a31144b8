"""Host time of one local SGD step as the back-propagation depth shrinks.

Prints, per model and depth d (layers d..L trained), the mean wall time of a training step
on the reused working model. Truncation must really save compute: time should fall as d
grows. Usage: python benchmarks/truncated_backprop.py [--batch 16] [--repeats 200]
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import torch

from fedhet.client import ClientData, LocalTrainer
from fedhet.messages import ClientTask, Coverage
from fedhet.models import FlatModel, build_model


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--repeats", type=int, default=200)
    parser.add_argument("--models", default="mlp,cnn2,cnn-fedstale,vgg11")
    args = parser.parse_args()
    torch.set_num_threads(1)
    n = 512
    x = torch.randn(n, 1, 28, 28)
    y = torch.randint(0, 10, (n,))
    print(f"{'model':<14}{'depth':>6}{'layers trained':>16}{'ms/step':>10}")
    for name in args.models.split(","):
        torch.manual_seed(0)
        flat = FlatModel(build_model(name, (1, 28, 28), 10))
        worker = LocalTrainer(flat)
        data = ClientData(x, y, np.arange(n))
        params, buffers = flat.params.clone(), flat.buffers.clone()
        repeats = args.repeats if name != "vgg11" else max(5, args.repeats // 20)
        L = flat.num_layers
        for depth in range(1, L + 1):
            rng = np.random.default_rng(0)
            warm_up = ClientTask(0, 0, 0.01, args.batch, 2, Coverage(depth))
            timed = ClientTask(0, 0, 0.01, args.batch, repeats, Coverage(depth))
            worker.train(warm_up, params, buffers, data, {}, rng)
            start = time.perf_counter()
            worker.train(timed, params, buffers, data, {}, rng)
            ms = 1000 * (time.perf_counter() - start) / repeats
            print(f"{name:<14}{depth:>6}{L + 1 - depth:>16}{ms:>10.3f}")


if __name__ == "__main__":
    main()
