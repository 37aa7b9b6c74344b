"""fuzz_host.py: random and adversarial calls through the kda package on the host kernel set.

Each case (seeded by --seed and its index) builds a random configuration (snapshot, ring, ring
with the deferred commit, tree drafts in either mode; 1-2 layers, 1-3 rows, 0-2 extra slots,
T_max 2-4) as two identical backends, `a` and its twin `b`, and walks a random lifecycle on
both: verify rounds (dense, ragged with or without offsets, trees), commits with accepted
lengths and paths (now and then bad ones, and tracks, valid or not), extend rounds with tracks,
materialize, copy_slot, release and allocate, abort_round. `b` takes every tensor in another
valid form (at a non-zero byte_offset, or with padded rows), and its pools must stay bitwise
equal to `a`'s. Between the steps `a` alone gets adversarial calls: integers outside their C
type's or their own range, wrong Python types, strings with a NUL or a lone surrogate, tensors
of the wrong dtype, shape, strides, alignment or kind, read-only arrays, calls out of order, a
closed backend, bad flags and models at creation. Asserted for each:

  * it raises kda.Error (INVALID_ARGUMENT, or LIFECYCLE / OUT_OF_MEMORY where that is the
    problem) or TypeError (a wrong Python type), and the message names the argument (or the
    call, for a lifecycle error), with the bad integer's value as given;
  * nothing changed: every pool tensor bitwise, the round state, the free slots (and, through
    the twin, everything after);
  * bad accepted lengths, paths and tracks are flagged by check_device_errors, naming what was
    bad, and the skipped requests' (or tracks') slots keep their bits.

Cases run in subprocess batches, so a crash or a hang is caught and reported with the case
that caused it (rerun one case: --child --first N --count 1). Exit status 0 when every case
passes.

Usage: fuzz_host.py --library PATH/libkda_c.so [--seed S] [--cases N] [--batch K] [--jobs J]
"""

import argparse
import ctypes
import json
import os
import random
import subprocess
import sys
import tempfile
import time
import traceback

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import kda  # noqa: E402
from kda import _dlpack  # noqa: E402

K = 64
V = 16
H = 1


# ---------------------------------------------------------------------------------------------
# Tensors in other valid forms (the twin's inputs)


class OffsetTensor:
    """A DLPack producer of `array`'s values at a non-zero byte_offset: the DLTensor's data is
    the start of a larger buffer that holds `pad` elements before them."""

    _CODES = {np.dtype(np.uint16): (_dlpack.kDLUInt, 16), np.dtype(np.int32): (_dlpack.kDLInt, 32),
              np.dtype(np.float32): (_dlpack.kDLFloat, 32)}

    def __init__(self, array, pad):
        array = np.ascontiguousarray(array)
        self.buf = np.zeros(array.size + pad, array.dtype)
        self.buf[pad:] = array.ravel()
        self.pad = pad
        self.shape = array.shape
        ndim = len(self.shape)
        strides = [1] * ndim
        for d in range(ndim - 2, -1, -1):
            strides[d] = strides[d + 1] * self.shape[d + 1]
        self._shape = (ctypes.c_int64 * max(ndim, 1))(*self.shape)
        self._strides = (ctypes.c_int64 * max(ndim, 1))(*strides)

    def values(self):
        return self.buf[self.pad:].reshape(self.shape)

    def __dlpack_device__(self):
        return (_dlpack.kDLCPU, 0)

    def __dlpack__(self, stream=None, **_):
        t = _dlpack.DLTensor()
        t.data = self.buf.ctypes.data
        t.device = _dlpack.DLDevice(_dlpack.kDLCPU, 0)
        t.ndim = len(self.shape)
        code, bits = self._CODES[self.buf.dtype]
        t.dtype = _dlpack.DLDataType(code, bits, 1)
        t.shape = ctypes.cast(self._shape, ctypes.POINTER(ctypes.c_int64))
        t.strides = ctypes.cast(self._strides, ctypes.POINTER(ctypes.c_int64))
        t.byte_offset = self.pad * self.buf.dtype.itemsize
        return _dlpack.export_capsule(t, self)


def padded_rows(array, pad):
    """A view of 2-D `array` with `pad` extra elements per row (row stride > width)."""
    wide = np.zeros((array.shape[0], array.shape[1] + pad), array.dtype)
    wide[:, :array.shape[1]] = array
    return wide[:, :array.shape[1]]


def other_form(rng, array, allow_padded_rows=False):
    """`array` (uint16 bf16 bits, int32 or float32) as the twin takes it, and a function that
    reads its values back (outputs)."""
    choice = rng.randrange(3 if allow_padded_rows else 2)
    if choice == 0:
        t = OffsetTensor(array, pad=rng.choice([2, 4, 8, 36]))
        return t, t.values
    if choice == 1:
        t = np.ascontiguousarray(array).copy()
        return t, lambda: t
    t = padded_rows(array, rng.choice([2, 8]))
    return t, lambda: t


def wrap(t, bf16):
    return kda.bf16(t) if bf16 else t


def bf16_bits(nrng, shape, scale):
    x = (nrng.standard_normal(shape) * scale).astype(np.float32)
    return (x.view(np.uint32) >> 16).astype(np.uint16)


# ---------------------------------------------------------------------------------------------
# The twin backends


class Failure(AssertionError):
    pass


def check(cond, message):
    if not cond:
        raise Failure(message)


