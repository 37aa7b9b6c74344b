#!/usr/bin/env python3
"""ncu_by_line.py: where one kernel's instructions and stalls go, per CUDA source line.

Joins Nsight Compute's per-SASS-instruction source counters with the line table of the
kernel's cubin (our kernels are built with -lineinfo, tools/bazel/cuda.bzl), so that each
executed SASS instruction and each stall sample is charged to the source line it came from.
This is how the docs/bench/h200_v30_ncu_stream_b64_lines.txt table was made.

On the GPU host (ncu, cuobjdump and nvdisasm come with the CUDA toolkit there):

  ncu --clock-control none --kernel-name regex:verify_stream --launch-count 1 \\
      --section SourceCounters --section WarpStateStats -o prof <kda_bench ...>
  ncu --import prof.ncu-rep --page source --csv --print-source sass | gzip > sass.csv.gz
  cuobjdump -xelf all <kda_bench>            # one cubin per instantiation file and arch
  nvdisasm -g -c <the sm_90a cubin holding the kernel> | gzip > sass.txt.gz

Then, anywhere with Python 3:

  ncu_by_line.py sass.csv.gz sass.txt.gz KERNEL_SUBSTRING [--per N] [--top N] [--runs]

--per N divides the counts (e.g. by the items a launch processed); --runs lists maximal runs
of consecutive SASS instructions from one source line, in address order, instead of totals
per line (that shows which occurrence of an inlined helper is hot).
"""
import argparse
import collections
import csv
import gzip
import re
import sys


def open_text(path):
    return gzip.open(path, "rt") if path.endswith(".gz") else open(path)


def line_table(sass_path, kernel):
    """Kernel-relative SASS offset -> 'file:line' from `nvdisasm -g` output."""
    lines = open_text(sass_path).read().split("\n")
    starts = [i for i, l in enumerate(lines) if l.startswith("//----") and kernel in l]
    if not starts:
        sys.exit(f"no function matching {kernel!r} in {sass_path}")
    table, where = {}, "?"
    for l in lines[starts[0] + 1:]:
        if l.startswith("//----"):
            break
        m = re.search(r'//## File ".*/([^/"]+)", line (\d+)', l)
        if m:
            where = f"{m.group(1)}:{m.group(2)}"
            continue
        m = re.match(r"\s+/\*([0-9a-f]{4,})\*/\s", l)
        if m:
            table[int(m.group(1), 16)] = where
    return table


def source_counters(csv_path):
    """Rows of the first kernel in an `ncu --page source --csv --print-source sass` export."""
    rows = list(csv.reader(open_text(csv_path)))
    ends = [i for i, r in enumerate(rows) if r and r[0] == "Kernel Name"]
    if len(ends) > 1:
        rows = rows[: ends[1]]
    header, data = rows[1], rows[2:]
    return {h: i for i, h in enumerate(header)}, data


def number(text):
    try:
        return float(text)
    except ValueError:
        return 0.0


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("csv")
    ap.add_argument("sass")
    ap.add_argument("kernel")
    ap.add_argument("--per", type=float, default=1.0)
    ap.add_argument("--top", type=int, default=60)
    ap.add_argument("--runs", action="store_true")
    args = ap.parse_args()

    table = line_table(args.sass, args.kernel)
    col, data = source_counters(args.csv)
    stalls = [h for h in col if h.startswith("stall_") and "Not Issued" not in h]
    base = int(data[0][col["Address"]], 16)
    samples_key = "Warp Stall Sampling (All Samples)"

    records = []  # (offset, line, instructions, samples, Counter of stall reasons)
    for r in data:
        off = int(r[col["Address"]], 16) - base
        reasons = collections.Counter({s: number(r[col[s]]) for s in stalls})
        records.append((off, table.get(off, "?"), number(r[col["Instructions Executed"]]),
                        number(r[col[samples_key]]), reasons))
    total_inst = sum(x[2] for x in records) or 1.0
    total_samp = sum(x[3] for x in records) or 1.0
    print(f"# {total_inst / args.per:.0f} warp instructions per unit (--per {args.per:g}), "
          f"{total_samp:.0f} stall samples")

    def row(label, inst, samp, reasons):
        top = ", ".join(f"{k[6:]} {v:.0f}" for k, v in reasons.most_common(2))
        return (f"{label:32s} inst {inst / args.per:9.1f} {100 * inst / total_inst:5.1f}%  "
                f"samples {100 * samp / total_samp:5.1f}%  {top}")

    if args.runs:
        runs = []
        for off, where, inst, samp, reasons in records:
            if runs and runs[-1][1] == where:
                runs[-1][2] += inst
                runs[-1][3] += samp
                runs[-1][4].update(reasons)
            else:
                runs.append([off, where, inst, samp, collections.Counter(reasons)])
        ranked = sorted(runs, key=lambda r: -r[3])[: args.top]
        for off, where, inst, samp, reasons in sorted(ranked):
            print(row(f"{off:05x} {where}", inst, samp, reasons))
    else:
        per_line = collections.defaultdict(lambda: [0.0, 0.0, collections.Counter()])
        for _, where, inst, samp, reasons in records:
            acc = per_line[where]
            acc[0] += inst
            acc[1] += samp
            acc[2].update(reasons)
        for where, (inst, samp, reasons) in sorted(per_line.items(),
                                                   key=lambda kv: -kv[1][0])[: args.top]:
            print(row(where, inst, samp, reasons))


if __name__ == "__main__":
    main()
