"""Engine integration (issue 58) through the Python package on the host kernel set, with numpy:

* kda.ops on SGLang-shaped buffers (an engine's own [layers, size + 1, ...] pool in contract §2's
  layouts, int32 index arrays) is bitwise kda.Backend over random rounds: dense, ragged and tree
  drafts; snapshot, eager ring, deferred and lazy ring mode; padding rows, explicit rows; then
  materialize (check_ops_sglang);
* an external-pool Backend (the engine's numpy tensors, padded pitches, spare slots), a
  NumpyAllocator-hooked Backend and one with both are bitwise the owning Backend over random
  rounds, with every allocated byte returned on close (check_engine_memory);
* bad external tensors (wrong shape, dtype, stride, pitch, too small, overlapping, unknown name,
  not a tensor) raise kda.Error / TypeError naming external_pool.<tensor>, allocate and write
  nothing (check_external_errors);
* pool views keep the backend's memory alive: after close() every call raises LIFECYCLE, views and
  arrays made from them still read and write live memory, and the memory (and the allocator's
  blocks) goes when the last of them does (check_lifetime);
* memory_report's bytes per part (check_memory_report);
* torch tensors are taken from their metadata without __dlpack__ (a stand-in torch module made of
  numpy arrays), kda.via_dlpack forces the capsule, stream=None is torch's current stream on CUDA
  (check_torch_path);
* kda.ops argument errors name the argument and change nothing (check_ops_errors);
* --kda-verify-numerics (a Backend's flag) and kda.ops.verify's numerics reach each verify's
  DispatchInfo: its outputs' numerics and their reason (check_numerics).

Usage: test_engine_host.py [--library PATH/libkda_c.so] [--seed N]. Exit status 0 when every
check passes.
"""

import argparse
import gc
import os
import sys
import types

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import kda  # noqa: E402

L_, H, HV, K, V, T_MAX, R = 2, 2, 4, 64, 64, 4, 3
S = R + 1  # extra_slots = 1
RING_LEN = 8
D = 2 * H * K + HV * V
SLOT_TENSORS = ("conv_state", "ssm_state", "ring_rawv", "ring_rawk", "ring_g", "ring_beta",
                "ring_u", "ring_pending")


def bits(rng, shape, scale):
    x = (rng.standard_normal(shape) * scale).astype(np.float32)
    return (x.view(np.uint32) >> 16).astype(np.uint16)


def flags(ring, deferred, topk=1, lazy=False):
    commit = "lazy" if lazy else "on" if deferred else "off"
    f = ["--speculative-num-draft-tokens", str(T_MAX), "--max-running-requests", str(R),
         "--linear-replayssm-cache-len", str(RING_LEN), "--speculative-eagle-topk", str(topk),
         "--kda-fused-ring-max-batch", "2", "--kda-deferred-commit", commit]
    return f + (["--enable-linear-replayssm-spec"] if ring else [])


def model():
    return kda.Model(num_layers=L_, H=H, HV=HV, K=K, V=V, has_conv_bias=True)


def weights(seed):
    rng = np.random.default_rng(seed)
    return [((rng.standard_normal(HV) * 0.5).astype(np.float32),
             (rng.standard_normal(HV * K) * 0.5).astype(np.float32),
             (rng.standard_normal((D, 4)) * 0.3).astype(np.float32),
             (rng.standard_normal(D) * 0.1).astype(np.float32)) for _ in range(L_)]


def pool_shapes(ring, deferred, slots=S, rows=R, steps=T_MAX, cursor=False, lazy=False):
    """name -> (dtype, shape) of the pool tensors of a mode ([layers, ...]); the ring cursor and
    pending counts with the deferred commit (an eager ops call takes none), or with `cursor`
    in ring mode (a backend's pool has them); the u records with the deferred commit but the lazy
    write-back."""
    s = {"conv_state": (np.uint16, (L_, slots, 3, D)),
         "ssm_state": (np.float32, (L_, slots, HV, V, K)),
         "conv_window": (np.uint16, (L_, rows, steps, 3, D)),
         "qkv_act": (np.uint16, (rows * steps, D))}
    if ring:
        s.update({"ring_rawv": (np.uint16, (L_, slots, HV, RING_LEN, V)),
                  "ring_rawk": (np.uint16, (L_, slots, H, RING_LEN, K)),
                  "ring_g": (np.float32, (L_, slots, HV, RING_LEN, K)),
                  "ring_beta": (np.float32, (L_, slots, HV, RING_LEN))})
        if deferred or cursor:
            s.update({"ring_cursor": (np.int32, (slots,)),
                      "ring_pending": (np.int32, (L_, slots))})
        if deferred and not lazy:
            s["ring_u"] = (np.float32, (L_, slots, HV, RING_LEN, V))
    else:
        s["snapshots"] = (np.float32, (L_, rows, steps, HV, V, K))
    return s