class Twin:
    """Backends `a` and `b` with one configuration, the same weights and state; the host-side
    picture of the lifecycle (allocated slots, the round in progress)."""

    def __init__(self, rng, nrng, library):
        self.rng, self.nrng, self.library = rng, nrng, library
        self.mode = rng.choice(["snapshot", "ring", "deferred", "tree", "tree_ring"])
        self.T_max = rng.choice([2, 3, 4])
        self.R = rng.choice([1, 2, 3])
        self.extra = rng.choice([0, 1, 2])
        self.S = self.R + self.extra
        self.layers = rng.choice([1, 2])
        self.HV = rng.choice([1, 2])
        self.D = 2 * H * K + self.HV * V
        self.wdtype = rng.choice(["f32", "bf16"])
        self.bias = rng.random() < 0.5
        self.safe = rng.random() < 0.3
        self.ring = self.mode in ("ring", "deferred", "tree_ring")
        self.tree = self.mode.startswith("tree")
        self.flags = ["--speculative-num-draft-tokens", str(self.T_max), "--max-running-requests",
                      str(self.R), "--kda-deferred-commit",
                      "on" if self.mode == "deferred" else "off"]
        if self.ring:
            self.flags += ["--enable-linear-replayssm-spec", "--linear-replayssm-cache-len", "8"]
        if self.tree:
            self.flags += ["--speculative-eagle-topk", "2"]
        self.model = kda.Model(num_layers=self.layers, H=H, HV=self.HV, K=K, V=V,
                               gate="safe" if self.safe else "standard",
                               lower_bound=-5.0 if self.safe else 0.0,
                               conv_weight_dtype=self.wdtype, has_conv_bias=self.bias)
        self.a = self.create()
        self.b = self.create()
        self.weights = {}
        for layer in range(self.layers):
            self.set_weights(layer)
        self.allocated = set()
        for _ in range(rng.randint(1, self.S)):
            self.allocate()
        # Random committed state in every slot, the same in both.
        for name, scale in (("ssm_state", 0.2), ("conv_state", None)):
            shape = self.a.pool_array(name).shape
            values = (nrng.standard_normal(shape) * scale).astype(np.float32) if scale else \
                bf16_bits(nrng, shape, 0.5)
            self.a.pool_array(name)[...] = values
            self.b.pool_array(name)[...] = values
        self.round = None  # None, or dict(kind, B, T, slots, rows, lengths, parents, N, done)

    def create(self):
        return kda.Backend(model=self.model, flags=self.flags, extra_slots=self.extra,
                           library=self.library)

    def set_weights(self, layer):
        nrng = self.nrng
        A_log = (nrng.standard_normal(self.HV) * 0.5).astype(np.float32)
        dt_bias = (nrng.standard_normal(self.HV * K) * 0.5).astype(np.float32)
        if self.wdtype == "f32":
            conv = (nrng.standard_normal((self.D, 4)) * 0.3).astype(np.float32)
            bias = (nrng.standard_normal(self.D) * 0.1).astype(np.float32) if self.bias else None
        else:
            conv = bf16_bits(nrng, (self.D, 4), 0.3)
            bias = bf16_bits(nrng, (self.D,), 0.1) if self.bias else None
        bf = self.wdtype == "bf16"
        self.a.set_layer_weights(layer, A_log, dt_bias, wrap(conv, bf),
                                 wrap(bias, bf) if bias is not None else None)
        forms = [other_form(self.rng, w)[0] if w is not None else None
                 for w in (A_log, dt_bias, conv, bias)]
        self.b.set_layer_weights(layer, forms[0], forms[1], wrap(forms[2], bf),
                                 wrap(forms[3], bf) if forms[3] is not None else None)
        self.weights[layer] = (A_log, dt_bias, wrap(conv, bf),
                               wrap(bias, bf) if bias is not None else None)

    # ---- state ----
    def pools(self, be):
        out = {}
        for name in kda.POOL_TENSORS:
            try:
                out[name] = be.pool_array(name, -1).tobytes()
            except kda.Error:
                pass  # absent in this mode
        return out

    def snapshot(self, be):
        return self.pools(be), be.round_state, be.info()

    def same_twins(self, where):
        pa, pb = self.pools(self.a), self.pools(self.b)
        for name in pa:
            check(pa[name] == pb[name], f"{where}: pool tensor {name} differs between the twins")
        check(self.a.round_state == self.b.round_state, f"{where}: round states differ")

    def slot_bits(self, be, slot):
        """Everything a commit may write for `slot`: state, conv state, pending counts, cursor."""
        out = [be.pool_array("ssm_state")[:, slot].tobytes(),
               be.pool_array("conv_state")[:, slot].tobytes()]
        if self.ring:
            out.append(be.pool_array("ring_pending")[:, slot].tobytes())
            out.append(be.pool_array("ring_cursor")[slot].tobytes())
        return out

    # ---- valid steps, on both ----
    def allocate(self):
        s = self.a.allocate_slot()
        check(self.b.allocate_slot() == s, "allocate_slot: the twins hand out different slots")
        self.allocated.add(s)
        return s

    def release(self, s):
        self.a.release_slot(s)
        self.b.release_slot(s)
        self.allocated.discard(s)

    def both(self, name, *args, **kw):
        getattr(self.a, name)(*args, **kw)
        getattr(self.b, name)(*args, **kw)

    def free_in_round(self):
        """Allocated slots outside the round's batch (track candidates)."""
        batch = set(self.round["slots"]) if self.round else set()
        return sorted(self.allocated - batch)

    def prepare(self):
        rng = self.rng
        live = sorted(self.allocated)
        B = rng.randint(1, self.R)
        slots = rng.sample(live, min(B, len(live)))
        while len(slots) < B:
            slots.insert(rng.randrange(len(slots) + 1), -1)
        if all(s < 0 for s in slots):
            slots[0] = live[0]
        T = rng.randint(1, self.T_max)
        rows = None
        if rng.random() < 0.4:
            rows = rng.sample(range(self.R), B)
        kw = {}
        lengths = parents = None
        if self.tree and rng.random() < 0.7:
            parents = []
            for _ in range(B):
                children = [0] * T
                par = [-1]
                for j in range(1, T):
                    choices = [p for p in range(j) if children[p] < 2]
                    p = rng.choice(choices)
                    children[p] += 1
                    par.append(p)
                parents += par
            kw["parents"] = parents
        elif not self.tree and rng.random() < 0.4:
            lengths = [rng.randint(1, T) for _ in range(B)]
            kw["lengths"] = lengths
            if rng.random() < 0.5:
                offsets = [0]
                for n in lengths:
                    offsets.append(offsets[-1] + n)
                kw["offsets"] = offsets
        self.both("prepare", T, slots, rows, **kw)
        N = sum(lengths) if lengths else B * T
        self.round = dict(kind="verify", B=B, T=T, slots=slots, rows=rows, lengths=lengths,
                          parents=parents, N=N, done=set())

    def inputs(self, N):
        nrng = self.nrng
        return (bf16_bits(nrng, (N, self.D), 0.5), bf16_bits(nrng, (N, self.HV * K), 0.5),
                bf16_bits(nrng, (N, self.HV), 1.0))

    def run_layer(self, layer):
        """verify (or extend) `layer` of the round on both; outputs compared."""
        r = self.round
        x = self.inputs(r["N"])
        out_a = np.full((r["N"], self.HV, V), 0x3F81, np.uint16)
        fn = "verify" if r["kind"] == "verify" else "extend"
        getattr(self.a, fn)(layer, *[kda.bf16(t) for t in x], kda.bf16(out_a))
        forms = [other_form(self.rng, t, allow_padded_rows=True)[0] for t in x]
        out_b, read_b = other_form(self.rng, np.full_like(out_a, 0x3F81))
        getattr(self.b, fn)(layer, *[kda.bf16(t) for t in forms], kda.bf16(out_b))
        check(np.array_equal(out_a, read_b()), f"{fn}(layer {layer}): outputs differ")
        r["done"].add(layer)
        if r["kind"] == "extend" and len(r["done"]) == self.layers:
            self.round = None  # the extend round ends with its last layer

    def root_path(self, n, length):
        """A root path of `length` nodes in request n's tree (children picked at random)."""
        r = self.round
        T = r["T"]
        par = r["parents"][n * T:(n + 1) * T]
        path = [0]
        while len(path) < length:
            children = [j for j in range(T) if par[j] == path[-1]]
            if not children:
                break
            path.append(self.rng.choice(children))
        return path

    def commit(self):
        """Commits the verified round on both, now and then with bad accepted lengths, paths or
        tracks: check_device_errors must name them, and their slots keep their bits."""
        rng, r = self.rng, self.round
        B, T = r["B"], r["T"]
        accepted, paths = [], []
        bad_requests, bad_kind = set(), set()
        for n, s in enumerate(r["slots"]):
            limit = r["lengths"][n] if r["lengths"] else T
            if r["parents"] is not None:
                path = self.root_path(n, rng.randint(1, T))
                limit = len(path)
            else:
                path = list(range(T))
            acc = rng.randint(1, limit)
            if s < 0:
                acc = rng.choice([acc, 0, -7, 2 ** 31 - 1])  # padding: never read
            elif rng.random() < 0.12:
                acc = rng.choice([0, -1, limit + 1 if r["parents"] is None else T + 1,
                                  2 ** 31 - 1, -(2 ** 31)])
                bad_requests.add(n)
                bad_kind.add("length")
            elif r["parents"] is not None and acc > 1 and rng.random() < 0.12:
                par = r["parents"][n * T:(n + 1) * T]
                path[acc - 1] = rng.choice([0, T, -1, 2 ** 31 - 1] + [
                    j for j in range(1, T) if par[j] != path[acc - 2]])
                bad_requests.add(n)
                bad_kind.add("path")
            accepted.append(acc)
            paths.append((path + [0] * T)[:T])
        tracks = None
        bad_tracks = set()
        if rng.random() < 0.35:
            free = self.free_in_round()
            rng.shuffle(free)
            ts, tk = [], []
            for n, s in enumerate(r["slots"]):
                if s < 0 or n in bad_requests or rng.random() < 0.4:
                    ts.append(rng.choice([-1, 0, 99]))
                    tk.append(-1)
                    continue
                if free and rng.random() < 0.8:
                    ts.append(free.pop())
                    tk.append(rng.randrange(accepted[n]))
                else:
                    ts.append(rng.choice([self.S, -3, s]))  # out of range, or in the batch
                    tk.append(0)
                    bad_tracks.add(n)
            for n in range(B):  # now and then make a valid one bad
                if tk[n] >= 0 and n not in bad_tracks and rng.random() < 0.15:
                    if rng.random() < 0.5:
                        tk[n] = accepted[n]  # at the accepted length
                    else:
                        unallocated = sorted(set(range(self.S)) - self.allocated)
                        if not unallocated:
                            continue
                        ts[n] = rng.choice(unallocated)
                    bad_tracks.add(n)
            if bad_tracks or any(k >= 0 for k in tk):
                tracks = (ts, tk)
        # What the skipped requests and bad tracks must keep.
        keep = {}
        for n in bad_requests:
            keep[r["slots"][n]] = self.slot_bits(self.a, r["slots"][n])
        for n in bad_tracks:
            t = tracks[0][n]
            if 0 <= t < self.S and t not in r["slots"]:
                keep[t] = self.slot_bits(self.a, t)
        for be in (self.a, self.b):
            twin = be is self.b
            acc = np.array(accepted, np.int32)
            acc = other_form(rng, acc)[0] if twin else acc
            kw = {}
            if tracks is not None:
                kw = dict(track_slots=np.array(tracks[0], np.int32),
                          track_steps=np.array(tracks[1], np.int32))
                if twin:
                    kw = {k: other_form(rng, v)[0] for k, v in kw.items()}
            if r["parents"] is not None:
                p = np.array(paths, np.int32).reshape(B, T)
                be.commit_tree(acc, other_form(rng, p)[0] if twin else p, **kw)
            else:
                be.commit(acc, **kw)
        self.round = None
        flagged = bool(bad_requests or bad_tracks)
        for be in (self.a, self.b):
            try:
                be.check_device_errors()
            except kda.Error as e:
                check(flagged, f"check_device_errors flagged a valid commit: {e}")
                check(e.code == kda.INVALID_ARGUMENT, f"check_device_errors: code {e.code_name}")
                msg = str(e)
                if "length" in bad_kind:
                    check("an accepted length outside [1, T]" in msg or "path" in msg, msg)
                if "path" in bad_kind:
                    check("accepted path that is not a root path" in msg, msg)
                if bad_tracks:
                    check("a track step at or beyond its accepted length" in msg, msg)
            else:
                check(not flagged, f"check_device_errors: nothing flagged for bad requests "
                      f"{sorted(bad_requests)} / tracks {sorted(bad_tracks)} (accepted "
                      f"{accepted}, paths {paths}, tracks {tracks})")
        for slot, bits in keep.items():
            now = self.slot_bits(self.a, slot)
            check(now[0] == bits[0] and now[1] == bits[1] and
                  (not self.ring or now[3] == bits[3]),
                  f"commit: slot {slot} of a skipped request or bad track changed")
            if self.ring and self.mode != "deferred":
                check(now[2] == bits[2], f"commit: slot {slot}'s pending counts changed")
            elif self.mode == "deferred" and slot not in r["slots"]:
                check(now[2] == bits[2], f"commit: bad track slot {slot}'s pending changed")
        return len(bad_requests) + len(bad_tracks)

    def prepare_extend(self):
        rng = self.rng
        live = sorted(self.allocated)
        B = rng.randint(1, min(self.R, len(live)))
        slots = rng.sample(live, B)
        T = rng.randint(1, 6)
        ts = tk = None
        free = sorted(self.allocated - set(slots))
        if free and rng.random() < 0.5:
            rng.shuffle(free)
            ts, tk = [], []
            for _ in range(B):
                if free and rng.random() < 0.6:
                    ts.append(free.pop())
                    tk.append(rng.randrange(T))
                else:
                    ts.append(rng.choice([-1, 42]))
                    tk.append(-1)
        self.both("prepare_extend", T, slots, ts, tk)
        self.round = dict(kind="extend", B=B, T=T, slots=slots, N=B * T, done=set(),
                          tracks=[t for t, k in zip(ts or [], tk or []) if k >= 0])


