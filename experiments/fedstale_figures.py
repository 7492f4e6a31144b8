"""FedStale Figs. 2-5 from finished grids: the beta_opt map with Delta_0 / Delta_1, its
slices, and known vs FedAU-estimated participation probabilities.

    python experiments/fedstale_figures.py runs/fedstale_beta_map \
        --fedau runs/fedstale_fedau --out docs/results/figures/fedstale

Writes <out>-beta-map.png, <out>-slices.png and, with --fedau, <out>-fedau.png (at
--fedau-sigma); prints the tables as Markdown. Accuracy of a run = mean of its last --last
evaluations (default 3).
"""

from __future__ import annotations

import argparse
import sys

from fedhet.errors import FedhetError
from fedhet.studies.beta_map import beta_map, collect, markdown_table, trends
from fedhet.studies.plots import plot_beta_map, plot_stale_slices


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("runs", help="output folder of the beta-map grid")
    parser.add_argument("--fedau", help="output folder of the FedAU grid (Fig. 5)")
    parser.add_argument("--out", required=True, help="prefix of the figure files")
    parser.add_argument("--last", type=int, default=3, help="evaluations averaged per run")
    parser.add_argument("--sigma", type=float, default=0.6, help="sigma_g^2 of the Fig. 4 slice")
    parser.add_argument("--ratio", type=float, default=None, help="p_avg/p_min of the Fig. 3 slice")
    parser.add_argument(
        "--fedau-sigma", type=float, default=None, help="sigma_g^2 of the Fig. 5 map (default: --sigma)"
    )
    args = parser.parse_args(argv)
    try:
        cells = beta_map(collect(args.runs, args.last))
        print("## beta_opt map (known p_i)\n")
        print(markdown_table(cells))
        found = trends(cells)
        nan = float("nan")
        if found:
            print(
                "Spearman rank correlation of beta_opt with data heterogeneity: "
                f"{found.get('rho_data', nan):+.2f} (p = {found.get('p_data', nan):.3f}); "
                f"with participation heterogeneity: {found.get('rho_participation', nan):+.2f} "
                f"(p = {found.get('p_participation', nan):.3f})"
            )
            if "intermediate_wins_share" in found:
                share, tested = found["intermediate_wins_share"], found["cells_tested"]
                print(f"an intermediate beta beats both ends significantly in {share:.0%} of {tested:.0f}")
        plot_beta_map(cells, f"{args.out}-beta-map.png", "β_opt, known p_i")
        ratios = sorted({c.participation_ratio for c in cells})
        ratio = args.ratio or min(ratios, key=lambda r: abs(r - 10.0))  # Fig. 3 uses 10
        plot_stale_slices(cells, f"{args.out}-slices.png", sigma=args.sigma, ratio=ratio)
        if args.fedau:
            estimated = beta_map(collect(args.fedau, args.last))
            print("## FedAU-estimated p_i\n")
            print(markdown_table(estimated))
            sigma = args.sigma if args.fedau_sigma is None else args.fedau_sigma
            known = [c for c in cells if abs(c.swap_fraction - sigma) < 1e-9]
            estimated = [c for c in estimated if abs(c.swap_fraction - sigma) < 1e-9]
            rows = {"known": known, "FedAU": estimated}
            title = f"β_opt, σ_g² = {sigma:g}: known vs FedAU-estimated p_i"
            plot_beta_map(known + estimated, f"{args.out}-fedau.png", title, rows=rows)
    except FedhetError as exc:
        print(f"fedstale_figures: error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
