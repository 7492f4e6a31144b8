"""Goal: with an evaluation every round, SALF's Table II CNN workload runs >= 3x faster than
release 52490d3.

The workload: cnn2 on Fashion-MNIST, 30 IID clients, one SGD step of batch 16 per round
(momentum 0.5 kept per client), 90% stragglers, SALF, 150 rounds, the 10,000 test images
evaluated after every round (as the SALF authors' code does). Both trees run the same TOML
in a child process with the same thread count; the figure is the whole run's wall time
(data loading included), and the time per evaluation is timed separately on the same model.

Both trees alternate (A B, B A, ...) for ``--pairs`` pairs of whole runs of ``--rounds``
rounds; the ratio is the median of the per-pair ratios.

    python benchmarks/evaluation.py                  # 5 pairs of 30-round runs, 1 thread
    python benchmarks/evaluation.py --rounds 150 --pairs 3
"""

from __future__ import annotations

import argparse
import sys
import textwrap
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import REPO, TABLE2_CNN, machine_header, release_tree, run_in_child, scratch  # noqa: E402

RELEASE = "52490d3"

CONFIG = """
[run]
name = "eval-every-round"
seed = 1
rounds = {rounds}
eval_every = 1
threads = {threads}

{table2}straggler_ratio = 0.9

[algorithm]
name = "salf"
"""

CHILD = textwrap.dedent(
    """
    import json, sys, time
    started = time.perf_counter()
    import torch
    import fedhet
    from fedhet.client import evaluate
    from fedhet.models import FlatModel, build_model
    config = fedhet.load_config(sys.argv[1] if len(sys.argv) > 1 else {config!r})
    result = fedhet.run(config, {out!r})
    wall = time.perf_counter() - started
    x = torch.randn(10000, 1, 28, 28)
    y = torch.randint(0, 10, (10000,))
    flat = FlatModel(build_model("cnn2", (1, 28, 28), 10))
    evaluate(flat, flat.params, flat.buffers, x, y)
    t = time.perf_counter()
    for _ in range(5):
        evaluate(flat, flat.params, flat.buffers, x, y)
    per_eval = (time.perf_counter() - t) / 5
    print(json.dumps({{"wall": wall, "accuracy": result.summary.get("final_test_accuracy"),
                      "rounds": len(result.metrics), "per_eval": per_eval,
                      "threads": torch.get_num_threads()}}))
    """
)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--release", default=RELEASE)
    parser.add_argument("--pairs", type=int, default=5)
    args = parser.parse_args()
    from _common import alternate, describe_ratio

    note = f"both runs: run.threads = {args.threads}, {args.rounds} rounds, evaluation every round"
    print(machine_header(note))
    with scratch() as tmp:
        tmp = Path(tmp)
        config = tmp / "config.toml"
        config.write_text(CONFIG.format(rounds=args.rounds, threads=args.threads, table2=TABLE2_CNN))
        figures: dict[str, list] = {}
        trees = (("release " + args.release, release_tree(args.release, tmp)), ("this tree", REPO / "src"))

        def block(label: str, src: Path):
            def run() -> float:
                figures.setdefault(label, [])
                out = tmp / f"{label.replace(' ', '-')}-{len(figures[label])}"
                f = run_in_child(src, CHILD.format(config=str(config), out=str(out)))
                figures[label].append(f)
                per_round, per_eval = f["wall"] / f["rounds"], 1000 * f["per_eval"]
                print(f"  {label:<16} {f['wall']:7.1f} s for {f['rounds']} rounds ({per_round:.3f} s/round), "
                      f"final accuracy {f['accuracy']:.4f}; one evaluation of 10k images {per_eval:.0f} ms",
                      flush=True)  # fmt: skip
                return f["wall"]

            return run

        (old_label, old_src), (new_label, new_src) = trees
        whole = alternate(block(old_label, old_src), block(new_label, new_src), args.pairs)
        print(describe_ratio(f"run time, {old_label} / this tree (goal >= 3x)", whole))
        evals = [f["per_eval"] for f in figures[old_label]], [f["per_eval"] for f in figures[new_label]]
        from _common import ratio

        print(describe_ratio("one evaluation, release / this tree", ratio(*evals)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