# ---------------------------------------------------------------------------------------------
# Adversarial calls (on `a` alone)

BIG_INTS = [2 ** 31, 2 ** 32, 2 ** 32 + 1, 2 ** 32 + 2, -(2 ** 31) - 1, -(2 ** 32) + 1, 2 ** 63,
            -(2 ** 63) - 5, 2 ** 64 + 3, 10 ** 30]
WRONG_INTS = [2.0, 2.9, "1", "x", None, True, b"1", [1], 1j]
WRONG_SEQS = ["12", b"\x01\x02", {0, 1}, {0: 1}, 7, None, 2.5]


class Attack:
    def __init__(self, what, fn, exc, *needles, code=kda.INVALID_ARGUMENT):
        self.what, self.fn, self.exc, self.needles, self.code = what, fn, exc, needles, code


def int_attacks(t, rng):
    """An integer argument outside int32 or its own range (the message must show the value as
    given: a wrapped value would name another number)."""
    a = t.a
    v = rng.choice(BIG_INTS)
    slot = rng.choice(sorted(t.allocated))
    T = rng.randint(1, t.T_max)
    cases = [
        ("release_slot", lambda: a.release_slot(v), "release_slot: slot"),
        ("release_slot own range", None, None),
        ("copy_slot src", lambda: a.copy_slot(v, slot), "copy_slot: src"),
        ("copy_slot dst", lambda: a.copy_slot(slot, v), "copy_slot: dst"),
        ("prepare T", lambda: a.prepare(v, [slot]), "prepare: T"),
        ("prepare slots", lambda: a.prepare(T, [slot, v]), "prepare: slots[1]"),
        ("prepare rows", lambda: a.prepare(T, [slot], [v]), "prepare: rows[0]"),
        ("prepare lengths", lambda: a.prepare(T, [slot], lengths=[v]), "prepare: lengths[0]"),
        ("prepare offsets", lambda: a.prepare(T, [slot], lengths=[1], offsets=[0, v]),
         "prepare: offsets[1]"),
        ("prepare parents", lambda: a.prepare(1, [slot], parents=[v]), "prepare: parents[0]"),
        ("prepare_extend T", lambda: a.prepare_extend(v, [slot]), "prepare_extend: T"),
        ("prepare_extend slots", lambda: a.prepare_extend(2, [v]), "prepare_extend: slots[0]"),
        ("prepare_extend track_slots", lambda: a.prepare_extend(2, [slot], [v], [0]),
         "prepare_extend: track_slots[0]"),
        ("prepare_extend track_steps", lambda: a.prepare_extend(2, [slot], [0], [v]),
         "prepare_extend: track_steps[0]"),
        ("materialize", lambda: a.materialize([slot, v]), "materialize: slots[1]"),
        ("verify layer", lambda: a.verify(v, None, None, None, None), "verify: layer"),
        ("extend layer", lambda: a.extend(v, None, None, None, None), "extend: layer"),
        ("set_layer_weights layer", lambda: a.set_layer_weights(v, *t.weights[0]),
         "set_layer_weights: layer"),
        ("pool_view layer", lambda: a.pool_view("ssm_state", v), "pool_view: layer"),
        ("stream", lambda: a.allocate_slot(stream=-abs(v)), "allocate_slot: stream"),
        ("stream", lambda: a.abort_round(stream=rng.choice([-abs(v), 2 ** 64 + abs(v)])),
         "abort_round: stream"),
        ("stream", lambda: a.materialize([slot], stream=-1), "materialize: stream"),
    ]
    what, fn, needle = rng.choice(cases)
    if fn is None:  # own range: in int32, outside the configuration's
        s = rng.choice([t.S, t.S + 3, -1, -(2 ** 31)])
        return Attack(what, lambda: a.release_slot(s), kda.Error, "release_slot: slot", f"= {s}")
    shown = v if not what.startswith("stream") else None
    needles = [needle] + ([f"= {shown}"] if shown is not None else [])
    return Attack(what, fn, kda.Error, *needles)