def wrap(name, arr):
    return kda.bf16(arr) if arr.dtype == np.uint16 else arr


def make_backend(library, ring, deferred, topk, seed=5, lazy=False, **kw):
    be = kda.Backend(model=model(), flags=flags(ring, deferred, topk, lazy), extra_slots=1,
                     library=library, **kw)
    be._w = weights(100)
    for layer, w in enumerate(be._w):
        be.set_layer_weights(layer, *w)
    return be


def fill_backend(be, ring, seed):
    """Seeded state, scratch and records (never the engine's cursor / pending counts)."""
    rng = np.random.default_rng(seed)
    for name, (dtype, shape) in pool_shapes(ring, False).items():
        if name == "qkv_act":
            continue
        arr = be.pool_array(name)
        arr[...] = bits(rng, arr.shape, 0.5) if dtype == np.uint16 else \
            (rng.standard_normal(arr.shape) * 0.2).astype(dtype)


class Round:
    def __init__(self, rng, topk, S_=S):
        B = int(rng.integers(1, R + 1))
        self.slots = [int(x) for x in rng.permutation(S_)[:B]]
        if B > 1 and rng.integers(4) == 0:
            self.slots[int(rng.integers(B))] = -1
        self.rows = [int(x) for x in rng.permutation(R)[:B]] if rng.integers(2) else None
        self.tree = topk > 1
        self.T = int(rng.integers(2, T_MAX + 1)) if self.tree else int(rng.integers(1, T_MAX + 1))
        self.lengths = None
        self.parents = None
        self.paths = None
        if self.tree:
            self.parents, self.paths, self.accepted = [], [], []
            for _ in range(B):
                par, kids = [-1], [0] * self.T
                for j in range(1, self.T):
                    while True:
                        p = int(rng.integers(j))
                        if kids[p] < topk:
                            break
                    kids[p] += 1
                    par.append(p)
                node, path = int(rng.integers(self.T)), []
                while node >= 0:
                    path.insert(0, node)
                    node = par[node]
                self.accepted.append(len(path))
                self.parents += par
                self.paths += path + [0] * (self.T - len(path))
            self.N = B * self.T
        else:
            ragged = bool(rng.integers(2))
            lens = [int(rng.integers(1, self.T + 1)) if ragged else self.T for _ in range(B)]
            self.lengths = lens if ragged else None
            self.accepted = [int(rng.integers(1, n + 1)) for n in lens]
            self.N = sum(lens)
        self.B = B
        self.inputs = [(bits(rng, (self.N, D), 0.5), bits(rng, (self.N, HV * K), 0.5),
                        bits(rng, (self.N, HV), 1.0)) for _ in range(L_)]
        self.garbage = bits(rng, (self.N, HV, V), 3.0)


def backend_round(be, r):
    """Runs a round on a Backend; returns every layer's output."""
    kw = {}
    if r.lengths is not None:
        kw["lengths"] = r.lengths
    if r.parents is not None:
        kw["parents"] = r.parents
    be.prepare(r.T, r.slots, r.rows, **kw)
    outs = []
    for layer in range(L_):
        out = r.garbage.copy()
        q, a, b = r.inputs[layer]
        be.verify(layer, kda.bf16(q), kda.bf16(a), kda.bf16(b), kda.bf16(out))
        outs.append(out)
    acc = np.array(r.accepted, np.int32)
    if r.tree:
        be.commit_tree(acc, np.array(r.paths, np.int32).reshape(r.B, r.T))
    else:
        be.commit(acc)
    be.check_device_errors()
    return outs


def same(name, got, want):
    got, want = np.ascontiguousarray(got), np.ascontiguousarray(want)
    assert got.shape == want.shape, (name, got.shape, want.shape)
    if got.tobytes() != want.tobytes():
        diff = np.flatnonzero(got.view(np.uint8) != want.view(np.uint8))
        raise AssertionError(f"{name}: not bitwise equal ({diff.size} bytes differ)")


def compare_pools(be, pool, ring, deferred, what, lazy=False):
    """The engine's pool (first S slots) against the Backend's pool tensors."""
    for name in pool_shapes(ring, deferred, lazy=lazy):
        if name == "qkv_act":
            continue
        got = pool[name]
        if name in SLOT_TENSORS:
            got = got[:, :S]
        elif name == "ring_cursor":
            got = got[:S]
        same(f"{what}: {name}", got, be.pool_array(name))


