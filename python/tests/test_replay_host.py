"""The Python package on the host kernel set with numpy, against kda_replay --device host:
verify and commit outputs and states bitwise equal in both record modes (eager and deferred
commit in ring mode), on two example directories; bad inputs raise kda.Error naming the
argument; pool views export through DLPack; ragged and tree drafts (check_draft_shapes) against
dense verifies of the same requests.

Usage: test_replay_host.py --replay PATH/kda_replay [--library PATH/libkda_c.so] [--work DIR]
(the library also from $KDA_LIBRARY). Exit status 0 when every check passes.
"""

import argparse
import gc
import os
import sys
import tempfile

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import kda  # noqa: E402
from replay_check import NumpyTensors, check_examples, expect_error  # noqa: E402

EXAMPLES = {
    "default": [],
    "padded_safe_bf16": ["--pad-request", "--lower-bound", "-5", "--conv-dtype", "bf16",
                         "--no-rows", "--seed", "3", "--B", "3", "--T", "3"],
}


def check_dlpack_export(library, work):
    """Pool views are DLPack producers: numpy.from_dlpack sees the pool's memory (no copy), and
    the view's capsule keeps the backend alive."""
    model = kda.Model(num_layers=2, H=2, HV=4, K=64, V=64)
    be = kda.Backend(model=model, flags=["--max-running-requests", "2"], library=library)
    view = be.pool_view("ssm_state", 1)
    assert view.shape == (2, 4, 64, 64) and view.dtype == "float32", (view.shape, view.dtype)
    arr = be.pool_array("ssm_state", 1)
    arr[1, 2, 3, 4] = 42.0
    exported = np.from_dlpack(view)
    assert exported.shape == view.shape and exported[1, 2, 3, 4] == 42.0
    assert exported.__array_interface__["data"][0] == view.data_ptr
    capsule = view.__dlpack__()  # unconsumed: its destructor calls the deleter
    del capsule
    cursor = be.pool_array("conv_state", -1)
    assert cursor.shape == (2, 2, 3, 512) and cursor.dtype == np.uint16
    del be, view
    gc.collect()
    assert exported[1, 2, 3, 4] == 42.0  # the export keeps the pool alive
    del exported, arr, cursor
    gc.collect()
    assert not kda._dlpack._exported, "an exported managed tensor was never deleted"

    expect_error(lambda: kda.Backend(model=model, flags=["--speculative-num-draft-tokens", "0"],
                                     library=library),
                 kda.INVALID_ARGUMENT, "--speculative-num-draft-tokens")
    expect_error(lambda: kda.Backend(model=model, flags=["--no-such-flag"], library=library),
                 kda.INVALID_ARGUMENT, "'--no-such-flag' is not a flag of the module")
    expect_error(lambda: kda.Backend(model=model, device="tpu:0", library=library),
                 kda.INVALID_ARGUMENT, "create: device 'tpu:0' unsupported")
    expect_error(lambda: kda.Backend(model=kda.Model(num_layers=1, H=2, HV=3, K=64, V=64),
                                     library=library), kda.INVALID_ARGUMENT, "HV")
    try:
        kda.Backend(model=model, library="/nonexistent/libkda_c.so")
    except OSError as e:
        assert "/nonexistent/libkda_c.so (no such file)" in str(e), str(e)
    else:
        raise AssertionError("a missing library= path loaded something")


def _shape_backend(library, ring, topk=1, seed=0):
    """A one-layer host backend (H = 2, HV = 4, K = V = 64, T_max = 4, 3 requests + 1 slot) with
    seeded random weights and committed state in all 4 slots."""
    model = kda.Model(num_layers=1, H=2, HV=4, K=64, V=64)
    flags = ["--speculative-num-draft-tokens", "4", "--max-running-requests", "3",
             "--speculative-eagle-topk", str(topk)]
    if ring:
        flags += ["--enable-linear-replayssm-spec", "--linear-replayssm-cache-len", "8"]
    be = kda.Backend(model=model, flags=flags, extra_slots=1, library=library)
    rng = np.random.default_rng(seed)
    D = 2 * 2 * 64 + 4 * 64
    be._keep = [(rng.standard_normal(4) * 0.5).astype(np.float32),
                (rng.standard_normal(4 * 64) * 0.5).astype(np.float32),
                (rng.standard_normal((D, 4)) * 0.3).astype(np.float32)]
    be.set_layer_weights(0, *be._keep)
    for _ in range(4):
        be.allocate_slot()
    be.pool_array("ssm_state", 0)[...] = rng.standard_normal((4, 4, 64, 64)) * 0.2
    be.pool_array("conv_state", 0)[...] = _bf16_bits(rng, (4, 3, D), 0.5)
    return be


def _bf16_bits(rng, shape, scale):
    x = (rng.standard_normal(shape) * scale).astype(np.float32)
    return (x.view(np.uint32) >> 16).astype(np.uint16)


def _inputs(rng, N):
    D = 2 * 2 * 64 + 4 * 64
    return (_bf16_bits(rng, (N, D), 0.5), _bf16_bits(rng, (N, 4 * 64), 0.5),
            _bf16_bits(rng, (N, 4), 1.0))