def type_attacks(t, rng):
    """An argument of the wrong Python type: TypeError naming it."""
    a = t.a
    bad = rng.choice(WRONG_INTS)
    seq = rng.choice(WRONG_SEQS)
    slot = rng.choice(sorted(t.allocated))
    cases = [
        ("prepare T", lambda: a.prepare(bad, [slot]), "prepare: T"),
        ("prepare slots", lambda: a.prepare(1, seq), "prepare: slots"),
        ("prepare slot entry", lambda: a.prepare(1, [bad]), "prepare: slots[0]"),
        ("prepare lengths", lambda: a.prepare(1, [slot], lengths=[bad]), "prepare: lengths[0]"),
        ("prepare stream", lambda: a.prepare(1, [slot], stream=rng.choice(["x", 1.5, b"0"])),
         "prepare: stream"),
        ("release_slot", lambda: a.release_slot(bad), "release_slot: slot"),
        ("copy_slot", lambda: a.copy_slot(slot, bad), "copy_slot: dst"),
        ("materialize", lambda: a.materialize(seq), "materialize: slots"),
        ("verify layer", lambda: a.verify(bad, None, None, None, None), "verify: layer"),
        ("pool_view name", lambda: a.pool_view(rng.choice([b"ssm_state", None, 3])),
         "pool_view: name"),
        ("pool_view layer", lambda: a.pool_view("ssm_state", bad), "pool_view: layer"),
        ("commit tensor", lambda: a.commit(rng.choice([[1], 1, "1", (2,)])),
         "commit: accepted_lengths"),
        ("bf16 of a list", lambda: a.commit(kda.bf16([1, 2])), "commit: accepted_lengths"),
    ]
    what, fn, needle = rng.choice(cases)
    return Attack(what, fn, TypeError, needle)


def string_attacks(t, rng):
    """Strings the C side would cut or cannot take: kda.Error naming the argument."""
    a = t.a
    name = rng.choice(["ssm_state\x00zz", "\x00", "ssm\ud800state", "ring_g\udfff",
                       "bogus", "", "SSM_STATE"])
    needle = "pool_view: name" if ("\x00" in name or any(0xD800 <= ord(c) <= 0xDFFF
                                                        for c in name)) else "unknown tensor"
    return Attack("pool_view name", lambda: a.pool_view(name), kda.Error, needle)


