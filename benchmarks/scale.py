"""Goal: with 10,000 clients and 1% participation per round, time per round and memory stay
within 1.2x of the 100-client run: the cost follows the participants, not the population.

Fashion-MNIST split IID over N = 100, 1,000 and 10,000 clients; each client takes part in a
round with probability 100 / N (Bernoulli, FedStale Assumption 4), so about 100 clients
train per round whatever N; MLP, batch 5, 5 local steps, 20 rounds, one thread. FedAvg over
the participants, and FedVARP (FedStale beta = 1), whose server keeps every client's last
update (N x P numbers): float32 in RAM, float16 in RAM, and float16 memory-mapped on disk.
Each run is a fresh child process: time per round (rounds 2-20, checkpoints included),
seconds per participating client, peak resident memory, and the bytes the run folder holds.
For each setting the populations' runs rotate (100 10000, 10000 100, ...; --pairs passes):
the ratios against the first population are medians of the per-pass ratios, with min-max,
and the machine's load before and after (benchmarks/_common.py).

    python benchmarks/scale.py [--clients 100 10000] [--rounds 20] [--pairs 5]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import textwrap
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import REPO, machine_header, ratio, rotate, run_in_child, scratch  # noqa: E402

CHILD = textwrap.dedent(
    """
    import json, resource, time
    started = time.perf_counter()
    from pathlib import Path
    from fedhet.config import from_dict
    from fedhet.engine.loop import RunLoop
    n, out = {clients}, Path({out!r})
    document = {{
        "run": {{"name": "scale", "seed": 1, "threads": 1, "rounds": {rounds}, "eval_every": 1000}},
        "data": {{"dataset": "fmnist", "partition": "iid", "num_clients": n}},
        "model": {{"name": "mlp"}},
        "train": {{"lr": 0.05, "batch_size": 5, "local_steps": 5}},
        "system": {{"model": "full", "participation": "uniform",
                    "participation_low": min(1.0, 100 / n), "participation_high": min(1.0, 100 / n)}},
        "algorithm": {algorithm},
    }}
    stamps, participants = [], []
    def on_round(row):
        stamps.append(time.perf_counter())
        participants.append(row["participants"])
    RunLoop(from_dict(document), out, on_round=on_round).run(overwrite=True)
    per_round = (stamps[-1] - stamps[0]) / (len(stamps) - 1)
    start_up = stamps[0] - started - per_round  # imports, data, model, memory; before round 1
    disk = sum(p.stat().st_size for p in out.rglob("*") if p.is_file() and p.name != "live.bin")
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    mean_participants = sum(participants[1:]) / (len(participants) - 1)
    print(json.dumps({{"per_round": per_round, "participants": mean_participants, "peak_rss": rss,
                      "disk": disk, "start_up": start_up}}))
    """
)

SETTINGS = {
    "fedavg": {"name": "fedavg"},
    "fedvarp float32 ram": {"name": "fedvarp"},
    "fedvarp float16 ram": {"name": "fedvarp", "memory_dtype": "float16"},
    "fedvarp float16 disk": {"name": "fedvarp", "memory_dtype": "float16", "memory_storage": "disk"},
}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clients", type=int, nargs="+", default=[100, 10000])
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--pairs", type=int, default=5, help="passes (>= 5 for a figure)")
    parser.add_argument("--settings", nargs="+", default=list(SETTINGS), choices=list(SETTINGS))
    args = parser.parse_args()
    print(machine_header(f"each run: a fresh child process, 1 thread; {args.pairs} rotated passes"))
    print(f"{'setting':<22}{'clients':>8}{'start s':>8}{'s/round':>9}{'ms/participant':>16}"
          f"{'peak RSS MB':>13}{'run folder MB':>15}   (medians over passes)")  # fmt: skip
    with scratch() as tmp:
        for setting in args.settings:
            results: dict[int, list[dict]] = {n: [] for n in args.clients}

            def block(n: int, setting: str = setting, results: dict = results):
                def run() -> float:
                    out = Path(tmp) / f"{setting.replace(' ', '-')}-{n}"
                    code = CHILD.format(
                        clients=n, out=str(out), rounds=args.rounds, algorithm=SETTINGS[setting]
                    )
                    results[n].append(run_in_child(REPO / "src", code))
                    return results[n][-1]["per_round"]

                return run

            times, before, after = rotate({n: block(n) for n in args.clients}, args.pairs)
            base = args.clients[0]
            for n in args.clients:
                runs = results[n]
                f = {key: statistics.median(one[key] for one in runs) for key in runs[0]}
                line = (
                    f"{setting:<22}{n:>8}{f['start_up']:>8.1f}{f['per_round']:>9.3f}"
                    f"{1000 * f['per_round'] / f['participants']:>16.2f}"
                    f"{f['peak_rss'] / 2**20:>13.0f}{f['disk'] / 2**20:>15.1f}"
                )
                if n != base:
                    t = ratio(times[n], times[base])
                    m = ratio([r["peak_rss"] for r in runs], [r["peak_rss"] for r in results[base]])
                    line += (
                        f"   x{t['median']:.2f} time (pairs {t['min']:.2f}-{t['max']:.2f}), "
                        f"x{m['median']:.2f} memory ({m['min']:.2f}-{m['max']:.2f}) of N = {base}"
                    )
                print(line)
            print(f"{'':<22}load {before:.2f} -> {after:.2f}")
            sys.stdout.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