MODES = [("snapshot", False, False, 1), ("ring eager", True, False, 1),
         ("ring deferred", True, True, 1), ("snapshot trees", False, False, 2),
         ("ring trees", True, False, 2)]


def check_ops_sglang(library, seed):
    """kda.ops on SGLang-shaped numpy buffers is bitwise kda.Backend (and the lazy write-back,
    contract §11: its fast outputs too, the host's)."""
    checks = 0
    for what, ring, deferred, topk in MODES + [("ring lazy", True, True, 1)]:
        lazy = what == "ring lazy"
        be = make_backend(library, ring, deferred, topk, lazy=lazy)
        for _ in range(S):
            be.allocate_slot()
        fill_backend(be, ring, seed)
        # The engine's pool: size + 1 slots (SGLang's MambaPool keeps a dummy last one), a copy
        # of the backend's state, scratch and records.
        pool = {}
        for name, (dtype, shape) in pool_shapes(ring, deferred, slots=S + 1, lazy=lazy).items():
            arr = np.zeros(shape, dtype)
            if name == "qkv_act":
                pool[name] = arr
                continue
            src = be.pool_array(name)
            if name in SLOT_TENSORS:
                arr[:, :S] = src
            elif name == "ring_cursor":
                arr[:S] = src
            else:
                arr[...] = src
            pool[name] = arr
        state = {n: wrap(n, a) for n, a in pool.items()}
        w = be._w
        rng = np.random.default_rng(seed + 1)
        for rnd in range(8):
            r = Round(rng, topk)
            outs = backend_round(be, r)
            slots = np.array(r.slots, np.int32)
            rows = np.array(r.rows if r.rows is not None else range(r.B), np.int32)
            qsl = None
            if r.lengths is not None:
                qsl = np.concatenate([[0], np.cumsum(r.lengths)]).astype(np.int32)
            parents = np.array(r.parents, np.int32).reshape(r.B, r.T) if r.tree else None
            for layer in range(L_):
                out = r.garbage.copy()
                q, a, b = r.inputs[layer]
                info = kda.ops.verify(kda.bf16(q), kda.bf16(a), kda.bf16(b), kda.bf16(out),
                                      A_log=w[layer][0], dt_bias=w[layer][1],
                                      conv_weight=w[layer][2], conv_bias=w[layer][3],
                                      state=kda.ops.layer(state, layer), slots=slots, rows=rows,
                                      T=r.T, query_start_loc=qsl, parents=parents,
                                      fused_ring_max_batch=2, lazy=lazy, library=library)
                assert isinstance(info, kda.DispatchInfo) and info.reason, info
                if lazy:  # the lazy verify: fast outputs over the pending history
                    assert info.fast_outputs and info.numerics_reason == "lazy_history", info
                else:  # the host platform: ring mode unfused, so auto's outputs stay exact
                    assert not info.fast_outputs and info.numerics_reason.startswith("exact_"), info
                same(f"{what} round {rnd} layer {layer}: out", out, outs[layer])
            flag = np.zeros(1, np.int32)
            ci = kda.ops.commit(
                state=state, slots=slots, rows=rows, T=r.T,
                accepted_lengths=np.array(r.accepted, np.int32), query_start_loc=qsl,
                parents=parents,
                accepted_paths=np.array(r.paths, np.int32).reshape(r.B, r.T) if r.tree else None,
                checked_accepted=np.zeros(r.B, np.int32), error_flag=flag, lazy=lazy,
                library=library)
            assert ci.deferred == deferred and ci.reason == (
                "lazy_record" if lazy else "deferred_record" if deferred else "ring_fold" if ring
                else "snapshot_copy"), ci
            assert flag[0] == 0, flag
            compare_pools(be, pool, ring, deferred, f"{what} round {rnd}", lazy)
            checks += 1
        if deferred:
            every = list(range(S))
            be.materialize(every)
            kda.ops.materialize(state=state, slots=np.array(every, np.int32), library=library)
            compare_pools(be, pool, ring, deferred, f"{what} materialized", lazy)
            assert not pool["ring_pending"][:, :S].any()
        # The dummy slot is never touched.
        for name in SLOT_TENSORS:
            if name in pool:
                assert not pool[name][:, S].any(), (what, name)
        be.close()
    return checks


def padded(dtype, shape, pitch_dim, fill=0x5A):
    """An engine tensor with padded slot / row (pitch_dim) and layer pitches, in a bigger array
    filled with `fill` bytes; returns (view, base)."""
    itemsize = np.dtype(dtype).itemsize
    pad = 16 // itemsize
    strides = [0] * len(shape)
    span = 1
    for d in range(len(shape) - 1, -1, -1):
        strides[d] = span
        span *= shape[d]
        if d in (pitch_dim, pitch_dim - 1) and pitch_dim >= 0:
            strides[d] += pad if d == pitch_dim else 2 * pad
            span = strides[d] * shape[d]
    base = np.full(span * itemsize + 256, fill, np.uint8)  # room for the 256-byte alignment
    offset = (-base.ctypes.data) % 256
    flat = base[offset:offset + span * itemsize].view(dtype)
    view = np.lib.stride_tricks.as_strided(flat, shape=shape,
                                           strides=[s * itemsize for s in strides])
    return view, base


