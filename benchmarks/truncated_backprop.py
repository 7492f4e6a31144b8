"""Host time of one local SGD step as the back-propagation depth shrinks.

Prints, per model and depth d (layers d..L trained), the mean wall time of a training step
on the reused working model. Truncation must really save compute: time should fall as d
grows. ``transformer`` is the zoo's causal transformer (its defaults: width 64, 2 blocks, 4
heads) on 64-character windows of a 59-character vocabulary, trained on the next-token
task. Usage: python benchmarks/truncated_backprop.py [--batch 16] [--repeats 200]
[--models mlp,transformer]
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import torch

from fedhet.client import ClientData, LocalTrainer
from fedhet.data.task import NextToken
from fedhet.messages import ClientTask, Coverage
from fedhet.models import FlatModel, build_model

CONTEXT, VOCABULARY = 64, 59  # the transformer's windows: the shipped text's


def _workload(name: str, n: int) -> tuple[LocalTrainer, ClientData]:
    """The model's working trainer and data: images of 1 x 28 x 28 and 10 classes, or
    token windows for the transformer."""
    torch.manual_seed(0)
    if name == "transformer":
        x = torch.randint(0, VOCABULARY, (n, CONTEXT)).float()
        y = torch.randint(0, VOCABULARY, (n, CONTEXT))
        flat = FlatModel(build_model(name, (CONTEXT,), VOCABULARY))
        return LocalTrainer(flat, objective=NextToken()), ClientData(x, y, np.arange(n))
    x, y = torch.randn(n, 1, 28, 28), torch.randint(0, 10, (n,))
    return LocalTrainer(FlatModel(build_model(name, (1, 28, 28), 10))), ClientData(x, y, np.arange(n))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--repeats", type=int, default=200)
    parser.add_argument("--models", default="mlp,cnn2,cnn-fedstale,vgg11,transformer")
    args = parser.parse_args()
    torch.set_num_threads(1)
    n = 512
    print(f"{'model':<14}{'depth':>6}{'layers trained':>16}{'ms/step':>10}")
    for name in args.models.split(","):
        worker, data = _workload(name, n)
        flat = worker.flat
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
