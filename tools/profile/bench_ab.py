#!/usr/bin/env python3
"""bench_ab.py: compare interleaved kda_bench runs of two builds, row by row.

    tools/profile/bench_ab.py A1.csv,A2.csv,A3.csv B1.csv,B2.csv,B3.csv [--max-mean 0.5 --max-row 2]

Each side is a comma list of kda_bench --out CSV files (one per interleaved repetition). A row is
(phase, T, B, variant, bv); its time on a side is the lowest median_us over that side's files
(the repetition least disturbed by clocks and neighbours). Prints one line per row (A, B, B vs A)
and the mean and range of the deltas; exits 1 when |mean| > --max-mean % or a row's |delta| >
--max-row % (the issue's "within noise" rule), else 0.
"""
import argparse
import csv
import sys


def side(paths):
    best = {}
    for path in paths.split(","):
        with open(path) as f:
            for r in csv.DictReader(f):
                key = (r["phase"], int(r["T"]), int(r["B"]), r["variant"], int(r["bv"]))
                t = float(r["median_us"])
                best[key] = min(best.get(key, t), t)
    return best


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("a")
    ap.add_argument("b")
    ap.add_argument("--max-mean", type=float, default=0.5)
    ap.add_argument("--max-row", type=float, default=2.0)
    args = ap.parse_args()
    a, b = side(args.a), side(args.b)
    deltas = []
    for key in sorted(set(a) & set(b)):
        d = 100.0 * (b[key] - a[key]) / a[key]
        deltas.append(d)
        phase, T, B, variant, bv = key
        print(f"{phase:7s} {variant:13s} T{T} B{B:<3d} bv {bv:3d} | {a[key]:9.2f} {b[key]:9.2f} {d:+6.2f}%")
    missing = sorted(set(a) ^ set(b))
    for key in missing:
        print("only on one side:", key)
    if not deltas:
        print("no common rows")
        return 1
    mean = sum(deltas) / len(deltas)
    print(f"{len(deltas)} rows: mean {mean:+.2f}%, range {min(deltas):+.2f}..{max(deltas):+.2f}%")
    ok = abs(mean) <= args.max_mean and max(abs(d) for d in deltas) <= args.max_row and not missing
    print("within noise" if ok else "NOT within noise")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