def tensor_attacks(t, rng):
    """A verify / extend / commit tensor of the wrong dtype, shape, strides, alignment or kind;
    only in the phase where the call would otherwise run."""
    r = t.round
    a = t.a
    if r is None:
        return None
    if r["kind"] == "verify" and len(r["done"]) == t.layers:
        B = r["B"]
        acc = np.ones(B, np.int32)
        cases = [
            ("int64", acc.astype(np.int64), "accepted_lengths", kda.Error),
            ("float32", acc.astype(np.float32), "accepted_lengths", kda.Error),
            ("short", acc[:-1] if B > 1 else np.ones(2, np.int32), "accepted_lengths",
             kda.Error),
            ("2-D", acc.reshape(1, B), "accepted_lengths", kda.Error),
            ("strided", np.ones(2 * B + 2, np.int32)[::2][:max(B, 2)] if B == 1 else
             np.ones(2 * B, np.int32)[::2], "accepted_lengths", kda.Error),
            ("read-only", readonly(acc), "accepted_lengths", kda.Error),
            ("reversed", np.arange(B + 1, dtype=np.int32)[::-1][:B] if B > 1 else
             np.ones(3, np.int32), "accepted_lengths", kda.Error),
            ("zero stride", np.lib.stride_tricks.as_strided(acc, strides=(0,)) if B > 1 else
             np.ones((1, 1), np.int32), "accepted_lengths", kda.Error),
            ("list", [1] * B, "accepted_lengths", TypeError),
            ("None", None, "accepted_lengths", kda.Error),
        ]
        what, value, name, exc = rng.choice(cases)
        if r["parents"] is not None:
            paths = np.zeros((B, r["T"]), np.int32)
            if rng.random() < 0.5:
                return Attack(f"commit_tree {what}", lambda: a.commit_tree(value, paths), exc,
                              f"commit_tree: {name}")
            return Attack("commit_tree paths", lambda: a.commit_tree(
                acc, rng.choice([paths[:, :-1] if r["T"] > 1 else np.zeros((B, 2), np.int32),
                                 paths.astype(np.int64), paths.T.copy() if B > 1 and r["T"] > 1
                                 and B != r["T"] else paths[:, :0]])), kda.Error,
                "commit_tree: accepted_paths")
        if rng.random() < 0.3:  # tracks: one missing, or of a wrong dtype
            return Attack("commit track", lambda: a.commit(
                acc, track_slots=np.full(B, -1, np.int32),
                track_steps=rng.choice([None, np.zeros(B, np.float32)])), kda.Error,
                "commit: track.steps")
        return Attack(f"commit {what}", lambda: a.commit(value), exc, f"commit: {name}")
    layer = rng.choice([layer for layer in range(t.layers) if layer not in r["done"]])
    fn = a.verify if r["kind"] == "verify" else a.extend
    call = f"{'verify' if r['kind'] == 'verify' else 'extend'}(layer {layer})"
    N = r["N"]
    x = list(t.inputs(N)) + [np.zeros((N, t.HV, V), np.uint16)]
    names = ["mixed_qkv", "a", "b", "out"]
    i = rng.randrange(4)
    good = x[i]
    bad_forms = [
        ("float32", kda.Error, good.astype(np.float32)),
        ("int32", kda.Error, good.astype(np.int32)),
        ("bf16 of float32", kda.Error, kda.bf16(good.astype(np.float32))),
        ("rows - 1", kda.Error, kda.bf16(good[:-1]) if N > 1 else kda.bf16(good[:0])),
        ("rows + 1", kda.Error, kda.bf16(np.concatenate([good, good[:1]]))),
        ("cols + 1", kda.Error, kda.bf16(np.zeros((N,) + (good.shape[1] + 1,) + good.shape[2:],
                                                  np.uint16))),
        ("inner stride 2", kda.Error, kda.bf16(np.repeat(good, 2, axis=-1)[..., ::2])
         if good.shape[-1] > 1 else None),
        ("read-only", kda.Error, kda.bf16(readonly(good))),
        ("misaligned", kda.Error, kda.bf16(misaligned(good))),
        ("3-D", kda.Error, kda.bf16(good.reshape((1,) + good.shape))),
        ("0-D", kda.Error, kda.bf16(np.zeros((), np.uint16))),
        ("list", TypeError, good.tolist()),
        ("None", kda.Error, None),
    ]
    if N > 1:  # (a single row's stride is never read)
        bad_forms += [
            ("reversed rows", kda.Error, kda.bf16(good[::-1])),
            ("zero row stride", kda.Error, kda.bf16(np.lib.stride_tricks.as_strided(
                good, strides=(0,) + good.strides[1:]))),
        ]
    if i == 3 and N * t.HV > 1:  # (size-1 dims take any stride)
        bad_forms.append(("out strided rows", kda.Error, kda.bf16(
            np.zeros((N, t.HV, V + 2), np.uint16)[:, :, :V])))
    what, exc, value = rng.choice(bad_forms)
    args = [kda.bf16(v) for v in x]
    args[i] = value
    return Attack(f"{call} {names[i]} {what}", lambda: fn(layer, *args), exc,
                  f"{call}: {names[i]}")


def readonly(array):
    array = np.array(array)
    array.flags.writeable = False
    return array


def misaligned(array):
    """A copy of `array` at an odd address (not aligned to its element size)."""
    raw = np.zeros(array.nbytes + 1, np.uint8)
    out = np.frombuffer(raw.data, dtype=array.dtype, count=array.size, offset=1).reshape(
        array.shape)
    out[...] = array
    return out


def dummy(t):
    """Tensors of the right dtypes (any shape): the lifecycle is checked before the shapes."""
    return [kda.bf16(np.zeros(shape, np.uint16))
            for shape in ((1, t.D), (1, t.HV * K), (1, t.HV), (1, t.HV, V))]


