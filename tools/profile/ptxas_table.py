#!/usr/bin/env python3
"""ptxas_table.py: registers, spills and static shared memory of every CUDA kernel, per ptxas.

Compiles every kernels/**/*.cu for sm_90a with the build's device flags
(tools/bazel/cuda.bzl and kernels/BUILD: -O3 -lineinfo --fmad=false; keep them in step) and
-Xptxas -v, and prints one line per kernel in docs/ptxas_sm90.txt's format:

    tools/profile/ptxas_table.py                 # the table (about a minute on 2 cores)
    tools/profile/ptxas_table.py --filter stream # only kernels whose name contains "stream"
    tools/profile/ptxas_table.py --check         # exit 1 if a kernel spills more than in
                                                 # docs/ptxas_sm90.txt (skipped, exit 0, when
                                                 # that table's nvcc release is not this one)

Why: the streaming verify runs at its 128-register cap, where a trim that removes instructions
can make ptxas spill and the kernel slower. Run --check before timing a change to a kernel.
Needs nvcc (CUDA_HOME or /usr/local/cuda) and c++filt; no GPU.
"""
import argparse
import glob
import os
import re
import subprocess
import sys
import tempfile

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
NVCC = os.path.join(os.environ.get("CUDA_HOME", "/usr/local/cuda"), "bin", "nvcc")
FLAGS = ["-std=c++17", "-O3", "-lineinfo", "--fmad=false", "-gencode", "arch=compute_90a,code=sm_90a",
         "-I" + ROOT, "-I/usr/include", "-Xptxas", "-v", "-c"]


def demangle(names):
    out = subprocess.run(["c++filt"], input="\n".join(names), capture_output=True, text=True,
                         check=True).stdout.split("\n")
    short = []
    for name in out[:len(names)]:
        name = re.sub(r"kda::kernels::|\(anonymous namespace\)::|void |\(kda::kernels::\w+\)|kda::",
                      "", name)
        short.append(name)
    return short


def kernels_of(source, workdir):
    """(mangled name, registers, spill stores, spill loads, smem bytes) per kernel of one file."""
    obj = os.path.join(workdir, "k.o")
    res = subprocess.run([NVCC] + FLAGS + [source, "-o", obj], cwd=ROOT, capture_output=True,
                         text=True)
    if res.returncode != 0:
        sys.exit("nvcc failed on %s:\n%s" % (source, res.stderr[-3000:]))
    rows, name, spills = [], None, (0, 0)
    for line in res.stderr.splitlines():
        m = re.search(r"Compiling entry function '(\w+)'", line)
        if m:
            name = m.group(1)
            continue
        m = re.search(r"(\d+) bytes spill stores, (\d+) bytes spill loads", line)
        if m and name:
            spills = (int(m.group(1)), int(m.group(2)))
            continue
        m = re.search(r"Used (\d+) registers", line)
        if m and name:
            smem = re.search(r"(\d+) bytes smem", line)
            rows.append((name, int(m.group(1)), spills[0], spills[1],
                         int(smem.group(1)) if smem else 0))
            name = None
    return rows


def table():
    sources = sorted(glob.glob(os.path.join(ROOT, "kernels", "**", "*.cu"), recursive=True))
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for src in sources:
            rows += kernels_of(os.path.relpath(src, ROOT), tmp)
    names = demangle([r[0] for r in rows])
    return [(n,) + r[1:] for n, r in zip(names, rows)]


def fmt(row):
    name, regs, st, ld, smem = row
    return "%-60s regs %4d  spill st/ld %4d/%-4d %s" % (name, regs, st, ld,
                                                        "%d B smem" % smem if smem else "")


def parse_doc(path):
    """({kernel: spill store bytes}, the nvcc release the table was recorded with or None)."""
    spills, release = {}, None
    for line in open(path):
        m = re.match(r"# nvcc release (\S+)", line)
        if m:
            release = m.group(1)
        m = re.match(r"(.+?)\s+regs\s+\d+\s+spill st/ld\s+(\d+)/(\d+)", line)
        if m:
            spills[m.group(1).strip()] = int(m.group(2))
    return spills, release


def nvcc_release():
    out = subprocess.run([NVCC, "--version"], capture_output=True, text=True, check=True).stdout
    m = re.search(r"release (\d+\.\d+)", out)
    return m.group(1) if m else "unknown"


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--filter", default="", help="only kernels whose name contains this")
    ap.add_argument("--check", action="store_true",
                    help="fail on a kernel that spills more than in docs/ptxas_sm90.txt")
    args = ap.parse_args()
    known, release = {}, None
    if args.check:
        known, release = parse_doc(os.path.join(ROOT, "docs", "ptxas_sm90.txt"))
        if release != nvcc_release():
            # Another ptxas allocates differently: its table is not comparable, so no verdict.
            print("ptxas_table: skipped, docs/ptxas_sm90.txt was recorded with nvcc %s and this "
                  "is nvcc %s" % (release, nvcc_release()))
            return
    rows = [r for r in table() if args.filter in r[0]]
    for r in rows:
        print(fmt(r))
    if args.check:
        worse = [r for r in rows if r[2] > known.get(r[0], 0)]
        for r in worse:
            print("SPILLS MORE than docs/ptxas_sm90.txt (%d B): %s" % (known.get(r[0], 0), fmt(r)))
        print("ptxas_table: %d kernels (nvcc %s), %d spill more than docs/ptxas_sm90.txt" %
              (len(rows), release, len(worse)))
        sys.exit(1 if worse else 0)


if __name__ == "__main__":
    main()
