"""The Python package on the host kernel set with numpy, against kda_replay --device host:
verify and commit outputs and states bitwise equal in both record modes (eager and deferred
commit in ring mode), on two example directories; bad inputs raise kda.Error naming the
argument; pool views export through DLPack; ragged and tree drafts (check_draft_shapes) against
dense verifies of the same requests; tracked extends against extends of the prompt's head;
every argument of the wrong type or out of range raises TypeError / kda.Error naming it and
changes nothing (check_argument_errors).

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


def expect_type_error(fn, *needles):
    """fn() must raise TypeError (a wrong Python type) with every needle in its message."""
    try:
        fn()
    except TypeError as e:
        for n in needles:
            assert n in str(e), f"message {str(e)!r} does not contain {n!r}"
        return str(e)
    except Exception as e:  # noqa: BLE001 - report what came instead
        raise AssertionError(f"{type(e).__name__}: {e} (expected a TypeError containing "
                             f"{needles})") from None
    raise AssertionError(f"no TypeError (expected one containing {needles})")


def check_argument_errors(library):
    """Integers outside int32 (or their own range), strings with a NUL or a lone surrogate,
    floats and strings where ints belong, and other wrong types: each raises kda.Error
    (INVALID_ARGUMENT) or TypeError naming the argument, before any C call, and changes nothing
    (every pool tensor, the round state and the free slots). Returns the number of checks."""
    be = _shape_backend(library, ring=True, topk=2)
    be.release_slot(3)
    x = _inputs(np.random.default_rng(5), 4)

    def state():
        pools = {}
        for name in kda.POOL_TENSORS:
            try:
                pools[name] = be.pool_array(name, -1).tobytes()
            except kda.Error:
                pass  # absent in this mode
        return pools, be.round_state, be.info()["free_slots"]

    checks = 0

    def invalid(fn, *needles):
        nonlocal checks
        before = state()
        expect_error(fn, kda.INVALID_ARGUMENT, *needles)
        assert state() == before, needles
        checks += 1

    def wrong_type(fn, *needles):
        nonlocal checks
        before = state()
        expect_type_error(fn, *needles)
        assert state() == before, needles
        checks += 1

    big = 2 ** 32
    invalid(lambda: be.release_slot(big + 2), "release_slot: slot = 4294967298 out of range")
    invalid(lambda: be.release_slot(-1), "release_slot: slot = -1 out of range [0, 4)")
    invalid(lambda: be.copy_slot(big, 1), "copy_slot: src = 4294967296")
    invalid(lambda: be.copy_slot(0, big + 1), "copy_slot: dst = 4294967297")
    invalid(lambda: be.prepare(T=big + 1, slots=[0]), "prepare: T = 4294967297 out of range")
    invalid(lambda: be.prepare(T=0, slots=[0]), "prepare: T = 0 out of range [1, 4]")
    invalid(lambda: be.prepare(T=4, slots=[big + 1]), "prepare: slots[0] = 4294967297")
    invalid(lambda: be.prepare(T=4, slots=[0, 1], lengths=[1, big + 1]),
            "prepare: lengths[1] = 4294967297")
    invalid(lambda: be.prepare(T=4, slots=[0], rows=[-big]), "prepare: rows[0] = -4294967296")
    invalid(lambda: be.prepare(T=4, slots=[0], lengths=[1], offsets=[0, big]),
            "prepare: offsets[1] = 4294967296")
    invalid(lambda: be.prepare(T=-3, slots=[0], parents=[-1, 0, 1]),
            "prepare: T = -3 out of range [1, 4]")
    invalid(lambda: be.prepare(T=2, slots=[0], parents=[-1, big]),
            "prepare: parents[1] = 4294967296")
    invalid(lambda: be.prepare_extend(T=big, slots=[0]), "prepare_extend: T = 4294967296")
    invalid(lambda: be.prepare_extend(T=2, slots=[0], track_slots=[big], track_steps=[0]),
            "prepare_extend: track_slots[0] = 4294967296")
    invalid(lambda: be.materialize([big + 2]), "materialize: slots[0] = 4294967298")
    invalid(lambda: be.verify(big, *[kda.bf16(t) for t in x], kda.bf16(x[0])),
            "verify: layer = 4294967296 out of range [0, 1)")
    invalid(lambda: be.extend(-1, *[kda.bf16(t) for t in x], kda.bf16(x[0])),
            "extend: layer = -1 out of range [0, 1)")
    invalid(lambda: be.set_layer_weights(big, *be._keep), "set_layer_weights: layer = 4294967296")
    invalid(lambda: be.pool_view("ssm_state", big), "pool_view: layer = 4294967296")
    invalid(lambda: be.pool_view("ssm_state\x00zz"), "pool_view: name:", "NUL character")
    invalid(lambda: be.pool_view("ssm_state\ud800"), "pool_view: name:",
            "not encodable as UTF-8")
    invalid(lambda: be.allocate_slot(stream=-1), "allocate_slot: stream = -1 out of range")
    invalid(lambda: be.verify(0, *[kda.bf16(t) for t in x], kda.bf16(x[0]), stream=2 ** 64),
            "verify(layer 0): stream = 18446744073709551616 out of range")
    # A tree prepare's bad T names T's range, not a parents count.
    invalid(lambda: be.prepare(T=-3, slots=[0], parents=[-1]), "prepare: T = -3 out of range")

    wrong_type(lambda: be.prepare(T=2.9, slots=[0]), "prepare: T: expected an int, got float")
    wrong_type(lambda: be.prepare(T=None, slots=[0]), "prepare: T: expected an int, got NoneType")
    wrong_type(lambda: be.prepare(T=True, slots=[0]), "prepare: T: expected an int, got bool")
    wrong_type(lambda: be.prepare(T=4, slots="12"),
               "prepare: slots: expected a sequence of ints, got str")
    wrong_type(lambda: be.prepare(T=4, slots=["0"]), "prepare: slots[0]: expected an int, got str")
    wrong_type(lambda: be.prepare(T=4, slots=["x"]), "prepare: slots[0]: expected an int, got str")
    wrong_type(lambda: be.prepare(T=4, slots={0, 1}),
               "prepare: slots: expected a sequence of ints, got set")
    wrong_type(lambda: be.prepare(T=4, slots=np.array([0.0, 1.0])),
               "prepare: slots[0]: expected an int, got float64")
    wrong_type(lambda: be.prepare(T=4, slots=[0], lengths=[1.0]),
               "prepare: lengths[0]: expected an int, got float")
    wrong_type(lambda: be.prepare(T=4, slots=[0], stream="x"),
               "prepare: stream: expected an int, got str")
    wrong_type(lambda: be.release_slot("0"), "release_slot: slot: expected an int, got str")
    wrong_type(lambda: be.release_slot(2.0), "release_slot: slot: expected an int, got float")
    wrong_type(lambda: be.copy_slot(0, None), "copy_slot: dst: expected an int, got NoneType")
    wrong_type(lambda: be.materialize(0), "materialize: slots: expected a sequence of ints")
    wrong_type(lambda: be.verify(0.0, *[kda.bf16(t) for t in x], kda.bf16(x[0])),
               "verify: layer: expected an int, got float")
    wrong_type(lambda: be.verify(0, *[kda.bf16(t) for t in x], [1, 2]),
               "verify(layer 0): out: expected a tensor with __dlpack__", "got list")
    wrong_type(lambda: be.commit("1"), "commit: accepted_lengths: expected a tensor")
    wrong_type(lambda: be.pool_view(b"ssm_state"), "pool_view: name: expected a str, got bytes")
    wrong_type(lambda: be.pool_view("ssm_state", "0"), "pool_view: layer: expected an int")

    # create: the model, flags, device and options.
    model = kda.Model(num_layers=1, H=2, HV=4, K=64, V=64)
    flags = ["--speculative-num-draft-tokens", "4"]

    def create(**kw):
        args = dict(model=model, flags=flags, library=library)
        args.update(kw)
        return kda.Backend(**args)

    invalid(lambda: create(device="host\x00junk"), "create: device:", "NUL character")
    invalid(lambda: create(flags=["--speculative-num-draft-tokens", "2\x003"]),
            "create: flags[1]:", "NUL character")
    invalid(lambda: create(flags=["--speculative-num-draft-tokens", "\ud800"]),
            "create: flags[1]:", "not encodable as UTF-8")
    invalid(lambda: create(model=kda.Model(num_layers=big + 1, H=2, HV=4, K=64, V=64)),
            "create: model.num_layers = 4294967297 out of range")
    invalid(lambda: create(model=kda.Model(num_layers=1, H=0, HV=4, K=64, V=64)),
            "create: model.H = 0 out of range [1, 2147483647]")
    invalid(lambda: create(extra_slots=big), "create: extra_slots = 4294967296 out of range")
    invalid(lambda: create(extra_slots=-1), "create: extra_slots = -1 out of range")
    invalid(lambda: create(memory_budget_bytes=2 ** 63), "create: memory_budget_bytes = ")
    invalid(lambda: create(model=dict(num_layers=1, H=2, HV=4, K=64, V=64, heads=3)),
            "create: model: unknown field 'heads'")
    invalid(lambda: create(model=dict(num_layers=1, H=2, HV=4, K=64)),
            "create: model: missing field 'V'")
    invalid(lambda: create(model=kda.Model(num_layers=1, H=2, HV=4, K=64, V=64, has_conv_bias=2)),
            "create: model.has_conv_bias = 2 out of range [0, 1]")
    wrong_type(lambda: create(model=kda.Model(num_layers=1.0, H=2, HV=4, K=64, V=64)),
               "create: model.num_layers: expected an int, got float")
    wrong_type(lambda: create(model=kda.Model(num_layers=1, H=2, HV=4, K=64, V=64, gate=0)),
               "create: model.gate: expected a str, got int")
    wrong_type(lambda: create(model=kda.Model(num_layers=1, H=2, HV=4, K=64, V=64,
                                              lower_bound="-5")),
               "create: model.lower_bound: expected a float, got str")
    wrong_type(lambda: create(model=[1, 2]), "create: model: expected a kda.Model or a dict")
    wrong_type(lambda: create(flags="--speculative-num-draft-tokens"),
               "create: flags: expected a sequence of str, got str")
    wrong_type(lambda: create(flags=["--speculative-num-draft-tokens", 4]),
               "create: flags[1]: expected a str, got int")
    wrong_type(lambda: create(device=None), "create: device: expected a str, got NoneType")
    wrong_type(lambda: create(extra_slots=1.5), "create: extra_slots: expected an int, got float")
    invalid(lambda: create(library="libkda_c.so\x00.bak"), "create: library:", "NUL character")
    wrong_type(lambda: create(library=3), "create: library: expected a path")
    be.close()
    return checks


def check_extend(library):
    """Extend through kda.Backend: a tracked extend's track slot equals an extend of the first
    k + 1 prompt tokens alone, and its outputs and request slots equal the untracked extend's.
    Returns the number of checks."""
    rng = np.random.default_rng(21)
    checks = 0
    for ring in (False, True):
        x = _inputs(rng, 12)  # 2 requests of 6 prompt tokens
        tracked, plain, head = (_shape_backend(library, ring, seed=4) for _ in range(3))
        tracked.prepare_extend(6, [1, 0], track_slots=[3, -1], track_steps=[2, -1])
        out_tracked = _extend(tracked, x, list(range(12)))
        plain.prepare_extend(6, [1, 0])
        assert np.array_equal(out_tracked, _extend(plain, x, list(range(12))))
        head.prepare_extend(3, [1])  # request 0's first 3 tokens alone
        _extend(head, x, [0, 1, 2])
        for name in ("ssm_state", "conv_state"):
            for slot in (0, 1):
                assert np.array_equal(tracked.pool_array(name, 0)[slot],
                                      plain.pool_array(name, 0)[slot]), (ring, name, slot)
            assert np.array_equal(tracked.pool_array(name, 0)[3],
                                  head.pool_array(name, 0)[1]), (ring, name)
            assert not np.array_equal(tracked.pool_array(name, 0)[3],
                                      plain.pool_array(name, 0)[3]), (ring, name)
        checks += 1
    return checks


def _extend(be, x, rows):
    """Extends layer 0 on activation rows `rows` of inputs x; returns the output."""
    qkv, a, b = (np.ascontiguousarray(t[rows]) for t in x)
    out = np.full((len(rows), 4, 64), 0x3F81, np.uint16)
    be.extend(0, kda.bf16(qkv), kda.bf16(a), kda.bf16(b), kda.bf16(out))
    return out


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
    extends = check_extend(args.library)
    arguments = check_argument_errors(args.library)
    print(f"OK: {checks} replay checks bitwise equal to kda_replay --device host; DLPack "
          f"export and create errors checked; {shapes} draft-shape checks; {extends} extend "
          f"checks; {arguments} argument checks")
    return 0


if __name__ == "__main__":
    sys.exit(main())
