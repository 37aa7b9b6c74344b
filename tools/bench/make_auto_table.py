#!/usr/bin/env python3
"""make_auto_table.py: the auto tables of one card (dispatch/auto_tables/), from kda_bench step CSVs.

Two tables, both from the step rows (phase "step") of `kda_bench --phases step ... --out X.csv`
runs on one card, each measurement the mean over the runs:

--table commit (default): --kda-deferred-commit auto's table (dispatch/commit_policy.cc includes
dispatch/auto_tables/<card>.def). Per (HV, K, V, T, B): the fused+ring step with the eager commit
(variant "fused+ring"), with the deferred commit ("fused+ring+deferred") and the gemm-only step
("gemm-only"); rows with fast outputs (numerics "fast") are left out:

    KDA_AUTO_ROW(HV, K, V, T, B, eager_us, deferred_us, gemm_only_us)

--table numerics: --kda-verify-numerics auto's table (dispatch/numerics_policy.cc includes
dispatch/auto_tables/<card>_numerics.def). Per (H, HV, K, V, T, B): the fused+ring step with the
eager commit (variant "fused+ring") with exact and with fast outputs (numerics "exact" / "fast"),
and the gemm-only step; pick is kFast where fast's KDA share (step - gemm-only step) is below
exact's x (1 - MIN_GAIN_PCT / 100) on the printed (rounded) numbers, else kExact (the rule of
dispatch/numerics_policy.h's fast_outputs_pay, kFastMinGainPct):

    KDA_NUMERICS_ROW(H, HV, K, V, T, B, exact_us, fast_us, gemm_only_us, pick)

With no CSV the numerics table has no rows (no measurement yet: auto keeps the exact outputs).

--table lazy: --kda-deferred-commit auto's lazy write-back table (dispatch/lazy_policy.cc includes
dispatch/auto_tables/<card>_lazy.def). Per (H, HV, K, V, T, B), on the runs' ring of --ring-len L
records (kda_bench's default: 16 for T <= 8): the fused+ring step with exact and with fast outputs,
each with the eager and the deferred commit, the lazy step ("fused+ring+lazy", fast) and the
gemm-only step. The rule (dispatch/lazy_policy.h's lazy_write_back_pays, kLazyMinGainPct) reads
the printed numbers: lazy where its KDA share is below the best other step's x 0.99, the other
steps being the ones the engine's numerics request could run (fast: the fast ones; auto: all four).
The same rows decide a deferred backend's form under --kda-verify-numerics auto
(lazy_policy.h's u_free_deferred_pays): u-free (fast outputs) where the fast deferred step's KDA
share is below the exact deferred one's x 0.99, else u records (exact outputs):

    KDA_LAZY_ROW(H, HV, K, V, L, T, B, exact_eager_us, exact_deferred_us, fast_eager_us,
                 fast_deferred_us, lazy_us, gemm_only_us)

With no CSV the lazy table has no rows (no measurement yet: auto never goes lazy).

CSV columns read (kda_bench's step CSV; others are ignored): phase, variant, H, HV, K, V, T, B,
median_us (the step, us), and numerics (exact|fast; required by --table numerics, optional for
--table commit where an absent or empty value means exact; gemm-only rows may leave it empty).

The file's first lines name this command, so tools/bench/auto_table_test.sh can regenerate it and
prove that the table is the CSVs' (nobody edits it by hand).

Usage: make_auto_table.py [--table commit] --card NAME CSV [CSV ...] > dispatch/auto_tables/NAME.def
       make_auto_table.py --table numerics --card NAME [CSV ...] > dispatch/auto_tables/NAME_numerics.def
       make_auto_table.py --table lazy --card NAME [--ring-len L] [CSV ...] > dispatch/auto_tables/NAME_lazy.def
"""
import argparse
import collections
import csv
import sys

COMMIT_KEY = ("HV", "K", "V", "T", "B")
NUMERICS_KEY = ("H", "HV", "K", "V", "T", "B")
# Fast's KDA share must beat exact's by more than this percentage (kFastMinGainPct).
MIN_GAIN_PCT = 1.0


