#!/usr/bin/env python3
"""Plots the JSON of `replayssm precision`: relative error against the fp64 oracle per step. One
column per state dtype; rows: the outputs, the state, and the state of the worst head. In each
panel: that dtype's baseline (black), ReplaySSM per L (colour; solid: round to nearest at flush,
dashed: stochastic rounding), and the bf16 baseline (grey) as the common reference.

usage: python3 tools/plot_precision.py docs/precision.json [-o docs/precision.png]
Needs matplotlib: pip install matplotlib
"""
import argparse
import json
import sys

L_COLOURS = ["tab:blue", "tab:green", "tab:orange", "tab:red", "tab:purple", "tab:brown"]
REFERENCE_BASELINE = "baseline bf16"


def points(curve):
    return [(s, v) for s, v in zip(curve["steps"], curve["values"]) if v is not None and v > 0]


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("json_file")
    parser.add_argument("-o", "--output", default="precision.png", help="PNG to write")
    args = parser.parse_args()
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        sys.exit("plot_precision.py needs matplotlib: pip install matplotlib")

    with open(args.json_file) as f:
        study = json.load(f)
    modes = study["modes"]
    dtypes = list(dict.fromkeys(m["state_dtype"] for m in modes))
    replay_lengths = sorted({m["L"] for m in modes if m["kind"] == "replay"})
    reference = next((m for m in modes if m["name"] == REFERENCE_BASELINE), None)
    rows = (("out", "output error"), ("state", "state error"), ("state_worst_head", "state error, worst head"))

    fig, axes = plt.subplots(len(rows), len(dtypes), figsize=(4.2 * len(dtypes), 3.6 * len(rows)),
                             sharex=True, sharey="row", squeeze=False)
    for column, dtype in enumerate(dtypes):
        for row, (key, title) in enumerate(rows):
            axis = axes[row][column]
            if reference is not None and dtype != "bf16":
                p = points(reference[key])
                if p:
                    axis.plot(*zip(*p), color="0.6", linestyle=":", linewidth=1.5, label=REFERENCE_BASELINE)
            for mode in modes:
                if mode["state_dtype"] != dtype:
                    continue
                if mode["kind"] == "baseline":
                    style = dict(color="black", linestyle="-", linewidth=1.4)
                else:
                    colour = L_COLOURS[replay_lengths.index(mode["L"]) % len(L_COLOURS)]
                    style = dict(color=colour, linestyle="--" if mode.get("stochastic_rounding") else "-",
                                 linewidth=1.0)
                p = points(mode[key])
                if p:
                    axis.plot(*zip(*p), label=mode["name"], **style)
            axis.set_yscale("log")
            axis.grid(True, which="both", alpha=0.3)
            axis.set_title(f"{dtype}: {title}", fontsize=10)
            if row == len(rows) - 1:
                axis.set_xlabel("decode step")
            if column == 0:
                axis.set_ylabel("relative error vs fp64 oracle")
        axes[0][column].legend(fontsize=6, ncol=2, loc="lower right")

    g = study["geometry"]
    shape = f"{g['name']} (H={g['heads']}, P={g['head_dim']}, N={g['state_dim']}, G={g['groups']})"
    fig.suptitle(f"replayssm precision: {shape}, {study['rows']} row(s), {study['steps']} steps, "
                 f"act {study['act_dtype']}, seed {study['seed']}\nout = max|y - y*| / max|y*|, "
                 f"state = max|S - S*| / max|S*| (replay: after each flush)")
    fig.tight_layout()
    fig.savefig(args.output, dpi=100)
    print(f"wrote {args.output}")


if __name__ == "__main__":
    main()
