"""What one client task costs on the host in the in-process pool: a group of one of the
one local trainer (``LocalTrainer.train_group``), on digits' MLP (32, 16), one step of
batch 16 at depths 1-3 (SALF's truncated steps), plain SGD: the per-task work that is not
the model's arithmetic (drawing the batch, the trainer's bookkeeping, the update).

Each block is a fresh process (``python -c``) that times ``--tasks`` tasks after a warm-up
and prints microseconds per task. With ``--against COMMIT`` the same child runs on that
commit's ``src`` (``git archive``), alternating with this checkout (A B, B A, ...); the
ratio this / that is the median of the pairs.

    python benchmarks/task_overhead.py --against b64cde0 --pairs 5
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import REPO, alternate, describe_ratio, machine_header, release_tree, scratch  # noqa: E402

CHILD = """
import json, sys, time
import numpy as np, torch
torch.set_num_threads(1)
from fedhet.config import from_dict
from fedhet.messages import ClientTask, Coverage
from fedhet.world import build_world
tasks = int(sys.argv[1])
world = build_world(from_dict({
    "run": {"name": "t", "seed": 5, "threads": 1, "device": "cpu"},
    "data": {"dataset": "digits", "num_clients": 20},
    "model": {"name": "mlp", "hidden": [32, 16]},
    "train": {"lr": 0.1, "batch_size": 16, "local_steps": 1},
    "algorithm": {"name": "salf"},
}))
params, buffers = world.initial_params, world.initial_buffers
def run(count):
    for c in range(count):
        task = ClientTask(0, c % 20, 0.1, 16, 1, Coverage(1 + c % 3))
        world.worker.execute(task, params, buffers, world.client_data(task.client), {},
                             np.random.default_rng(c), world.algorithm.client)
run(200)
began = time.perf_counter()
run(tasks)
print(json.dumps({"us": (time.perf_counter() - began) / tasks * 1e6}))
"""


def per_task(src: Path, tasks: int) -> float:
    """One fresh process on ``src``: its microseconds per task."""
    env = {**os.environ, "PYTHONPATH": str(src), "OMP_NUM_THREADS": "1"}
    done = subprocess.run([sys.executable, "-c", CHILD, str(tasks)], env=env, capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"task_overhead: the child on {src} failed: {done.stderr.strip().splitlines()[-1]}")
    return float(json.loads(done.stdout.strip().splitlines()[-1])["us"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--against", help="a past commit to compare with (its src, via git archive)")
    parser.add_argument("--pairs", type=int, default=5)
    parser.add_argument("--tasks", type=int, default=2000)
    args = parser.parse_args()
    print(machine_header("children: one torch thread"))
    here = REPO / "src"
    if not args.against:
        print(f"this checkout: {per_task(here, args.tasks):.0f} us per task")
        return
    with scratch() as tmp:
        there = release_tree(args.against, Path(tmp))
        figures = alternate(
            lambda: per_task(here, args.tasks), lambda: per_task(there, args.tasks), args.pairs
        )
    print(describe_ratio(f"us per task, this checkout vs {args.against}", figures, unit="us"))


if __name__ == "__main__":
    main()