def read_rows(paths, key_columns, numerics_required):
    """key -> (variant, numerics) -> [median_us per run]; numerics "" reads as "exact"."""
    table = collections.defaultdict(lambda: collections.defaultdict(list))
    for path in paths:
        with open(path, newline="") as f:
            reader = csv.DictReader(f)
            fields = reader.fieldnames or []
            need = key_columns + ("phase", "variant", "median_us")
            if numerics_required:
                need += ("numerics",)
            missing = [c for c in need if c not in fields]
            if missing:
                sys.exit(f"make_auto_table: {path}: no column(s) {', '.join(missing)} "
                         "(a kda_bench step CSV is needed)")
            for row in reader:
                if row["phase"] != "step":
                    continue
                numerics = (row.get("numerics") or "exact").strip()
                if numerics not in ("exact", "fast"):
                    sys.exit(f"make_auto_table: {path}: numerics '{numerics}' (expected exact or "
                             "fast)")
                key = tuple(int(row[c]) for c in key_columns)
                table[key][(row["variant"], numerics)].append(float(row["median_us"]))
    return table


def mean(xs):
    return sum(xs) / len(xs)


def runs_text(counts):
    runs = sorted(set(counts))
    return str(runs[0]) if len(runs) == 1 else f"{runs[0]}..{runs[-1]}"


def series(key, by, wanted):
    """The runs of each (label, variant, numerics) in `wanted` at `key`, or None if one is missing;
    exits when their run counts disagree."""
    found = [by.get((variant, numerics)) for _, variant, numerics in wanted]
    if not all(found):
        return None
    if len({len(runs) for runs in found}) != 1:
        counts = ", ".join(f"{len(runs)} {label}" for (label, _, _), runs in zip(wanted, found))
        sys.exit(f"make_auto_table: {key}: runs disagree ({counts} rows)")
    return found


def commit_table(args, out):
    table = read_rows(args.csv, COMMIT_KEY, numerics_required=False)
    rows = []
    for key in sorted(table):
        found = series(key, table[key], (("eager", "fused+ring", "exact"),
                                         ("deferred", "fused+ring+deferred", "exact"),
                                         ("gemm-only", "gemm-only", "exact")))
        if found is None:
            continue
        eager, deferred, gemm = found
        rows.append((key, mean(eager), mean(deferred), mean(gemm), len(eager)))
    if not rows:
        sys.exit("make_auto_table: no (T, B) with fused+ring, fused+ring+deferred and gemm-only steps")
    out.write(f"// generated by: tools/bench/make_auto_table.py --card {args.card} "
              f"{' '.join(args.csv)}\n")
    out.write("// --kda-deferred-commit auto's measurements on this card (dispatch/commit_policy.cc):\n"
              "// the 20-layer step of kda_bench --phases step, fused+ring, eager and deferred commit,\n"
              f"// mean of {runs_text(r[4] for r in rows)} runs. Data: do not edit; regenerate.\n")
    out.write("// KDA_AUTO_ROW(HV, K, V, T, B, eager step us, deferred step us, gemm-only step us)\n")
    for key, e, d, g, _ in rows:
        out.write(f"KDA_AUTO_ROW({', '.join(str(k) for k in key)}, {e:.1f}, {d:.1f}, {g:.1f})\n")


def fast_pays(exact_us, fast_us, gemm_us):
    """dispatch/numerics_policy.cc's fast_outputs_pay, in the same double arithmetic."""
    return (fast_us - gemm_us) < (exact_us - gemm_us) * (1.0 - MIN_GAIN_PCT / 100.0)


def numerics_table(args, out):
    table = read_rows(args.csv, NUMERICS_KEY, numerics_required=True)
    rows = []
    for key in sorted(table):
        found = series(key, table[key], (("exact", "fused+ring", "exact"),
                                         ("fast", "fused+ring", "fast"),
                                         ("gemm-only", "gemm-only", "exact")))
        if found is None:
            continue
        exact, fast, gemm = found
        # The pick is made on the printed numbers, so the C++ rule reads the same decision.
        e, f, g = (float(f"{mean(x):.1f}") for x in (exact, fast, gemm))
        rows.append((key, e, f, g, "kFast" if fast_pays(e, f, g) else "kExact", len(exact)))
    if args.csv and not rows:
        sys.exit("make_auto_table: no (H, HV, K, V, T, B) with fused+ring exact and fast steps and "
                 "a gemm-only step")
    command = f"tools/bench/make_auto_table.py --table numerics --card {args.card}"
    out.write(f"// generated by: {' '.join([command] + args.csv)}\n")
    out.write("// --kda-verify-numerics auto's measurements on this card "
              "(dispatch/numerics_policy.cc):\n"
              "// the 20-layer step of kda_bench --phases step, fused+ring with the eager commit, "
              "exact and\n"
              "// fast outputs; pick: kFast where fast's KDA share (step - gemm-only step) is below "
              f"exact's\n// x {1.0 - MIN_GAIN_PCT / 100.0:.2f}. ")
    if rows:
        out.write(f"Mean of {runs_text(r[5] for r in rows)} runs. Data: do not edit; regenerate.\n")
    else:
        out.write("No measurement yet: no rows, auto keeps the exact outputs.\n"
                  "// Data: do not edit; regenerate.\n")
    out.write("// KDA_NUMERICS_ROW(H, HV, K, V, T, B, exact step us, fast step us, gemm-only step us, "
              "pick)\n")
    for key, e, f, g, pick, _ in rows:
        out.write(f"KDA_NUMERICS_ROW({', '.join(str(k) for k in key)}, {e:.1f}, {f:.1f}, {g:.1f}, "
                  f"{pick})\n")


