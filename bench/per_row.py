#!/usr/bin/env python3
"""A step's time split into a fixed cost and a cost per batch row, from `replayssm bench --json`
files: per configuration (state, T, L), a least-squares line through its times at batch >= FROM
(default 128), for the baseline and for ReplaySSM, and the per-row cost as a share of the file's
copy bandwidth on the replay's byte model. The fixed cost is what a bigger batch does not amortise
(launches, a kernel's tail after the stream); the per-row share is the rate the stream keeps.

    bench/per_row.py [--from BATCH] FILE.json [FILE.json ...]
"""
import argparse
import collections
import json


def line(points):
    """Intercept and slope of the least-squares line through (x, y) points."""
    n = len(points)
    mx = sum(x for x, _ in points) / n
    my = sum(y for _, y in points) / n
    slope = sum((x - mx) * (y - my) for x, y in points) / sum((x - mx) ** 2 for x, _ in points)
    return my - slope * mx, slope


def report(path, least_batch):
    with open(path) as f:
        data = json.load(f)
    bytes_per_us = data["copy_bandwidth"]["best_GBps"] * 1e3
    configurations = collections.defaultdict(list)
    for r in data["results"]:
        if r["batch"] >= least_batch:
            configurations[(r["state_dtype"], r.get("T"), r["L"])].append(r)
    print(f"{path} (copy {data['copy_bandwidth']['best_GBps']:.1f} GB/s): us per step = fixed + per row x batch, "
          f"batch >= {least_batch}")
    for (state, T, L), results in sorted(configurations.items(), key=lambda kv: (kv[0][0], kv[0][1] or 0, kv[0][2])):
        batches = sorted({r["batch"] for r in results})
        if len(batches) < 2:
            continue
        base_fixed, base_row = line([(r["batch"], r["baseline"]["us_per_step"]) for r in results])
        fixed, per_row = line([(r["batch"], r["replay"]["us_per_step"]) for r in results])
        row_bytes = line([(r["batch"], r["replay"]["modelled_bytes_per_step"]) for r in results])[1]
        spec = f" T={T}" if T is not None else ""
        print(f"  {state}{spec} L={L} (batch {','.join(map(str, batches))}): baseline {base_fixed:.1f} + "
              f"{base_row:.3f} us; replay {fixed:.1f} + {per_row:.3f} us, a row {row_bytes / 1e6:.3f} MB at "
              f"{100 * row_bytes / bytes_per_us / per_row:.1f}% of copy")


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--from", dest="least_batch", type=int, default=128, help="least batch fitted")
    parser.add_argument("files", nargs="+")
    args = parser.parse_args()
    for path in args.files:
        report(path, args.least_batch)


if __name__ == "__main__":
    main()