def lifecycle_attacks(t, rng):
    """A call out of order: kda.Error(LIFECYCLE) naming the call."""
    a, r = t.a, t.round
    x = dummy(t)
    slot = rng.choice(sorted(t.allocated))
    L = kda.LIFECYCLE
    if r is None:
        return rng.choice([
            Attack("verify idle", lambda: a.verify(0, *x), kda.Error,
                   "verify(layer 0): no batch prepared", code=L),
            Attack("extend idle", lambda: a.extend(0, *x), kda.Error,
                   "extend(layer 0): no batch prepared", code=L),
            Attack("commit idle", lambda: a.commit(np.ones(1, np.int32)), kda.Error,
                   "commit: no verify round", code=L),
            Attack("commit_tree idle", lambda: a.commit_tree(
                np.ones(1, np.int32), np.zeros((1, 1), np.int32)), kda.Error,
                "commit_tree: no verify round", code=L),
            Attack("graph round idle", a.record_graph_verify_round, kda.Error,
                   "record_graph_verify_round", code=L),
        ] + ([Attack("allocate full", a.allocate_slot, kda.Error, "allocate_slot: all",
                     code=kda.OUT_OF_MEMORY)] if len(t.allocated) == t.S else []))
    if r["kind"] == "extend":
        return rng.choice([
            Attack("verify in extend", lambda: a.verify(0, *x), kda.Error,
                   "verify(layer 0)", code=L),
            Attack("commit in extend", lambda: a.commit(np.ones(r["B"], np.int32)), kda.Error,
                   "commit: the current round is an extend round", code=L),
            Attack("materialize in extend", lambda: a.materialize([slot]), kda.Error,
                   "materialize: a round is in progress", code=L),
        ] + ([Attack("release an extend track slot",
                     lambda: a.release_slot(r["tracks"][0]), kda.Error,
                     "release_slot: slot", code=L)] if r["tracks"] else []))
    live = [s for s in r["slots"] if s >= 0]
    attacks = [
        Attack("extend in verify", lambda: a.extend(0, *x), kda.Error,
               "extend(layer 0)", code=L),
        Attack("materialize in verify", lambda: a.materialize([slot]), kda.Error,
               "materialize: a round is in progress", code=L),
        Attack("copy_slot in verify", lambda: a.copy_slot(slot, slot), kda.Error,
               "copy_slot: a round is in progress", code=L),
        Attack("release a batch slot", lambda: a.release_slot(live[0]), kda.Error,
               f"release_slot: slot {live[0]} belongs to request", code=L),
    ]
    if r["done"]:
        done = min(r["done"])
        attacks.append(Attack("verify twice", lambda: a.verify(done, *x),
                              kda.Error, f"verify(layer {done}): layer {done} was already",
                              code=L))
        attacks.append(Attack("prepare mid-round", lambda: a.prepare(1, live), kda.Error,
                              "prepare: the verify round in progress", code=L))
    if len(r["done"]) < t.layers:
        attacks.append(Attack("commit early", lambda: a.commit(np.ones(r["B"], np.int32)),
                              kda.Error, "commit: only", code=L))
    elif r["parents"] is not None:
        attacks.append(Attack("commit a tree as a chain", lambda: a.commit(
            np.ones(r["B"], np.int32)), kda.Error, "commit: the prepared round is a tree",
            code=L))
    else:
        attacks.append(Attack("commit_tree a chain", lambda: a.commit_tree(
            np.ones(r["B"], np.int32), np.zeros((r["B"], r["T"]), np.int32)), kda.Error,
            "commit_tree: the prepared round is a", code=L))
    return rng.choice(attacks)


def value_attacks(t, rng):
    """In-range values the backend refuses (its own messages): kda.Error naming the argument."""
    a = t.a
    live = sorted(t.allocated)
    free = sorted(set(range(t.S)) - t.allocated)
    cases = []
    if t.round is None:
        s = live[0]
        if t.R >= 2:
            cases.append(Attack("prepare twice the slot", lambda: a.prepare(1, [s, s]),
                                kda.Error, "prepare: slots[0] and slots[1] are both"))
        cases += [
            Attack("prepare too many", lambda: a.prepare(1, [-1] * (t.R + 1)), kda.Error,
                   "prepare: batch of"),
            Attack("prepare empty", lambda: a.prepare(1, []), kda.Error, "prepare: empty batch"),
            Attack("prepare huge", lambda: a.prepare(1, [-1] * 100003), kda.Error,
                   "prepare: batch of 100003 requests exceeds"),
            Attack("materialize huge", lambda: a.materialize(list(range(t.S)) * 30000),
                   kda.Error, "materialize: slots["),
            Attack("prepare_extend bad track step", lambda: a.prepare_extend(
                2, [s], [free[0] if free else s], [2]), kda.Error, "prepare_extend: track"),
            Attack("copy_slot same", lambda: a.copy_slot(s, s), kda.Error,
                   "copy_slot: src and dst are both"),
            Attack("materialize twice", lambda: a.materialize([s, s]), kda.Error,
                   "materialize: slots[0] and slots[1]"),
            Attack("prepare lengths > T", lambda: a.prepare(1, [s], lengths=[2]), kda.Error,
                   "prepare: lengths[0] = 2 out of range [1, 1]"),
            Attack("prepare lengths count", lambda: a.prepare(2, [s], lengths=[1, 1]),
                   kda.Error, "prepare: lengths has 2 entries"),
            Attack("prepare offsets mismatch", lambda: a.prepare(
                2, [s], lengths=[2], offsets=[0, 1]), kda.Error, "prepare: offsets[1]"),
            Attack("prepare offsets alone", lambda: a.prepare(2, [s], offsets=[0, 2]),
                   kda.Error, "prepare: offsets were given without lengths"),
            Attack("prepare parents count", lambda: a.prepare(2, [s], parents=[-1]), kda.Error,
                   "prepare: parents has 1 entries"),
            Attack("prepare parents root", lambda: a.prepare(2, [s], parents=[0, 0]), kda.Error,
                   "parents"),
        ]
        if free:
            f = free[0]
            cases += [
                Attack("prepare unallocated", lambda: a.prepare(1, [f]), kda.Error,
                       f"prepare: slots[0] = {f} is not allocated"),
                Attack("release unallocated", lambda: a.release_slot(f), kda.Error,
                       f"release_slot: slot {f} is not allocated"),
                Attack("copy_slot unallocated", lambda: a.copy_slot(s, f), kda.Error,
                       f"copy_slot: dst = {f} is not an allocated slot"),
                Attack("materialize unallocated", lambda: a.materialize([f]), kda.Error,
                       f"materialize: slots[0] = {f} is not an allocated slot"),
            ]
    cases += [
        string_attacks(t, rng),
        Attack("set_layer_weights dtype", lambda: a.set_layer_weights(
            0, t.weights[0][0].astype(np.float64), *t.weights[0][1:]), kda.Error,
            "set_layer_weights(layer 0): A_log"),
        Attack("set_layer_weights shape", lambda: a.set_layer_weights(
            0, t.weights[0][0], t.weights[0][1][:-1], *t.weights[0][2:]), kda.Error,
            "set_layer_weights(layer 0): dt_bias"),
    ]
    return rng.choice(cases)


ATTACKS = [int_attacks, type_attacks, tensor_attacks, lifecycle_attacks, value_attacks]


def run_attack(t, attack, stats):
    before = t.snapshot(t.a)
    try:
        attack.fn()
    except (kda.Error, TypeError) as e:
        check(isinstance(e, attack.exc),
              f"{attack.what}: {type(e).__name__}({e}), expected {attack.exc.__name__}")
        if isinstance(e, kda.Error):
            check(e.code == attack.code, f"{attack.what}: code {e.code_name} ({e}), expected "
                  f"{kda._CODE_NAMES[attack.code]}")
        for n in attack.needles:
            check(n in str(e), f"{attack.what}: message {str(e)!r} does not name {n!r}")
        stats[type(e).__name__] = stats.get(type(e).__name__, 0) + 1
    except Exception as e:  # noqa: BLE001 - anything else escaped from inside the package
        raise Failure(f"{attack.what}: {type(e).__name__} escaped: {e}\n"
                      f"{traceback.format_exc()}") from None
    else:
        raise Failure(f"{attack.what}: accepted (expected {attack.exc.__name__} naming "
                      f"{attack.needles})")
    after = t.snapshot(t.a)
    check(after[1] == before[1], f"{attack.what}: the round state changed: {before[1]!r} -> "
          f"{after[1]!r}")
    check(after[2] == before[2], f"{attack.what}: backend info changed")
    for name in before[0]:
        check(after[0][name] == before[0][name], f"{attack.what}: pool tensor {name} changed")