def lazy_table(args, out):
    table = read_rows(args.csv, NUMERICS_KEY, numerics_required=True)
    rows = []
    for key in sorted(table):
        found = series(key, table[key], (("exact eager", "fused+ring", "exact"),
                                         ("exact deferred", "fused+ring+deferred", "exact"),
                                         ("fast eager", "fused+ring", "fast"),
                                         ("fast deferred", "fused+ring+deferred", "fast"),
                                         ("lazy", "fused+ring+lazy", "fast"),
                                         ("gemm-only", "gemm-only", "exact")))
        if found is None:
            continue
        rows.append((key, [mean(x) for x in found], len(found[0])))
    if args.csv and not rows:
        sys.exit("make_auto_table: no (H, HV, K, V, T, B) with exact and fast eager and deferred "
                 "steps, a lazy step and a gemm-only step")
    command = f"tools/bench/make_auto_table.py --table lazy --card {args.card}"
    if args.ring_len is not None:
        command += f" --ring-len {args.ring_len}"
    out.write(f"// generated by: {' '.join([command] + args.csv)}\n")
    out.write("// --kda-deferred-commit auto's lazy write-back measurements on this card "
              "(dispatch/lazy_policy.cc):\n"
              "// the 20-layer step of kda_bench --phases step, fused+ring, exact and fast outputs "
              "with the eager\n"
              "// and the deferred commit, and the lazy write-back (fast), on a ring of L records; "
              "lazy where its\n"
              "// KDA share is below the best other step's x "
              f"{1.0 - MIN_GAIN_PCT / 100.0:.2f}; under numerics auto, a deferred backend is\n"
              "// u-free where the fast deferred step's share is below the exact deferred one's x "
              f"{1.0 - MIN_GAIN_PCT / 100.0:.2f}\n// (dispatch/lazy_policy.h). ")
    if rows:
        out.write(f"Mean of {runs_text(r[2] for r in rows)} runs.\n// Data: do not edit; "
                  "regenerate.\n")
    else:
        out.write("No measurement yet:\n// no rows, auto never goes lazy. Data: do not edit; "
                  "regenerate.\n")
    out.write("// KDA_LAZY_ROW(H, HV, K, V, L, T, B, exact eager, exact deferred, fast eager, "
              "fast deferred, lazy, gemm-only; step us)\n")
    L = args.ring_len if args.ring_len is not None else 16
    for key, means, _ in rows:
        H, HV, K, V, T, B = key
        cells = ", ".join(f"{m:.1f}" for m in means)
        out.write(f"KDA_LAZY_ROW({H}, {HV}, {K}, {V}, {L}, {T}, {B}, {cells})\n")


def main(argv):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--table", choices=("commit", "numerics", "lazy"), default="commit",
                        help="which auto table (default commit)")
    parser.add_argument("--card", required=True, help="card name, e.g. h100")
    parser.add_argument("--ring-len", type=int, default=None,
                        help="lazy table: the runs' ring length L (default 16, kda_bench's for T <= 8)")
    parser.add_argument("csv", nargs="*", help="kda_bench --phases step CSVs of that card")
    args = parser.parse_args(argv)
    if args.ring_len is not None and (args.table != "lazy" or args.ring_len < 2):
        parser.error("--ring-len: only with --table lazy, and at least 2")
    if args.table == "commit":
        if not args.csv:
            parser.error("--table commit needs at least one CSV")
        commit_table(args, sys.stdout)
    elif args.table == "numerics":
        numerics_table(args, sys.stdout)
    else:
        lazy_table(args, sys.stdout)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