def external_pool(ring, deferred, state_only=False):
    """The engine's pool tensors: S + 2 slots, R + 1 rows, T_max + 1 steps, padded pitches."""
    tensors, bases = {}, []
    for name, (dtype, shape) in pool_shapes(ring, deferred, slots=S + 2, rows=R + 1,
                                            steps=T_MAX + 1, cursor=True).items():
        if state_only and name not in ("conv_state", "ssm_state"):
            continue
        pitch = -1 if name in ("qkv_act", "ring_cursor", "ring_pending") else 1
        view, base = padded(dtype, shape, pitch)
        tensors[name] = wrap(name, view)
        bases.append(base)
    return tensors, bases


def check_engine_memory(library, seed):
    """External-pool, allocator-hooked and mixed Backends are bitwise the owning one."""
    checks = 0
    for what, ring, deferred, topk in MODES:
        ext, ext_bases = external_pool(ring, deferred)
        state, state_bases = external_pool(ring, deferred, state_only=True)
        alloc_a, alloc_b = kda.NumpyAllocator(), kda.NumpyAllocator()
        backends = [make_backend(library, ring, deferred, topk),
                    make_backend(library, ring, deferred, topk, external_pool=ext),
                    make_backend(library, ring, deferred, topk, allocator=alloc_a),
                    make_backend(library, ring, deferred, topk, allocator=alloc_b,
                                 external_pool=state)]
        reports = [be.memory_report() for be in backends]
        assert reports[1]["external_bytes"] == reports[1]["pool_bytes"], reports[1]
        assert reports[1]["allocated_bytes"] == reports[1]["workspace_bytes"], reports[1]
        assert reports[2]["from_allocator"] and reports[2]["external_bytes"] == 0, reports[2]
        assert sum(alloc_a.live.values()) == reports[2]["allocated_bytes"], (alloc_a.live,
                                                                             reports[2])
        assert sum(alloc_b.live.values()) == reports[3]["allocated_bytes"]
        assert reports[3]["allocated_bytes"] + reports[3]["external_bytes"] == \
            reports[3]["total_bytes"], reports[3]
        for be in backends:
            for _ in range(S):
                be.allocate_slot()
            fill_backend(be, ring, seed)
        rng = np.random.default_rng(seed + 2)
        for rnd in range(8):
            r = Round(rng, topk)
            outs = [backend_round(be, r) for be in backends]
            for i, be in enumerate(backends[1:], 1):
                for layer in range(L_):
                    same(f"{what} backend {i} round {rnd} layer {layer}", outs[i][layer],
                         outs[0][layer])
                for name in pool_shapes(ring, deferred):
                    if name != "qkv_act" and (ring or not name.startswith("ring_")):
                        same(f"{what} backend {i} round {rnd}: {name}",
                             be.pool_array(name), backends[0].pool_array(name))
            checks += 1
        # Spare slots, rows, steps and the pitch padding are the engine's: untouched.
        for name, t in list(ext.items()) + list(state.items()):
            arr = t.tensor if isinstance(t, kda.bf16) else t
            if arr.ndim >= 2 and arr.shape[0] == L_ and arr.shape[1] == S + 2:
                assert (arr[:, S:].view(np.uint8) == 0x5A).all(), (what, name)
        for be in backends:
            be.close()
            assert be.released
        del be, backends
        gc.collect()
        assert not alloc_a.live and not alloc_b.live, (alloc_a.live, alloc_b.live)
        assert alloc_a.frees == alloc_a.allocations > 0
    return checks


def expect(fn, code, *needles, exc=None):
    try:
        fn()
    except (exc or kda.Error) as e:
        if exc is None:
            assert e.code == code, f"{e.code_name}: {e}"
        for n in needles:
            assert n in str(e), f"{str(e)!r} does not contain {n!r}"
        return
    raise AssertionError(f"no error (expected {needles})")


