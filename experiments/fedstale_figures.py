"""FedStale Figs. 2-5 from finished grids: the beta_opt map with Delta_0 / Delta_1, its
slices, and known vs FedAU-estimated participation probabilities.

    python experiments/fedstale_figures.py runs/fedstale_beta_study \
        --fedau runs/fedstale_fedau_study --out docs/results/figures/fedstale-study \
        --table docs/results/data/fedstale-study.csv --fedau-table docs/results/data/fedstale-fedau-study.csv
    python experiments/fedstale_figures.py docs/results/data/fedstale-study.csv \
        --fedau docs/results/data/fedstale-fedau-study.csv

RUNS and --fedau are a grid's output folder or its per-run table (a .csv that --table and
--fedau-table write: one row per run with its cell, beta, seed, score and fedhet build).
Prints the tables as Markdown (p-values of the best intermediate beta Holm-corrected over
each table); with --out writes <out>-beta-map.png, <out>-slices.png and, with --fedau,
<out>-fedau.png (at --fedau-sigma). Accuracy of a run = mean of its last --last evaluations
(default 3).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from fedhet.errors import FedhetError
from fedhet.studies.beta_map import beta_map, collect, markdown_table, records_csv, trends
from fedhet.studies.plots import plot_beta_map, plot_stale_slices

PAIRS = ((1.0, 0.0), (0.5, 0.0), (0.5, 1.0))  # FedVARP - U-FedAvg, and beta = 0.5 against each end


def pairs_table(cells) -> str:
    """Per cell, the paired differences between the ends and beta = 0.5 in points (x 100,
    mean over the seeds), with the two-sided paired t-test's p and the Holm-corrected p over
    every test of the table."""
    import numpy as np

    from fedhet.studies.stats import difference_p_value, holm

    found = []
    for cell in cells:
        for a, b in PAIRS:
            x, y = cell.per_seed.get(a, {}), cell.per_seed.get(b, {})
            common = sorted(set(x) & set(y))
            if len(common) < 2:
                found.append(None)
                continue
            found.append((100 * float(np.mean([x[s] - y[s] for s in common])), difference_p_value(x, y)))
    adjusted = holm([None if f is None else f[1] for f in found])
    head = ["sigma_g^2", "p_avg/p_min", *[f"beta={a:g} - beta={b:g}" for a, b in PAIRS]]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    results = iter(zip(found, adjusted, strict=True))
    for cell in cells:
        row = [f"{cell.swap_fraction:g}", f"{cell.participation_ratio:.1f}"]
        for _ in PAIRS:
            f, corrected = next(results)
            row.append("-" if f is None else f"{f[0]:+.1f}, p = {f[1]:.3f} (Holm {corrected:.2g})")
        lines.append("| " + " | ".join(row) + " |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("runs", help="output folder or per-run table of the beta-map grid")
    parser.add_argument("--fedau", help="output folder or per-run table of the FedAU grid (Fig. 5)")
    parser.add_argument("--out", help="prefix of the figure files (none written without it)")
    parser.add_argument("--table", help="write the beta-map grid's per-run table here (.csv)")
    parser.add_argument("--fedau-table", help="write the FedAU grid's per-run table here (.csv)")
    parser.add_argument("--last", type=int, default=3, help="evaluations averaged per run")
    parser.add_argument("--sigma", type=float, default=0.6, help="sigma_g^2 of the Fig. 4 slice")
    parser.add_argument("--ratio", type=float, default=None, help="p_avg/p_min of the Fig. 3 slice")
    parser.add_argument(
        "--fedau-sigma", type=float, default=None, help="sigma_g^2 of the Fig. 5 map (default: --sigma)"
    )
    args = parser.parse_args(argv)
    try:
        records = collect(args.runs, args.last)
        if args.table:
            Path(args.table).write_text(records_csv(records, args.last))
        cells = beta_map(records)
        print("beta_opt map, p_i known to the server:\n")
        print(markdown_table(cells))
        print("The ends and beta = 0.5, paired by seed (points; p and Holm-corrected p over the table):\n")
        print(pairs_table(cells))
        found = trends(cells)
        nan = float("nan")
        if found:
            print(
                "Spearman rank correlation of beta_opt with data heterogeneity: "
                f"{found.get('rho_data', nan):+.2f} (p = {found.get('p_data', nan):.3f});"
            )
            print(
                f"with participation heterogeneity: {found.get('rho_participation', nan):+.2f} "
                f"(p = {found.get('p_participation', nan):.3f})."
            )
        middle = sum(0.0 < c.beta_opt < 1.0 for c in cells)
        print(f"An intermediate beta has the highest mean in {middle} of {len(cells)} cells;")
        if "intermediate_wins_share" in found:
            tested = round(found["cells_tested"])
            wins = round(found["intermediate_wins_share"] * tested)
            print(f"it beats both ends significantly (Holm-corrected) in {wins} of {tested}.")
        print()
        if args.out:
            plot_beta_map(cells, f"{args.out}-beta-map.png", "β_opt, known p_i")
            ratios = sorted({c.participation_ratio for c in cells})
            ratio = args.ratio or min(ratios, key=lambda r: abs(r - 10.0))  # Fig. 3 uses 10
            plot_stale_slices(cells, f"{args.out}-slices.png", sigma=args.sigma, ratio=ratio)
        if args.fedau:
            fedau_records = collect(args.fedau, args.last)
            if args.fedau_table:
                Path(args.fedau_table).write_text(records_csv(fedau_records, args.last))
            estimated = beta_map(fedau_records)
            print("beta_opt map, p_i estimated by FedAU:\n")
            print(markdown_table(estimated))
            sigma = args.sigma if args.fedau_sigma is None else args.fedau_sigma
            known = [c for c in cells if abs(c.swap_fraction - sigma) < 1e-9]
            estimated = [c for c in estimated if abs(c.swap_fraction - sigma) < 1e-9]
            rows = {"known": known, "FedAU": estimated}
            title = f"β_opt, σ_g² = {sigma:g}: known vs FedAU-estimated p_i"
            if args.out:
                plot_beta_map(known + estimated, f"{args.out}-fedau.png", title, rows=rows)
    except FedhetError as exc:
        print(f"fedstale_figures: error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