def creation_attacks(rng, library, stats):
    """Bad flags, models, devices and options at creation: kda.Error / TypeError naming them."""
    model = kda.Model(num_layers=1, H=H, HV=1, K=K, V=V)
    good = ["--speculative-num-draft-tokens", "2", "--max-running-requests", "2"]
    cases = [
        (["--speculative-num-draft-tokens", rng.choice(["0", "17", "-1", "abc", "2.5", "",
                                                          "99999999999999999999"])],
         "--speculative-num-draft-tokens", kda.Error),
        (["--max-running-requests", rng.choice(["0", "4097", "x", " 2"])],
         "--max-running-requests", kda.Error),
        (["--linear-replayssm-cache-len", rng.choice(["3", "1", "512", "-8"])],
         "--linear-replayssm-cache-len", kda.Error),
        (["--kda-deferred-commit", rng.choice(["maybe", "1", "ON "])], "--kda-deferred-commit",
         kda.Error),
        ([rng.choice(["--no-such-flag", "-x", "speculative"])], "is not a flag of the module",
         kda.Error),
        ([rng.choice(["--speculative-num-draft-tokens=", "--max-running-requests"])],
         "--", kda.Error),
        (good + ["--speculative-eagle-topk", "2", "--kda-deferred-commit", "on"],
         "--kda-deferred-commit", kda.Error),
        (good + ["--enable-linear-replayssm-spec", "--linear-replayssm-cache-len", "2"],
         "--linear-replayssm-cache-len", kda.Error),
        (good + ["--speculative-num-draft-tokens", "2\x003"], "flags[5]", kda.Error),
        (good + ["\udc80"], "flags[4]", kda.Error),
        (good + [4], "flags[4]", TypeError),
        ("--max-running-requests", "flags", TypeError),
    ]
    flags, needle, exc = rng.choice(cases)
    kw = dict(model=model, flags=flags, library=library)
    what = f"create flags {flags!r}"
    r = rng.random()
    if r < 0.25:
        kw["flags"] = good
        choice = rng.choice([
            (dict(device=rng.choice(["host\x00junk", "tpu", "cuda:x", "", "cuda:-1"])),
             "create: device", kda.Error),
            (dict(device=rng.choice([None, 0, b"host"])), "create: device", TypeError),
            (dict(extra_slots=rng.choice([-1, 2 ** 31, 2 ** 40])), "create: extra_slots",
             kda.Error),
            (dict(extra_slots=rng.choice([1.0, "1"])), "create: extra_slots", TypeError),
            (dict(memory_budget_bytes=rng.choice([-1, 2 ** 63])), "create: memory_budget_bytes",
             kda.Error),
            (dict(memory_budget_bytes=1024), "over the memory budget", kda.Error),
            (dict(model=dict(num_layers=1, H=1, HV=1, K=K, V=V, bogus=1)), "unknown field",
             kda.Error),
            (dict(model=kda.Model(num_layers=rng.choice([0, 2 ** 32 + 1, -1]), H=1, HV=1, K=K,
                                  V=V)), "model.num_layers", kda.Error),
            (dict(model=kda.Model(num_layers=1, H=1, HV=1, K=rng.choice([32, 65, 2 ** 32 + 64]),
                                  V=V)), "K", kda.Error),
            (dict(model=kda.Model(num_layers=1, H=2, HV=3, K=K, V=V)), "HV", kda.Error),
            (dict(model=kda.Model(num_layers=1, H=1, HV=1, K=K, V=V, gate="safe",
                                  lower_bound=rng.choice([0.0, 1.0, float("nan"),
                                                          float("inf")]))),
             "lower_bound", kda.Error),
            (dict(model=kda.Model(num_layers="1", H=1, HV=1, K=K, V=V)), "model.num_layers",
             TypeError),
            (dict(model=kda.Model(num_layers=1, H=1, HV=1, K=K, V=V, gate="fast")),
             "model.gate", kda.Error),
        ])
        extra, needle, exc = choice
        kw.update(extra)
        what = f"create {extra!r}"
    try:
        be = kda.Backend(**kw)
    except (kda.Error, TypeError) as e:
        check(isinstance(e, exc), f"{what}: {type(e).__name__}({e}), expected {exc.__name__}")
        if exc is kda.Error:
            check(e.code in (kda.INVALID_ARGUMENT, kda.OUT_OF_MEMORY), f"{what}: {e!r}")
        check(needle in str(e), f"{what}: message {str(e)!r} does not name {needle!r}")
        stats[type(e).__name__] = stats.get(type(e).__name__, 0) + 1
    except Exception as e:  # noqa: BLE001
        raise Failure(f"{what}: {type(e).__name__} escaped: {e}") from None
    else:
        be.close()
        raise Failure(f"{what}: accepted")


def closed_attacks(t, rng, stats):
    """A closed backend refuses every call (LIFECYCLE naming it); closing again is a no-op."""
    a = t.a
    a.close()
    a.close()
    calls = [("allocate_slot", lambda: a.allocate_slot()),
             ("release_slot", lambda: a.release_slot(0)),
             ("prepare", lambda: a.prepare(1, [0])),
             ("verify(layer 0)", lambda: a.verify(0, None, None, None, None)),
             ("commit", lambda: a.commit(np.ones(1, np.int32))),
             ("materialize", lambda: a.materialize([0])),
             ("pool_view", lambda: a.pool_view("ssm_state")),
             ("backend_info", a.info),
             ("check_device_errors", a.check_device_errors)]
    call, fn = rng.choice(calls)
    try:
        fn()
    except kda.Error as e:
        check(e.code == kda.LIFECYCLE and f"{call}: the backend is closed" in str(e),
              f"closed backend, {call}: {e!r}")
        stats["Error"] = stats.get("Error", 0) + 1
    else:
        raise Failure(f"closed backend, {call}: accepted")


# ---------------------------------------------------------------------------------------------
# One case