def _verify(be, x, rows):
    """Verifies layer 0 on activation rows `rows` of inputs x; returns the output (garbage-
    filled before)."""
    qkv, a, b = (np.ascontiguousarray(t[rows]) for t in x)
    out = np.full((len(rows), 4, 64), 0x3F81, np.uint16)
    be.verify(0, kda.bf16(qkv), kda.bf16(a), kda.bf16(b), kda.bf16(out))
    return out


def check_draft_shapes(library):
    """Ragged and tree drafts through kda.Backend (kda_prepare_shaped, kda_commit_tree): each
    request of a ragged batch is a dense verify of that request alone with T = lengths[n], in
    outputs, state after the commit and (ring mode) its ring records; a tree whose parents form a
    chain is that chain, committed along the chain with commit_tree; bad shapes raise kda.Error
    naming them. Returns the number of checks."""
    checks = 0
    rng = np.random.default_rng(11)
    x = _inputs(rng, 12)
    for ring in (False, True):
        # Ragged: requests in slots 2 and 0 with 3 and 1 tokens (rows 0-2 and 3), commit 2 / 1.
        be = _shape_backend(library, ring)
        be.prepare(4, [2, 0], lengths=[3, 1])
        info = be.info()
        assert info["draft_shape"] == "ragged" and info["batch_tokens"] == 4, info
        out = _verify(be, x, [0, 1, 2, 3])
        be.commit(np.array([2, 1], np.int32))
        for slot, T, rows, n in ((2, 3, [0, 1, 2], 2), (0, 1, [3], 1)):
            alone = _shape_backend(library, ring)
            alone.prepare(T, [slot])
            assert alone.info()["draft_shape"] == "dense"
            out_alone = _verify(alone, x, rows)
            assert np.array_equal(out[rows[0]:rows[0] + T], out_alone), (ring, slot)
            if ring:
                for name in ("ring_rawk", "ring_rawv", "ring_g", "ring_beta"):
                    got = be.pool_array(name, 0)[slot, :, :T]
                    want = alone.pool_array(name, 0)[slot, :, :T]
                    assert np.array_equal(got, want), (name, slot)
            alone.commit(np.array([n], np.int32))
            for name in ("ssm_state", "conv_state"):
                assert np.array_equal(be.pool_array(name, 0)[slot],
                                      alone.pool_array(name, 0)[slot]), (ring, name, slot)
            checks += 1
        # Tree: a chain of 4 nodes per request is the dense chain; commit_tree along it.
        tree = _shape_backend(library, ring, topk=2)
        chain = _shape_backend(library, ring, topk=2)
        tree.prepare(4, [1, 3], parents=[-1, 0, 1, 2] * 2)
        assert tree.info()["draft_shape"] == "tree"
        chain.prepare(4, [1, 3])
        assert np.array_equal(_verify(tree, x, list(range(8))), _verify(chain, x, list(range(8))))
        tree.commit_tree(np.array([3, 2], np.int32), np.array([[0, 1, 2, 0], [0, 1, 0, 0]],
                                                                np.int32))
        chain.commit(np.array([3, 2], np.int32))
        for name in ("ssm_state", "conv_state"):
            assert np.array_equal(tree.pool_array(name, 0), chain.pool_array(name, 0)), name
        checks += 1
        # Bad shapes: named, nothing prepared.
        expect_error(lambda: be.prepare(4, [2, 0], lengths=[3, 1], parents=[-1, 0, 1, 2] * 2),
                     kda.INVALID_ARGUMENT, "lengths (a ragged chain) and parents (a tree)")
        expect_error(lambda: be.prepare(4, [2, 0], lengths=[3]), kda.INVALID_ARGUMENT,
                     "prepare: lengths has 1 entries, expected 2")
        expect_error(lambda: be.prepare(4, [2, 0], offsets=[0, 3, 4]), kda.INVALID_ARGUMENT,
                     "offsets were given without lengths")
        expect_error(lambda: be.prepare(4, [2, 0], lengths=[5, 1]), kda.INVALID_ARGUMENT,
                     "lengths")
        assert be.info()["batch_size"] == 0 and be.info()["draft_shape"] == "dense"
        expect_error(lambda: tree.commit_tree(np.array([1, 1], np.int32),
                                              np.zeros((2, 4), np.int32)),
                     kda.LIFECYCLE, "commit_tree: no verify round to commit")
        checks += 1
    return checks


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--replay", required=True, help="the kda_replay binary")
    p.add_argument("--library", default=None, help="libkda_c.so (default: $KDA_LIBRARY, ...)")
    p.add_argument("--work", default=None, help="scratch directory (default: a temporary one)")
    args = p.parse_args()
    work = args.work or tempfile.mkdtemp(prefix="kda_py_", dir=os.environ.get("TEST_TMPDIR"))
    print(f"kda: library {kda.load_library(args.library)._name}")

    checks = check_examples(args.replay, work, EXAMPLES, NumpyTensors, library=args.library)
    check_dlpack_export(args.library, work)
    shapes = check_draft_shapes(args.library)
    print(f"OK: {checks} replay checks bitwise equal to kda_replay --device host; DLPack "
          f"export and create errors checked; {shapes} draft-shape checks")
    return 0


if __name__ == "__main__":
    sys.exit(main())
