#!/usr/bin/env python3
"""Plots the JSON of `replayssm precision`: relative error against the fp64 oracle per step, one
panel for the outputs, one for the states and one for the state of the worst head; colour per
state dtype, line style per baseline / L.

usage: python3 tools/plot_precision.py docs/precision.json [-o docs/precision.png]
Needs matplotlib: pip install matplotlib
"""
import argparse
import json
import sys

DTYPE_COLOURS = {"fp32": "tab:blue", "fp16": "tab:green", "bf16": "tab:red"}
REPLAY_LINE_STYLES = ["--", "-.", ":", (0, (5, 1)), (0, (3, 1, 1, 1, 1, 1))]


def line_style(mode, replay_lengths):
    if mode["kind"] == "baseline":
        return "-"
    return REPLAY_LINE_STYLES[replay_lengths.index(mode["L"]) % len(REPLAY_LINE_STYLES)]


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
    replay_lengths = sorted({m["L"] for m in modes if m["kind"] == "replay"})

    fig, (out_axis, state_axis, head_axis) = plt.subplots(1, 3, figsize=(19, 6), sharex=True)
    for mode in modes:
        style = dict(color=DTYPE_COLOURS.get(mode["state_dtype"], "black"),
                     linestyle=line_style(mode, replay_lengths), linewidth=1.2)
        curves = ((out_axis, mode["out"]), (state_axis, mode["state"]),
                  (head_axis, mode["state_worst_head"]))
        for axis, curve in curves:
            points = [(s, v) for s, v in zip(curve["steps"], curve["values"]) if v is not None and v > 0]
            if points:
                axis.plot(*zip(*points), label=mode["name"], **style)

    g = study["geometry"]
    shape = f"{g['name']} (H={g['heads']}, P={g['head_dim']}, N={g['state_dim']}, G={g['groups']})"
    out_axis.set_title(f"output: max|y - y_oracle| / max|y_oracle| (y in {study['act_dtype']})")
    state_axis.set_title("state: max|S - S_oracle| / max|S_oracle| (replay: after each flush)")
    head_axis.set_title("state, worst (row, head): the same within one head")
    for axis in (out_axis, state_axis, head_axis):
        axis.set_yscale("log")
        axis.set_xlabel("decode step")
        axis.grid(True, which="both", alpha=0.3)
    out_axis.set_ylabel("relative error vs fp64 oracle")
    head_axis.legend(fontsize=8, ncol=2, loc="best")
    fig.suptitle(f"replayssm precision: {shape}, {study['rows']} row(s), {study['steps']} steps, "
                 f"seed {study['seed']}")
    fig.tight_layout()
    fig.savefig(args.output, dpi=110)
    print(f"wrote {args.output}")


if __name__ == "__main__":
    main()