def run_case(seed, index, library):
    rng = random.Random(f"{seed}:{index}")
    nrng = np.random.default_rng([seed, index])
    stats = {"attacks": 0, "steps": 0, "flagged": 0}
    for _ in range(rng.randint(0, 2)):
        creation_attacks(rng, library, stats)
        stats["attacks"] += 1
    t = Twin(rng, nrng, library)
    for step in range(rng.randint(6, 14)):
        where = f"step {step} ({t.mode}, round {t.round and t.round['kind']})"
        for _ in range(rng.choice([0, 1, 1, 2])):
            attack = rng.choice(ATTACKS)(t, rng)
            if attack is not None:
                run_attack(t, attack, stats)
                stats["attacks"] += 1
        r = t.round
        if r is None:
            choice = rng.random()
            if choice < 0.55:
                t.prepare()
            elif choice < 0.7:
                t.prepare_extend()
            elif choice < 0.78:
                t.both("materialize", rng.sample(sorted(t.allocated),
                                                 rng.randint(1, len(t.allocated))))
            elif choice < 0.84 and len(t.allocated) >= 2:
                src, dst = rng.sample(sorted(t.allocated), 2)
                t.both("copy_slot", src, dst)
            elif choice < 0.92 and len(t.allocated) >= 2:
                t.release(rng.choice(sorted(t.allocated)))
            elif len(t.allocated) < t.S:
                t.allocate()
        elif r["kind"] == "verify" and len(r["done"]) == t.layers:
            if rng.random() < 0.1:
                t.both("abort_round")
                t.round = None
            else:
                stats["flagged"] += t.commit()
        else:
            if rng.random() < 0.06:
                t.both("abort_round")
                t.round = None
            else:
                t.run_layer(min(set(range(t.layers)) - r["done"]))
        stats["steps"] += 1
        t.same_twins(where)
    if t.round is not None:
        t.both("abort_round")
        t.round = None
    t.both("materialize", sorted(t.allocated))
    t.same_twins("end")
    closed_attacks(t, rng, stats)
    stats["attacks"] += 1
    t.b.close()
    return stats


def child(args):
    """Runs cases [first, first + count); one JSON line per case on stdout ("start" first, so
    that the parent can name the case a crash or hang happened in)."""
    for index in range(args.first, args.first + args.count):
        print(json.dumps({"start": index}), flush=True)
        try:
            stats = run_case(args.seed, index, args.library)
            print(json.dumps({"case": index, "ok": True, **stats}), flush=True)
        except Exception as e:  # noqa: BLE001 - a failed case; the others still run
            print(json.dumps({"case": index, "ok": False, "error": f"{type(e).__name__}: {e}",
                              "trace": traceback.format_exc()}), flush=True)
    return 0


def parent(args):
    t0 = time.time()
    script = os.path.abspath(__file__)
    batches = [(first, min(args.batch, args.cases - first))
               for first in range(0, args.cases, args.batch)]
    running, results, failures = [], [], []
    logdir = tempfile.mkdtemp(prefix="kda_fuzz_", dir=os.environ.get("TEST_TMPDIR"))

    def launch(first, count):
        # Files, not pipes: a child never blocks on a full pipe while the parent waits for it.
        log = open(os.path.join(logdir, f"batch_{first}.log"), "w+")
        out = open(os.path.join(logdir, f"batch_{first}.jsonl"), "w+")
        cmd = [sys.executable, script, "--child", "--library", args.library, "--seed",
               str(args.seed), "--first", str(first), "--count", str(count)]
        proc = subprocess.Popen(cmd, stdout=out, stderr=log, text=True)
        return dict(proc=proc, first=first, count=count, log=log, out=out, started=time.time())

    def finish(job, timed_out):
        proc = job["proc"]
        if timed_out:
            proc.kill()
        proc.wait()
        job["out"].seek(0)
        out = job["out"].read()
        job["out"].close()
        started, done = set(), set()
        for line in out.splitlines():
            record = json.loads(line)
            if "start" in record:
                started.add(record["start"])
                continue
            done.add(record["case"])
            results.append(record)
            if not record["ok"]:
                failures.append(f"case {record['case']}: {record['error']}\n{record['trace']}")
        lost = sorted(started - done)
        rerun = (f"rerun: {sys.executable} {script} --child --library {args.library} --seed "
                 f"{args.seed} --first {lost[0] if lost else job['first']} --count 1")
        job["log"].seek(0)
        tail = job["log"].read()[-2000:]
        if timed_out:
            failures.append(f"batch {job['first']}: hang (no exit after {args.timeout} s) in case "
                            f"{lost[0] if lost else '?'}; {rerun}")
        elif proc.returncode != 0:
            failures.append(f"batch {job['first']}: exit status {proc.returncode} (a crash) in "
                            f"case {lost[0] if lost else '?'}; {rerun}\n{tail}")
        elif len(done) != job["count"]:
            failures.append(f"batch {job['first']}: {len(done)} of {job['count']} cases reported")
        job["log"].close()
        if (timed_out or proc.returncode != 0) and lost:
            # The batch's cases after the one that crashed or hung still run, in a batch of
            # their own.
            end = job["first"] + job["count"]
            if lost[0] + 1 < end:
                pending.append((lost[0] + 1, end - lost[0] - 1))

    pending = list(batches)
    while pending or running:
        while pending and len(running) < args.jobs:
            running.append(launch(*pending.pop(0)))
        time.sleep(0.02)
        for job in list(running):
            timed_out = time.time() - job["started"] > args.timeout
            if job["proc"].poll() is not None or timed_out:
                running.remove(job)
                finish(job, timed_out)

    elapsed = time.time() - t0
    totals = {}
    for r in results:
        for k, v in r.items():
            if isinstance(v, int) and not isinstance(v, bool) and k != "case":
                totals[k] = totals.get(k, 0) + v
    ok = sum(1 for r in results if r["ok"])
    print(f"fuzz: seed {args.seed}, {args.cases} cases in {len(batches)} subprocess batches, "
          f"{elapsed:.1f} s: {ok} passed; {totals.get('steps', 0)} lifecycle steps, "
          f"{totals.get('attacks', 0)} adversarial calls ({totals.get('Error', 0)} kda.Error, "
          f"{totals.get('TypeError', 0)} TypeError), {totals.get('flagged', 0)} bad accepted "
          f"lengths / paths / tracks flagged on the device")
    for f in failures[:20]:
        print("FAIL:", f)
    if failures:
        print(f"fuzz: {len(failures)} failures")
        return 1
    return 0


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--library", required=True, help="libkda_c.so")
    p.add_argument("--seed", type=int, default=59)
    p.add_argument("--cases", type=int, default=600)
    p.add_argument("--batch", type=int, default=50, help="cases per subprocess")
    p.add_argument("--jobs", type=int, default=2, help="subprocesses at a time")
    p.add_argument("--timeout", type=float, default=30.0,
                   help="seconds per batch (a hang; a batch takes about 1 s)")
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--first", type=int, default=0)
    p.add_argument("--count", type=int, default=1)
    args = p.parse_args()
    args.library = os.path.abspath(args.library)
    return child(args) if args.child else parent(args)


if __name__ == "__main__":
    sys.exit(main())
