#!/usr/bin/env python3
"""Medians of `replayssm bench --json` files named ab_<tree>_r<round>.json (bench/ab.sh), one
line per configuration: each tree's baseline and ReplaySSM microseconds per step (the median
over rounds) and its speedup, then every later tree's times as fractions of the first tree's."""
import collections
import json
import os
import re
import statistics
import sys


def configuration(result):
    spec = f"T{result['T']} " if "T" in result else ""
    return (result["state_dtype"], spec, result["L"], result["batch"])


def main(paths):
    times = collections.defaultdict(lambda: collections.defaultdict(list))
    trees = []
    for path in sorted(paths):
        match = re.fullmatch(r"ab_(.+)_r\d+\.json", os.path.basename(path))
        if not match:
            sys.exit(f"{path}: not named ab_<tree>_r<round>.json")
        tree = match.group(1)
        if tree not in trees:
            trees.append(tree)
        with open(path) as f:
            for result in json.load(f)["results"]:
                times[configuration(result)][tree].append(
                    (result["baseline"]["us_per_step"], result["replay"]["us_per_step"]))
    trees.sort(key=lambda name: int(name.split("-", 1)[0]) if name.split("-", 1)[0].isdigit() else name)
    print("us per step, median over rounds: baseline / replay (speedup); after |: each later tree's "
          f"baseline/replay time against {trees[0]}'s")
    for key in sorted(times):
        state, spec, L, batch = key
        medians = {tree: (statistics.median(b for b, _ in runs), statistics.median(r for _, r in runs))
                   for tree, runs in times[key].items()}
        cells = [f"{tree}: {medians[tree][0]:.2f} / {medians[tree][1]:.2f} ({medians[tree][0] / medians[tree][1]:.3f}x)"
                 if tree in medians else f"{tree}: -" for tree in trees]
        against = ""
        if trees[0] in medians:
            base0, replay0 = medians[trees[0]]
            against = "  | " + " ".join(f"{medians[tree][0] / base0:.3f}/{medians[tree][1] / replay0:.3f}"
                                        if tree in medians else "-" for tree in trees[1:])
        print(f"{state} {spec}L={L} batch={batch}: " + "  ".join(cells) + against)

if __name__ == "__main__":
    if len(sys.argv) < 2:
        sys.exit("usage: ab_summary.py ab_<tree>_r<round>.json...")
    main(sys.argv[1:])
