"""Runs the README's Python examples marked `<!-- readme_examples.py: runs on the host -->` (the
fenced python block after each marker), in order, in one namespace, as written: the library comes
from --library (through $KDA_LIBRARY, as the README's search order says), the working directory is
the one holding python/kda. Exit status 0 when every block runs; a failing block is named by its
README line.

Usage: readme_examples.py --readme README.md [--library PATH/libkda_c.so]
"""

import argparse
import os
import sys

MARKER = "<!-- readme_examples.py: runs on the host -->"


def blocks(text):
    """(line number, code) of each fenced python block right after a marker."""
    lines = text.splitlines()
    out = []
    for i, line in enumerate(lines):
        if line.strip() != MARKER:
            continue
        j = i + 1
        if j >= len(lines) or lines[j].strip() != "```python":
            raise SystemExit(f"README line {i + 1}: the marker is not followed by a ```python block")
        end = j + 1
        while end < len(lines) and lines[end].strip() != "```":
            end += 1
        out.append((j + 2, "\n".join(lines[j + 1:end])))
    return out


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--readme", required=True)
    p.add_argument("--library", default=None)
    args = p.parse_args()
    with open(args.readme) as f:
        found = blocks(f.read())
    if len(found) < 2:
        raise SystemExit(f"expected the README's engine-owned pool and kda.ops examples, found "
                         f"{len(found)} marked blocks")
    if args.library:
        os.environ["KDA_LIBRARY"] = os.path.abspath(args.library)
    os.chdir(os.path.dirname(os.path.abspath(args.readme)))  # where python/kda is
    namespace = {"__name__": "__readme__"}
    for line, code in found:
        try:
            exec(compile(code, f"README.md:{line}", "exec"), namespace)
        except Exception:
            print(f"README example at line {line} failed:", file=sys.stderr)
            raise
        print(f"README example at line {line}: ran")
    print(f"OK: {len(found)} README examples ran as written")
    return 0


if __name__ == "__main__":
    sys.exit(main())