def check_external_errors(library):
    """Bad external tensors: named, nothing allocated, nothing written."""
    checks = 0
    cases = [
        ("wrong shape", "ssm_state", lambda t: t[:, :, :3],
         "external_pool.ssm_state: expected shape [2, >= 4, 4, 64, 64], got [2, 6, 3, 64, 64]"),
        ("too small", "conv_state", lambda t: kda.bf16(t.tensor[:, :3]),
         "external_pool.conv_state: expected shape [2, >= 4, 3, 512], got [2, 3, 3, 512]"),
        ("wrong dtype", "ring_g", lambda t: t.view(np.int32),
         "external_pool.ring_g: expected dtype f32, got i32"),
        ("inner stride", "ring_beta", lambda t: np.lib.stride_tricks.as_strided(
            t, shape=t.shape, strides=t.strides[:3] + (8,)),
         "external_pool.ring_beta: dim 3 has stride 2, expected 1"),
        ("slot pitch", "ssm_state", lambda t: np.lib.stride_tricks.as_strided(
            t, shape=t.shape, strides=(t.strides[0], 4 * 64 * 64 * 4 - 16) + t.strides[2:]),
         "external_pool.ssm_state: slot pitch stride(1) = 16380 is smaller than one packed slot"),
        ("layer pitch", "ring_rawk", lambda t: kda.bf16(np.lib.stride_tricks.as_strided(
            t.tensor, shape=t.tensor.shape, strides=(t.tensor.strides[1],) + t.tensor.strides[1:])),
         "external_pool.ring_rawk: layer pitch stride(0)"),
        ("overlapping", "conv_window", "overlap",
         "external_pool.conv_window: its bytes"),
        ("unknown name", "ssm_states", "extra",
         "create: external_pool: unknown tensor 'ssm_states'"),
    ]
    for what, name, spoil, needle in cases:
        ext, bases = external_pool(True, False)
        if spoil == "overlap":
            cs = ext["conv_state"].tensor
            ext["conv_window"] = kda.bf16(np.lib.stride_tricks.as_strided(
                cs, shape=ext["conv_window"].tensor.shape,
                strides=ext["conv_window"].tensor.strides))
        elif spoil == "extra":
            ext[name] = ext["ssm_state"]
        else:
            ext[name] = spoil(ext[name])
        before = [b.copy() for b in bases]
        alloc = kda.NumpyAllocator()
        expect(lambda: kda.Backend(model=model(), flags=flags(True, False), extra_slots=1,
                                   external_pool=ext, allocator=alloc, library=library),
               kda.INVALID_ARGUMENT, needle)
        assert alloc.allocations == 0, what
        assert all((a == b).all() for a, b in zip(before, bases)), what
        checks += 1
    expect(lambda: kda.Backend(model=model(), flags=flags(True, False), library=library,
                               external_pool={"ssm_state": [1, 2]}), None,
           "create: external_pool.ssm_state: expected a tensor with __dlpack__", exc=TypeError)
    expect(lambda: kda.Backend(model=model(), flags=flags(True, False), library=library,
                               external_pool=[1]), None,
           "create: external_pool: expected a dict of tensors", exc=TypeError)
    expect(lambda: kda.Backend(model=model(), library=library, allocator="cuda"),
           kda.INVALID_ARGUMENT, "create: allocator: 'cuda' unknown")
    expect(lambda: kda.Backend(model=model(), library=library, allocator=object()), None,
           "create: allocator: expected a kda.Allocator", exc=TypeError)

    class Broken(kda.NumpyAllocator):
        def alloc(self, nbytes, device, stream):
            raise RuntimeError("the engine's pool is full")
    expect(lambda: kda.Backend(model=model(), library=library, allocator=Broken()),
           kda.OUT_OF_MEMORY, "returned no memory",
           "the allocator raised RuntimeError: the engine's pool is full")
    return checks + 5


def check_lifetime(library):
    """Pool views keep the backend's memory alive across close(); nothing reads freed memory."""
    alloc = kda.NumpyAllocator()
    be = kda.Backend(model=model(), flags=flags(True, True), extra_slots=1, allocator=alloc,
                     library=library)
    slot = be.allocate_slot()
    view = be.pool_view("ssm_state", 0)
    exported = np.from_dlpack(view)  # read-only (numpy's DLPack import)
    array = be.pool_array("ssm_state", 0)
    array[slot, 1, 2, 3] = 7.0
    live = dict(alloc.live)
    be.close()
    assert be.closed and not be.released, "closed with views alive: memory must stay"
    assert alloc.live == live, "a block was freed while a view pointed at it"
    for fn, call in ((be.info, "backend_info"), (lambda: be.pool_view("ssm_state"), "pool_view"),
                     (lambda: be.prepare(1, [slot]), "prepare"), (be.memory_report,
                                                                  "memory_report")):
        expect(fn, kda.LIFECYCLE, f"{call}: the backend is closed")
    # Reading and writing through the views is still on live memory.
    assert exported[slot, 1, 2, 3] == 7.0
    array[...] = 2.0
    assert (exported == 2.0).all()
    del view
    gc.collect()
    assert not be.released  # the numpy export and array still hold it
    del exported
    gc.collect()
    assert not be.released
    del array
    gc.collect()
    assert be.released and not alloc.live, "the last view is gone: the memory must be freed"
    assert alloc.frees == alloc.allocations

    # Without views, close() frees at once; an unconsumed capsule holds nothing after it dies.
    alloc = kda.NumpyAllocator()
    be = kda.Backend(model=model(), flags=flags(False, False), allocator=alloc, library=library)
    capsule = be.pool_view("conv_window").__dlpack__()
    be.close()
    assert not be.released
    del capsule
    gc.collect()
    assert be.released and not alloc.live
    be.close()  # idempotent
    return 3


