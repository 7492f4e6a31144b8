"""What a command on the Flower engine spends besides its rounds: Ray's start, each run's
client actors, and Flower's own round, against the same command on the embedded engine.

    python benchmarks/flower_startup.py                 # the quickstart, 3 passes
    python benchmarks/flower_startup.py --pairs 5 --set run.time_budget=20

Each pass runs ``fedhet run examples/quickstart.toml`` (three runs: FedAvg, drop, SALF) in
a fresh process on the embedded engine and on Flower, in alternating order, and reads from
the Flower command's own lines how long its one Ray took to start and each run's nodes took
to answer (the actors' start), and from the table each run's loop time. Reported: medians
over the passes, with min-max, and the ratio flower / embedded per pass.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import QUIET_FLOWER, machine_header, ratio, rotate, scratch  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]


def one_command(engine: str, out: Path, overrides: list[str]) -> dict:
    """Run the quickstart once on ``engine``: its wall time, Flower's start lines, rounds."""
    sets = [item for key in overrides for item in ("--set", key)]
    command = [sys.executable, "-m", "fedhet", "run", str(ROOT / "examples" / "quickstart.toml"),
               "--engine", engine, "--out", str(out), "--overwrite", "--quiet", *sets]  # fmt: skip
    began = time.perf_counter()
    env = {**os.environ, **QUIET_FLOWER}
    done = subprocess.run(command, capture_output=True, text=True, env=env, check=False)
    wall = time.perf_counter() - began
    if done.returncode not in (0, 1):
        raise SystemExit(f"{engine}: exit {done.returncode}: {done.stderr.strip().splitlines()[-1:]}")
    ray = [float(x) for x in re.findall(r"Ray at \S+ ready in ([0-9.]+) s", done.stderr)]
    nodes = [float(x) for x in re.findall(r"client nodes answered in ([0-9.]+) s", done.stderr)]
    summaries = [json.loads(p.read_text()) for p in sorted(out.glob("*/summary.json"))]
    return {
        "wall": wall,
        "ray": sum(ray),
        "nodes": sum(nodes),
        "rounds": sum(s["rounds"] for s in summaries),
        "loop": sum(s["wall_time"] for s in summaries),
    }


def main() -> None:
    formatter = argparse.RawDescriptionHelpFormatter
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=formatter)
    parser.add_argument("--pairs", type=int, default=3, help="passes (each runs both engines)")
    parser.add_argument("--set", action="append", default=[], help="a fedhet --set for both commands")
    args = parser.parse_args()
    print(machine_header("examples/quickstart.toml, three runs; embedded and Flower alternate"))
    seen: dict[str, list[dict]] = {"embedded": [], "flower": []}
    with scratch() as folder:

        def side(engine: str):
            def block() -> float:
                seen[engine].append(one_command(engine, Path(folder) / engine, args.set))
                return seen[engine][-1]["wall"]

            return block

        times, before, after = rotate({"embedded": side("embedded"), "flower": side("flower")}, args.pairs)
    figures = ratio(times["flower"], times["embedded"], (before, after))
    flower = seen["flower"]

    def median(key: str, runs: list[dict]) -> str:
        values = [run[key] for run in runs]
        return f"{statistics.median(values):.2f} ({min(values):.2f}-{max(values):.2f})"

    embedded = seen["embedded"]
    print(f"embedded command: {median('wall', embedded)} s; its runs' loops {median('loop', embedded)} s")
    print(f"flower command: {median('wall', flower)} s, {figures['median']:.1f}x embedded (pairs "
          f"{figures['min']:.1f}-{figures['max']:.1f}, n={len(flower)})")  # fmt: skip
    print(f"  Ray's start, once per command: {median('ray', flower)} s")
    print(f"  the runs' client actors (nodes answering), summed over the runs: {median('nodes', flower)} s")
    per_round = [run["loop"] / run["rounds"] for run in flower]
    print(f"  the runs' loops: {median('loop', flower)} s for {flower[0]['rounds']} rounds, "
          f"{statistics.median(per_round):.3f} s a round")  # fmt: skip


if __name__ == "__main__":
    main()
