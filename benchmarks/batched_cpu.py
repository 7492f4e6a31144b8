"""The batched pool against one client at a time on the CPU, one core: where grouping a
round's clients into one computation (the one local trainer, ``run.pool = "batched"``)
pays on a CPU and where it does not.

Workloads (one torch thread, no worker processes, evaluation every round as a user's run):
- ``table2-mlp`` and ``table2-cnn2``: SALF's Table II setting (Sec. IV-A) on Fashion-MNIST,
  30 IID clients, one SGD step of batch 16 with momentum 0.5 kept per client, SALF with 50%
  stragglers (benchmarks/_common.TABLE2_CNN), the MLP or the CNN;
- ``cifar-shape``: pfl-research's CIFAR-10 benchmark shape (benchmarks/pfl_research.py):
  simple-cnn, cohort 50, 5 steps of batch 10, FedAvg; random images in CIFAR-10's format.

Each side is one block: a fresh run; its figure is the time per round after the first.
Sides alternate (A B, B A, ...) for ``--pairs`` pairs; the ratio is one-at-a-time /
batched per pair (above 1: batched is faster), reported as the median with its range.

    python benchmarks/batched_cpu.py --data-dir /usr/share/datasets/fashion-mnist
    python benchmarks/batched_cpu.py --workload cifar-shape --pairs 5
    python benchmarks/batched_cpu.py --workload table2-cnn2 --stacked always   # vmap's grouped convolutions
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import tomllib
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import TABLE2_CNN, alternate, describe_ratio, machine_header  # noqa: E402
from workers import TABLE2, Block  # noqa: E402


class PoolBlock(Block):
    """A :class:`workers.Block` that records the pool each run's summary names."""

    def __init__(self, make_config, scratch: Path):
        super().__init__(make_config, scratch)
        self.pools: set[str] = set()

    def __call__(self) -> float:
        seconds = super().__call__()
        summary = json.loads((self.scratch / f"run-{Block.count}" / "summary.json").read_text())
        self.pools.add(summary["pool"])
        return seconds


def table2_config(rounds: int, pool: str, model: str, data_dir: str, stacked: str = ""):
    from fedhet.config import from_dict

    text = TABLE2.format(rounds=rounds, workers=1, eval_every=1, table2=TABLE2_CNN)
    document = tomllib.loads(text)  # workers.py's Table II setting, here one thread in this process
    document["run"].update(threads=1, pool=pool)
    document["system"]["straggler_ratio"] = 0.5
    if stacked and pool == "batched":
        document["run"]["stacked"] = stacked
    document["model"] = {"name": "cnn2"} if model == "cnn2" else {"name": "mlp", "hidden": [100]}
    document["data"]["data_dir"] = data_dir
    return from_dict(document)


def cifar_config(rounds: int, pool: str, data_dir: str):
    from pfl_research import fedhet_config

    from fedhet.config import from_dict

    document = fedhet_config("cifar10", data_dir, rounds, 0, seed=1).to_dict()
    document["run"].update(threads=1, workers=1, pool=pool)
    return from_dict(document)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--workload", choices=("table2-mlp", "table2-cnn2", "cifar-shape", "all"), default="all"
    )
    parser.add_argument(
        "--data-dir", default="/usr/share/datasets/fashion-mnist", help="Fashion-MNIST's IDX files"
    )
    parser.add_argument("--pairs", type=int, default=5)
    parser.add_argument("--rounds", type=int, default=21)
    parser.add_argument("--cifar-rounds", type=int, default=6)
    parser.add_argument(
        "--stacked", default="", help="run.stacked of the batched side (default: its default)"
    )
    args = parser.parse_args()
    print(machine_header("one torch thread per run, in this process"))
    with tempfile.TemporaryDirectory(prefix="fedhet-bench-") as tmp:
        scratch = Path(tmp)
        for model in ("mlp", "cnn2"):
            if args.workload not in (f"table2-{model}", "all"):
                continue
            one = PoolBlock(
                lambda m=model: table2_config(args.rounds, "in-process", m, args.data_dir), scratch
            )
            many = PoolBlock(
                lambda m=model: table2_config(args.rounds, "batched", m, args.data_dir, args.stacked), scratch
            )
            figures = alternate(one, many, args.pairs)
            assert many.pools == {"batched"} and one.pools == {"in-process"}
            label = f"table2 {model} (30 clients, batch 16, 1 step): one at a time / batched, s/round"
            print(describe_ratio(label, figures))
        if args.workload in ("cifar-shape", "all"):
            from pfl_research import synthetic_cifar

            data_dir = str(synthetic_cifar(scratch / "cifar"))
            one = PoolBlock(lambda: cifar_config(args.cifar_rounds, "in-process", data_dir), scratch)
            many = PoolBlock(lambda: cifar_config(args.cifar_rounds, "batched", data_dir), scratch)
            figures = alternate(one, many, args.pairs)
            print(
                describe_ratio(
                    "cifar-shape (simple-cnn, cohort 50, 5 steps of 10): one at a time / batched, s/round",
                    figures,
                )
            )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