def check_memory_report(library):
    for ring in (False, True):
        be = make_backend(library, ring, False, 1)
        r = be.memory_report()
        assert r["total_bytes"] == r["pool_bytes"] + r["workspace_bytes"], r
        assert r["pool_bytes"] == sum(r[k] for k in (
            "conv_state_bytes", "ssm_state_bytes", "ring_bytes", "conv_window_bytes",
            "snapshot_bytes", "qkv_act_bytes")), r
        assert r["conv_state_bytes"] == L_ * S * 3 * D * 2
        assert r["ssm_state_bytes"] == L_ * S * HV * V * K * 4
        assert r["conv_window_bytes"] == L_ * R * T_MAX * 3 * D * 2
        assert (r["snapshot_bytes"] == 0) == ring and (r["ring_bytes"] == 0) == (not ring), r
        assert r["allocated_bytes"] == r["total_bytes"] and r["external_bytes"] == 0
        assert not r["from_allocator"]
        assert r["pool_bytes"] == (r["ring_mode_total_bytes"] if ring
                                   else r["snapshot_mode_total_bytes"])
        be.close()
    return 2


class _FakeTorch:
    """A stand-in for the torch module: Tensor over a numpy array (cpu), with the metadata the
    package reads; __dlpack__ counts its calls."""

    def __init__(self):
        fake = self

        class dtype:
            def __init__(self, name):
                self.name = name

            def __str__(self):
                return "torch." + self.name

        class device:
            type = "cpu"
            index = None

        class Tensor:
            dlpack_calls = 0

            def __init__(self, array, name):
                self.array = array
                self.dtype = dtype(name)
                self.device = device()
                self.layout = "torch.strided"
                self.shape = array.shape

            def stride(self):
                return tuple(s // self.array.itemsize for s in self.array.strides)

            def data_ptr(self):
                return self.array.ctypes.data

            def __dlpack__(self, stream=None):
                Tensor.dlpack_calls += 1
                return self.array.__dlpack__()

            def __dlpack_device__(self):
                return (1, 0)

        class cuda:
            @staticmethod
            def current_stream(index):
                return types.SimpleNamespace(cuda_stream=0x1000 + index)

        fake.Tensor = Tensor
        fake.cuda = cuda

    def bf16(self, bits_u16):
        return self.Tensor(bits_u16, "bfloat16")

    def plain(self, array):
        return self.Tensor(array, {np.float32: "float32", np.int32: "int32"}[array.dtype.type])


def check_torch_path(library, seed):
    """torch tensors: metadata path (no __dlpack__), via_dlpack forces the capsule (sync=False:
    stream -1, no synchronisation), the default stream is torch's current one on CUDA."""
    fake = _FakeTorch()
    module = types.ModuleType("torch")
    module.Tensor = fake.Tensor
    module.cuda = fake.cuda
    saved = sys.modules.get("torch")
    sys.modules["torch"] = module
    try:
        assert kda._torch_stream(kda._dlpack.kDLCUDA, 3) == 0x1003
        assert kda._torch_stream(kda._dlpack.kDLCPU, 0) == 0
        a_np = make_backend(library, True, False, 1)
        a_torch = make_backend(library, True, False, 1)
        assert a_torch._stream(None, "x") == 0  # a host backend: the legacy stream
        for be in (a_np, a_torch):
            for _ in range(S):
                be.allocate_slot()
            fill_backend(be, True, seed)
        rng = np.random.default_rng(seed + 3)
        r = Round(rng, 1)
        want = backend_round(a_np, r)
        a_torch.prepare(r.T, r.slots, r.rows, lengths=r.lengths)
        for layer in range(L_):
            q, a, b = r.inputs[layer]
            # A non-contiguous torch view: a column slice of a wider tensor (row stride > D).
            wide = np.zeros((r.N, D + 16), np.uint16)
            wide[:, :D] = q
            out = r.garbage.copy()
            tensors = [fake.bf16(wide[:, :D]), fake.bf16(a), fake.bf16(b), fake.bf16(out)]
            a_torch.verify(layer, *tensors)
            same(f"torch path layer {layer}", out, want[layer])
        assert fake.Tensor.dlpack_calls == 0, "the torch path must not call __dlpack__"
        acc = fake.plain(np.array(r.accepted, np.int32))
        a_torch.commit(kda.via_dlpack(acc))
        assert fake.Tensor.dlpack_calls == 1, "via_dlpack must go through __dlpack__"
        for name in ("ssm_state", "conv_state"):
            same(f"torch path: {name}", a_torch.pool_array(name), a_np.pool_array(name))
        # The DLPack paths' streams: a CUDA producer gets the call's stream with sync (the
        # default), -1 (DLPack's "no synchronisation") with via_dlpack(t, sync=False).
        seen = []

        class CudaProducer:
            def __dlpack_device__(self):
                return (kda._dlpack.kDLCUDA, 0)

            def __dlpack__(self, stream=None):
                seen.append(stream)
                return np.zeros(4, np.float32).__dlpack__()
        kda._borrow_tensor(kda.via_dlpack(CudaProducer()), "verify", "a", 77)
        kda._borrow_tensor(kda.via_dlpack(CudaProducer(), sync=False), "verify", "a", 77)
        kda._borrow_tensor(kda.bf16(kda.via_dlpack(fake.bf16(np.zeros(2, np.uint16)),
                                                   sync=False)), "verify", "a", 77)
        assert seen == [77, -1], seen
        assert fake.Tensor.dlpack_calls == 2
        expect(lambda: kda._borrow_tensor(fake.Tensor(np.zeros(3, np.float64), "complex64"),
                                          "verify", "a"),
               kda.INVALID_ARGUMENT, "verify: a: torch dtype torch.complex64 has no DLPack")
    finally:
        if saved is None:
            del sys.modules["torch"]
        else:
            sys.modules["torch"] = saved
    return L_ + 4


def check_ops_errors(library):
    """kda.ops: every bad argument named, nothing changed."""
    rng = np.random.default_rng(9)
    pool = {n: np.zeros(s, d) for n, (d, s) in pool_shapes(True, False, slots=S + 1).items()}
    state = {n: wrap(n, a) for n, a in pool.items()}
    w = weights(1)[0]
    q, a, b = bits(rng, (4, D), 0.5), bits(rng, (4, HV * K), 0.5), bits(rng, (4, HV), 1.0)
    out = np.zeros((4, HV, V), np.uint16)
    base = dict(A_log=w[0], dt_bias=w[1], conv_weight=w[2], conv_bias=w[3],
                state=kda.ops.layer(state, 0), slots=np.array([1], np.int32),
                rows=np.array([0], np.int32), T=4, library=library)
    before = {n: a.copy() for n, a in pool.items()}

    def verify(**changes):
        kw = dict(base)
        kw.update(changes)
        return kda.ops.verify(kda.bf16(q), kda.bf16(a), kda.bf16(b), kda.bf16(out), **kw)

    layer0 = kda.ops.layer(state, 0)
    bad_g = dict(layer0, ring_g=pool["ring_g"][0].view(np.int32))
    cases = [
        (lambda: verify(state=bad_g), kda.INVALID_ARGUMENT,
         "ops.verify: state.ring_g: expected dtype f32, got i32"),
        (lambda: verify(T=5), kda.INVALID_ARGUMENT,
         "ops.verify: batch.T: T = 5 outside [1, T_max = 4]"),
        (lambda: verify(slots=np.array([1, 2], np.int32), rows=np.array([0, 1], np.int32)),
         kda.INVALID_ARGUMENT, "ops.verify: mixed_qkv: 4 rows, expected 8"),
        (lambda: verify(rows=None), kda.INVALID_ARGUMENT,
         "ops.verify: batch.rows: expected an int32 tensor [1], got none"),
        (lambda: verify(slots=np.array([1], np.int64)), kda.INVALID_ARGUMENT,
         "ops.verify: batch.slots: dtype int64 unsupported, expected int32"),
        (lambda: verify(slots=np.array([9], np.int32)), kda.INVALID_ARGUMENT,
         "slots[0]=9 out of range [0, num_slots=5)"),
        (lambda: verify(state=dict(layer0, ring_beta=None)), kda.INVALID_ARGUMENT,
         "ops.verify: state.ring_beta: missing"),
        (lambda: verify(state=dict(layer0, bogus=1)), kda.INVALID_ARGUMENT,
         "ops.verify: state: unknown tensor 'bogus'"),
        (lambda: verify(gate="fancy"), kda.INVALID_ARGUMENT, "ops.verify: gate 'fancy'"),
        (lambda: verify(numerics="tf32"), kda.INVALID_ARGUMENT,
         "ops.verify: numerics 'tf32' unsupported, expected 'auto', 'exact' or 'fast'"),
        (lambda: verify(numerics=2), None, "ops.verify: numerics: expected a str, got int"),
        (lambda: verify(T=2.0), None, "ops.verify: T: expected an int, got float"),
        (lambda: verify(state=[1]), None, "ops.verify: state: expected a dict of tensors"),
        (lambda: kda.ops.commit(state=state, slots=np.array([1], np.int32),
                                rows=np.array([0], np.int32), T=4, library=library,
                                accepted_lengths=np.array([1, 1], np.int32)),
         kda.INVALID_ARGUMENT, "ops.commit: accepted_lengths: expected shape [1], got [2]"),
        (lambda: kda.ops.materialize(state=state, slots=np.array([0], np.int32),
                                     library=library),
         kda.INVALID_ARGUMENT, "ops.materialize: state.ring_pending: none given"),
    ]
    for fn, code, needle in cases:
        expect(fn, code, needle, exc=TypeError if code is None else None)
        for n, arr in pool.items():
            assert (arr == before[n]).all(), (needle, n)
        assert not out.any()
    return len(cases)


def check_numerics(library):
    """--kda-verify-numerics through a Backend's flags and kda.ops.verify's numerics: each verify's
    DispatchInfo names its outputs' numerics and why. The host platform runs ring mode unfused, so
    fast and auto stay exact there with the unfused path's reason; snapshot mode with its own."""
    checks = 0
    rng = np.random.default_rng(11)
    q, a, b = bits(rng, (T_MAX, D), 0.5), bits(rng, (T_MAX, HV * K), 0.5), bits(rng, (T_MAX, HV), 1)
    for ring in (False, True):
        for numerics in ("auto", "exact", "fast"):
            want = ("exact_requested" if numerics == "exact" else
                    "exact_unfused" if ring else "exact_snapshot_mode")
            be = kda.Backend(model=model(), flags=flags(ring, False) + [
                "--kda-verify-numerics", numerics], extra_slots=1, library=library)
            for layer, w in enumerate(weights(100)):
                be.set_layer_weights(layer, *w)
            for _ in range(S):
                be.allocate_slot()
            be.prepare(T_MAX, [1], None)
            for layer in range(L_):
                out = np.zeros((T_MAX, HV, V), np.uint16)
                info = be.verify(layer, kda.bf16(q), kda.bf16(a), kda.bf16(b), kda.bf16(out))
                assert not info.fast_outputs and info.numerics_reason == want, (ring, numerics, info)
                checks += 1
            be.close()
    # kda.ops.verify on an engine's eager ring-mode pool.
    pool = {n: np.zeros(s, d) for n, (d, s) in pool_shapes(True, False, slots=S + 1).items()}
    state = {n: wrap(n, arr) for n, arr in pool.items()}
    w = weights(1)[0]
    for numerics, want in (("auto", "exact_unfused"), ("exact", "exact_requested"),
                           ("fast", "exact_unfused")):
        out = np.zeros((T_MAX, HV, V), np.uint16)
        info = kda.ops.verify(kda.bf16(q), kda.bf16(a), kda.bf16(b), kda.bf16(out), A_log=w[0],
                              dt_bias=w[1], conv_weight=w[2], conv_bias=w[3],
                              state=kda.ops.layer(state, 0), slots=np.array([1], np.int32),
                              rows=np.array([0], np.int32), T=T_MAX, numerics=numerics,
                              library=library)
        assert not info.fast_outputs and info.numerics_reason == want, (numerics, info)
        checks += 1
    return checks


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--library", default=None)
    p.add_argument("--seed", type=int, default=58)
    args = p.parse_args()
    print(f"kda: library {kda.load_library(args.library)._name}")
    n = check_ops_sglang(args.library, args.seed)
    print(f"ops on SGLang-shaped buffers: {n} rounds bitwise the Backend's")
    n = check_engine_memory(args.library, args.seed)
    print(f"external pool / allocator / both: {n} rounds bitwise the owning Backend's")
    print(f"external pool errors: {check_external_errors(args.library)} checks")
    print(f"lifetime: {check_lifetime(args.library)} checks")
    print(f"memory report: {check_memory_report(args.library)} checks")
    print(f"torch path: {check_torch_path(args.library, args.seed)} checks")
    print(f"ops errors: {check_ops_errors(args.library)} checks")
    print(f"numerics: {check_numerics(args.library)} checks")
    print("OK")
    return 0


if __name__ == "__main__":
    sys.exit(main())
