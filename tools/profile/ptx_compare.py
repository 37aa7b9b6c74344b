#!/usr/bin/env python3
"""ptx_compare.py: which CUDA kernels a change alters, per kernel, from their PTX (no GPU).

    tools/profile/ptx_compare.py BASE_REV [NEW_REV]      # NEW_REV: the work tree when omitted
    tools/profile/ptx_compare.py main my-branch --files kernels/verify/inst/verify_fast_bf16.cu

Compiles the kernel files (every kernels/**/*.cu, or --files) to PTX at both revisions with the
build's device flags (ptxas_table.py's FLAGS, sm_90a), drops line info, comments and the per-path
anonymous-namespace hashes, and prints one line per kernel whose instruction sequence differs
(virtual register names aside: a refactor that only renumbers them is the same code to ptxas's
input), then a count. Exit status 1 when any kernel differs. Use it for changes meant to leave
code generation alone (a shared helper, a moved function); ptxas_table.py --check covers spills.
About half a minute per file and revision on 2 cores.
"""
import argparse
import os
import re
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from ptxas_table import FLAGS as PTXAS_FLAGS, NVCC, ROOT  # noqa: E402  (one set of device flags)

# ptxas_table.py's flags, less its ptxas report and object output, the tree's own headers first.
FLAGS = ["-I." if f == "-I" + ROOT else f for f in PTXAS_FLAGS
         if f not in ("-Xptxas", "-v", "-c", "-lineinfo")] + ["-ptx"]
REG = re.compile(r"%(?:rd|r|fd|f|p|rs|h)\d+")
ENTRY = re.compile(r"^\.(?:visible )?\.?entry (\S+)\(", re.M)


def kernels(tree, source, workdir):
    """{mangled kernel name: its instruction lines, registers renamed '%'} of one file."""
    out = os.path.join(workdir, "k.ptx")
    res = subprocess.run([NVCC] + FLAGS + [source, "-o", out], cwd=tree, capture_output=True,
                         text=True)
    if res.returncode != 0:
        sys.exit("nvcc failed on %s at %s:\n%s" % (source, tree, res.stderr[-3000:]))
    text = re.sub(r"_GLOBAL__N__[0-9a-f]+_", "_GN_", open(out).read())
    starts = [m.start() for m in ENTRY.finditer(text)] + [len(text)]
    result = {}
    for a, b in zip(starts, starts[1:]):
        body = text[a:b]
        lines = [REG.sub("%", l.strip()) for l in body.split("\n")
                 if l.strip() and not re.match(r"\s*(\.loc|\.file|\.reg|//)", l)]
        result[ENTRY.match(body).group(1)] = lines
    return result


def demangle(names):
    out = subprocess.run(["c++filt"], input="\n".join(names), capture_output=True, text=True,
                         check=True).stdout.split("\n")
    return [re.sub(r"kda::kernels::|kda::|void ", "", n) for n in out[:len(names)]]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("base")
    ap.add_argument("new", nargs="?")
    ap.add_argument("--files", nargs="*", help="kernel sources, relative to the repository")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        trees = []
        for i, rev in enumerate([args.base, args.new]):
            if rev is None:
                trees.append(ROOT)
                continue
            tree = os.path.join(tmp, "tree%d" % i)
            subprocess.run(["git", "worktree", "add", "--detach", "--quiet", tree, rev], cwd=ROOT,
                           check=True)
            trees.append(tree)
        try:
            files = args.files or sorted(
                os.path.relpath(os.path.join(d, f), ROOT)
                for d, _, fs in os.walk(os.path.join(ROOT, "kernels")) for f in fs
                if f.endswith(".cu"))
            total, differ = 0, []
            for source in files:
                a = kernels(trees[0], source, tmp)
                b = kernels(trees[1], source, tmp)
                for name in sorted(set(a) | set(b)):
                    total += 1
                    if a.get(name) != b.get(name):
                        differ.append(name)
            for name in demangle(differ):
                print("differs:", name)
            print("ptx_compare: %d kernels, %d differ" % (total, len(differ)))
            return 1 if differ else 0
        finally:
            for tree in trees[:]:
                if tree != ROOT:
                    subprocess.run(["git", "worktree", "remove", "--force", tree], cwd=ROOT)


if __name__ == "__main__":
    sys.exit(main())
