"""kda: the KDA attention backend from Python, over its C ABI (capi/kda_c.h) with ctypes.

    import kda
    be = kda.Backend(model=kda.Model(num_layers=1, H=2, HV=4, K=64, V=64),
                     flags=["--speculative-num-draft-tokens", "4"], device="host")
    be.set_layer_weights(0, A_log, dt_bias, conv_weight, conv_bias)
    slot = be.allocate_slot()
    be.prepare(T=4, slots=[slot])
    be.verify(0, mixed_qkv, a, b, out, stream=s)      # any __dlpack__ tensors
    be.commit(accepted_lengths, stream=s)

Tensors: any object with ``__dlpack__`` (torch tensors on the GPU, numpy arrays on the host);
numpy has no bfloat16, so pass bf16 data as uint16 wrapped in ``kda.bf16(array)``. The package
never owns a tensor: it borrows it for the call (weights: for as long as the layer may run, and
it keeps a reference to them). Streams: an integer cudaStream_t handle (e.g.
``torch.cuda.current_stream().cuda_stream``) or an object with ``.cuda_stream``; 0 = the legacy
default stream; the host kernel set ignores it. Errors: an argument of the wrong Python type
raises TypeError naming it; every other failure raises ``kda.Error`` (``.code``, ``.code_name``;
the message names the argument): integers outside their C type's or their own range, strings
with a NUL or not UTF-8 encodable, and everything the library refuses (_args.py). The library:
``library=PATH``, else $KDA_LIBRARY, else beside the package or in <prefix>/lib (see
_lib.candidates).
"""

import ctypes
import dataclasses
from dataclasses import dataclass

from . import _args
from . import _dlpack
from . import _lib
from ._errors import CODE_NAMES as _CODE_NAMES  # noqa: F401 - kda._CODE_NAMES, as before
from ._errors import (CUDA, INTERNAL, INVALID_ARGUMENT, IO, LIFECYCLE, OK, OUT_OF_MEMORY,
                      UNSUPPORTED, Error)

POOL_TENSORS = ("conv_state", "ssm_state", "conv_window", "snapshots", "ring_rawv", "ring_rawk",
                "ring_g", "ring_beta", "ring_pending", "ring_u", "ring_cursor", "qkv_act")

__all__ = ["Backend", "Model", "Error", "DispatchInfo", "PoolView", "bf16", "load_library",
           "POOL_TENSORS", "OK", "INVALID_ARGUMENT", "LIFECYCLE", "UNSUPPORTED", "CUDA",
           "OUT_OF_MEMORY", "IO", "INTERNAL"]


def load_library(path=None):
    """Loads (once) and returns the C library; see _lib.candidates for the search order."""
    return _lib.load(_args.path(path, "load_library", "path"))


@dataclass
class Model:
    """kda::ModelConfig: the KDA layers' shape. gate: "standard" or "safe" (with lower_bound);
    conv_weight_dtype: "f32" or "bf16"."""
    num_layers: int
    H: int
    HV: int
    K: int
    V: int
    gate: str = "standard"
    lower_bound: float = 0.0
    conv_weight_dtype: str = "f32"
    has_conv_bias: bool = False

    def _c(self):
        call = "create"
        gates = {"standard": 0, "safe": 1}
        dtypes = {"f32": 0, "float32": 0, "bf16": 1, "bfloat16": 1}
        dims = [_args.integer(getattr(self, f), call, f"model.{f}", 1)
                for f in ("num_layers", "H", "HV", "K", "V")]
        gate = _args.string(self.gate, call, "model.gate").decode()
        if gate not in gates:
            raise Error(INVALID_ARGUMENT, f"create: model.gate '{gate}' unsupported, "
                        "expected 'standard' or 'safe'")
        wtype = _args.string(self.conv_weight_dtype, call, "model.conv_weight_dtype").decode()
        if wtype not in dtypes:
            raise Error(INVALID_ARGUMENT, "create: model.conv_weight_dtype "
                        f"'{wtype}' unsupported, expected 'f32' or 'bf16'")
        lower_bound = _args.real(self.lower_bound, call, "model.lower_bound")
        bias = _args.flag(self.has_conv_bias, call, "model.has_conv_bias")
        return _lib.ModelConfig(*dims, gates[gate], lower_bound, dtypes[wtype], bias)

    @classmethod
    def _from(cls, model):
        """A Model, or a dict of Model's fields (every required one, no other)."""
        if isinstance(model, cls):
            return model
        if not isinstance(model, dict):
            raise TypeError(f"create: model: expected a kda.Model or a dict, got "
                            f"{type(model).__name__}")
        fields = {f.name: f for f in dataclasses.fields(cls)}
        for key in model:
            if key not in fields:
                raise Error(INVALID_ARGUMENT, f"create: model: unknown field {key!r} (fields: "
                            f"{', '.join(fields)})")
        for name, f in fields.items():
            if name not in model and f.default is dataclasses.MISSING:
                raise Error(INVALID_ARGUMENT, f"create: model: missing field {name!r}")
        return cls(**model)


@dataclass
class DispatchInfo:
    """What a verify ran: the fused kernel (with its V tile) or the unfused pair, and why."""
    fused: bool
    block_v: int
    reason: str


class bf16:
    """Marks a 16-bit integer tensor (numpy uint16 holding bfloat16 bits) as bfloat16."""

    __slots__ = ("tensor",)

    def __init__(self, tensor):
        self.tensor = tensor


_BF16 = _dlpack.DLDataType(_dlpack.kDLBfloat, 16, 1)




class PoolView:
    """A pool tensor as a DLPack producer (``__dlpack__``, ``__dlpack_device__``): memory the
    backend owns, kept alive by the view; e.g. ``torch.from_dlpack(view)`` on a CUDA backend.
    ``dtype`` is "bfloat16", "float32" or "int32"; shape and strides are in elements."""

    def __init__(self, backend, name, layer, tensor):
        self._backend = backend
        self._tensor = tensor
        self.name = name
        self.layer = layer
        self.shape = tuple(tensor.shape[d] for d in range(tensor.ndim))
        self.strides = tuple(tensor.strides[d] for d in range(tensor.ndim))
        self.dtype = _dlpack.dtype_name(tensor.dtype)
        self.data_ptr = tensor.data or 0

    def __dlpack_device__(self):
        return (self._tensor.device.device_type, self._tensor.device.device_id)

    def __dlpack__(self, stream=None, max_version=None, dl_device=None, copy=None):
        # The pool is written on the backend's stream: order reads on it (the caller's job).
        # DLPack 0.6 only: an unversioned "dltensor" capsule whatever max_version asks.
        del stream, max_version
        if dl_device is not None and tuple(dl_device) != self.__dlpack_device__():
            raise BufferError(f"pool_view: {self.name} lives on {self.__dlpack_device__()}, "
                              f"cannot export to {tuple(dl_device)}")
        if copy:
            raise BufferError("pool_view: exports the pool's memory, never a copy")
        return _dlpack.export_capsule(self._tensor, self._backend)

    def numpy(self):
        """A writable numpy array over the memory (host backends only; bfloat16 as uint16)."""
        import numpy as np
        if self._tensor.device.device_type != _dlpack.kDLCPU:
            raise Error(INVALID_ARGUMENT, f"pool_view: {self.name} is on the GPU: use "
                        "torch.from_dlpack(view) instead of numpy()")
        dtype = {"bfloat16": np.uint16, "float32": np.float32, "int32": np.int32,
                 "float16": np.float16}[self.dtype]
        itemsize = np.dtype(dtype).itemsize
        span = 1 + sum((n - 1) * s for n, s in zip(self.shape, self.strides)) if all(
            self.shape) else 0
        buf = (ctypes.c_char * max(span * itemsize, 1)).from_address(self.data_ptr)
        flat = np.frombuffer(buf, dtype=dtype, count=span)
        arr = np.lib.stride_tricks.as_strided(
            flat, shape=self.shape, strides=tuple(s * itemsize for s in self.strides),
            writeable=True)
        # The array's base chain holds `buf`; `buf` holds the backend, the memory's owner.
        buf._kda_owner = self._backend
        return arr


class Backend:
    """kda::KdaAttentionBackend through the C ABI. Not thread-safe (one thread drives it)."""

    def __init__(self, model, flags=(), device="host", *, extra_slots=0,
                 memory_budget_bytes=0, library=None):
        self._h = None
        self._weights = {}
        model = Model._from(model)
        c_model = model._c()
        flag_list = _args.sequence(flags, "create", "flags")
        encoded = [_args.string(f, "create", f"flags[{i}]") for i, f in enumerate(flag_list)]
        c_device = _args.string(device, "create", "device")
        options = _lib.BackendOptions(
            _args.integer(memory_budget_bytes, "create", "memory_budget_bytes", 0,
                          _args.INT64_MAX),
            _args.integer(extra_slots, "create", "extra_slots", 0))
        self._lib = _lib.load(_args.path(library, "create", "library"))
        argv = (ctypes.c_char_p * max(len(encoded), 1))(*encoded)
        handle = ctypes.c_void_p()
        self._check(self._lib.kda_backend_create(ctypes.byref(c_model), argv, len(encoded),
                                                 c_device, ctypes.byref(options),
                                                 ctypes.byref(handle)))
        self._h = handle
        self.model = model
        self.flags = tuple(flag_list)
        self.device = device
        # The configuration's ranges (fixed at creation), for the arguments' own range checks.
        info = self.info()
        self._num_layers = info["num_layers"]
        self._num_slots = info["num_slots"]
        self._num_rows = info["num_rows"]
        self._max_tokens = info["max_draft_tokens"]

    # ---- plumbing ----
    def _check(self, status):
        if status != OK:
            raise Error(status, self._lib.kda_last_error().decode(errors="replace"))

    def _handle(self, call):
        if self._h is None:
            raise Error(LIFECYCLE, f"{call}: the backend is closed")
        return self._h

    def _borrow(self, obj, call, name, stream=0):
        """obj as a Borrowed DLTensor for one call (None: None). Not a tensor: TypeError; a
        tensor whose producer refuses to export it (read-only numpy, ...): kda.Error."""
        if obj is None:
            return None
        override = None
        if isinstance(obj, bf16):
            obj, override = obj.tensor, _BF16
        if not hasattr(obj, "__dlpack__"):
            raise TypeError(f"{call}: {name}: expected a tensor with __dlpack__ (numpy array, "
                            f"torch tensor), got {type(obj).__name__}")
        try:
            return _dlpack.as_dltensor(obj, f"{call}: {name}", stream, override)
        except Exception as e:  # the producer's own error, whatever its type
            message = str(e) if str(e).startswith(call) else f"{call}: {name}: {e}"
            if isinstance(e, TypeError):
                raise TypeError(message) from None
            raise Error(INVALID_ARGUMENT, message) from None

    def _layer(self, layer, call, lo=0):
        return _args.integer(layer, call, "layer", lo, self._num_layers, hi_open=True)

    def _slot(self, slot, call, name):
        return _args.integer(slot, call, name, 0, self._num_slots, hi_open=True)

    def close(self):
        """Frees the backend and its pool (work on the stream must have run). Idempotent."""
        if self._h is not None:
            self._lib.kda_backend_destroy(self._h)
            self._h = None
            self._weights.clear()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __del__(self):
        try:
            self.close()
        except Exception:  # interpreter shutdown
            pass

    # ---- configuration ----
    def set_layer_weights(self, layer, A_log, dt_bias, conv_weight, conv_bias=None):
        """Layer weights (views: kept referenced here until replaced or close())."""
        layer = self._layer(layer, "set_layer_weights")
        call = f"set_layer_weights(layer {layer})"
        h = self._handle(call)
        ws = [self._borrow(t, call, n) for t, n in
              ((A_log, "A_log"), (dt_bias, "dt_bias"), (conv_weight, "conv_weight"),
               (conv_bias, "conv_bias"))]
        self._check(self._lib.kda_set_layer_weights(
            h, layer, *[w.ptr if w is not None else None for w in ws]))
        self._weights[layer] = ws

    def info(self):
        """num_layers, num_slots, num_rows, max_draft_tokens, ring_len, record_mode ("ring" /
        "snapshot"), deferred_commit, device, free_slots, batch_size, tokens_per_request,
        draft_shape ("dense" / "ragged" / "tree": the prepared verify round's) and
        batch_tokens (the prepared round's activation rows N)."""
        out = _lib.BackendInfo()
        self._check(self._lib.kda_backend_info_get(self._handle("backend_info"),
                                                   ctypes.byref(out)))
        d = {name: getattr(out, name) for name, _ in _lib.BackendInfo._fields_}
        d["record_mode"] = "ring" if d["record_mode"] == 1 else "snapshot"
        d["deferred_commit"] = bool(d["deferred_commit"])
        d["draft_shape"] = ("dense", "ragged", "tree")[d["draft_shape"]]
        d["device"] = "host" if d.pop("device_type") == _dlpack.kDLCPU else \
            f"cuda:{d['device_id']}"
        d.pop("device_id")
        return d

    @property
    def deferred_commit(self):
        return self.info()["deferred_commit"]

    @property
    def num_slots(self):
        return self.info()["num_slots"]

    @property
    def round_state(self):
        s = ctypes.c_char_p()
        self._check(self._lib.kda_round_state(self._handle("round_state"), ctypes.byref(s)))
        return s.value.decode()

    # ---- slots ----
    def allocate_slot(self, stream=0):
        st = _args.stream(stream, "allocate_slot")
        slot = ctypes.c_int32(-1)
        self._check(self._lib.kda_allocate_slot(self._handle("allocate_slot"), st,
                                                ctypes.byref(slot)))
        return slot.value

    def release_slot(self, slot):
        slot = self._slot(slot, "release_slot", "slot")
        self._check(self._lib.kda_release_slot(self._handle("release_slot"), slot))

    def copy_slot(self, src, dst, stream=0):
        src = self._slot(src, "copy_slot", "src")
        dst = self._slot(dst, "copy_slot", "dst")
        st = _args.stream(stream, "copy_slot")
        self._check(self._lib.kda_copy_slot(self._handle("copy_slot"), src, dst, st))

    # ---- lifecycle ----
    def prepare(self, T, slots, rows=None, stream=0, *, lengths=None, offsets=None,
                parents=None):
        """A verify round: len(slots) requests of T tokens (-1 = padding); rows: scratch rows
        (None = batch positions). Draft shapes (contract §8): lengths, a ragged chain (request n
        verifies lengths[n] tokens in [1, T]; verify then takes sum(lengths) activation rows),
        with optional offsets (B + 1 packed start rows, SGLang's query_start_loc); or parents,
        a tree of T nodes per request (B*T entries: node j's parent within its request, -1 for
        node 0; commit with commit_tree). Host sequences."""
        call = "prepare"
        T = _args.integer(T, call, "T", 1, self._max_tokens,
                          note=" (--speculative-num-draft-tokens)")
        s, n = _args.int_array(slots, call, "slots", -1, self._num_slots, hi_open=True,
                               note=" (-1 = padding row)")
        r = None
        if rows is not None:
            r, nr = _args.int_array(rows, call, "rows", 0, self._num_rows, hi_open=True,
                                    note=" (--max-running-requests)")
            if nr != n:
                raise Error(INVALID_ARGUMENT, f"prepare: rows has {nr} entries for {n} "
                            "requests (None = batch position)")
        st = _args.stream(stream, call)
        h = self._handle(call)
        if lengths is None and offsets is None and parents is None:
            self._check(self._lib.kda_prepare(h, T, s, n, r, st))
            return
        shaped = []
        for values, name, want, lo, hi, open_ in (
                (lengths, "lengths", n, 1, T, False),
                (offsets, "offsets", n + 1, 0, _args.INT32_MAX, False),
                (parents, "parents", n * T, -1, T, True)):
            if values is None:
                shaped.append(None)
                continue
            arr, count = _args.int_array(values, call, name, lo, hi, hi_open=open_)
            if count != want:
                raise Error(INVALID_ARGUMENT, f"prepare: {name} has {count} entries, expected "
                            f"{want} for {n} requests of T={T}")
            shaped.append(arr)
        self._check(self._lib.kda_prepare_shaped(h, T, s, n, r, *shaped, st))

    def prepare_extend(self, T, slots, track_slots=None, track_steps=None, stream=0):
        """An extend (prefill) round: len(slots) requests of T prompt tokens (-1 = padding);
        track_slots / track_steps (both or neither, one entry per request): prefix-cache tracks
        (the state after prompt token track_steps[n] into slot track_slots[n]; -1 = none)."""
        call = "prepare_extend"
        T = _args.integer(T, call, "T", 1)
        s, n = _args.int_array(slots, call, "slots", -1, self._num_slots, hi_open=True,
                               note=" (-1 = padding row)")
        ts = tp = None
        if track_slots is not None or track_steps is not None:
            if track_slots is None or track_steps is None:
                raise Error(INVALID_ARGUMENT, "prepare_extend: track_slots and track_steps "
                            "must be both given or both None")
            ts, nts = _args.int_array(track_slots, call, "track_slots")
            tp, ntp = _args.int_array(track_steps, call, "track_steps")
            if nts != n or ntp != n:
                raise Error(INVALID_ARGUMENT, f"prepare_extend: tracks have {nts} and {ntp} "
                            f"entries for {n} requests")
        st = _args.stream(stream, call)
        self._check(self._lib.kda_prepare_extend(self._handle(call), T, s, n, ts, tp, st))

    def _run(self, fn, name, layer, mixed_qkv, a, b, out, stream, *extra):
        layer = self._layer(layer, name)
        call = f"{name}(layer {layer})"
        st = _args.stream(stream, call)
        h = self._handle(call)
        ts = [self._borrow(t, call, n, st) for t, n in
              ((mixed_qkv, "mixed_qkv"), (a, "a"), (b, "b"), (out, "out"))]
        self._check(fn(h, layer, *[t.ptr if t is not None else None for t in ts], st, *extra))

    def verify(self, layer, mixed_qkv, a, b, out, stream=0):
        """Verifies `layer` of the prepared round; returns the DispatchInfo."""
        info = _lib.DispatchInfo()
        self._run(self._lib.kda_verify, "verify", layer, mixed_qkv, a, b, out, stream,
                  ctypes.byref(info))
        return DispatchInfo(bool(info.fused), info.block_v,
                            info.reason.decode() if info.reason else "")

    def extend(self, layer, mixed_qkv, a, b, out, stream=0):
        """Runs `layer` of the prepared extend round (the state after its tokens is committed)."""
        self._run(self._lib.kda_extend, "extend", layer, mixed_qkv, a, b, out, stream)

    def commit(self, accepted_lengths, stream=0, track_slots=None, track_steps=None):
        """Commits every layer: accepted_lengths [B] int32 on the backend's device; with
        track_slots/track_steps ([B] int32 on the device) also the prefix-cache tracks."""
        st = _args.stream(stream, "commit")
        h = self._handle("commit")
        acc = self._borrow(accepted_lengths, "commit", "accepted_lengths", st)
        if track_slots is None and track_steps is None:
            self._check(self._lib.kda_commit(h, acc.ptr if acc else None, st))
            return
        ts = self._borrow(track_slots, "commit", "track.slots", st)
        tp = self._borrow(track_steps, "commit", "track.steps", st)
        self._check(self._lib.kda_commit_tracked(h, acc.ptr if acc else None,
                                                 ts.ptr if ts else None,
                                                 tp.ptr if tp else None, st))

    def commit_tree(self, accepted_lengths, accepted_paths, stream=0, track_slots=None,
                    track_steps=None):
        """Commits a tree round: accepted_lengths [B] and accepted_paths [B, T] int32 on the
        backend's device (request i's path: node indices root first, accepted_lengths[i] of
        them); with track_slots/track_steps ([B] int32) also the prefix-cache tracks (track step
        k = the path's node k)."""
        st = _args.stream(stream, "commit_tree")
        h = self._handle("commit_tree")
        acc = self._borrow(accepted_lengths, "commit_tree", "accepted_lengths", st)
        paths = self._borrow(accepted_paths, "commit_tree", "accepted_paths", st)
        ptrs = [acc.ptr if acc else None, paths.ptr if paths else None]
        if track_slots is None and track_steps is None:
            self._check(self._lib.kda_commit_tree(h, *ptrs, st))
            return
        ts = self._borrow(track_slots, "commit_tree", "track.slots", st)
        tp = self._borrow(track_steps, "commit_tree", "track.steps", st)
        self._check(self._lib.kda_commit_tree_tracked(h, *ptrs, ts.ptr if ts else None,
                                                      tp.ptr if tp else None, st))

    def materialize(self, slots, stream=0):
        """Deferred commit: folds the pending steps of `slots` (allocated, distinct)."""
        s, n = _args.int_array(slots, "materialize", "slots", 0, self._num_slots, hi_open=True)
        st = _args.stream(stream, "materialize")
        self._check(self._lib.kda_materialize(self._handle("materialize"), s, n, st))

    def abort_round(self, stream=0):
        st = _args.stream(stream, "abort_round")
        self._check(self._lib.kda_abort_round(self._handle("abort_round"), st))

    def record_graph_verify_round(self):
        self._check(self._lib.kda_record_graph_verify_round(
            self._handle("record_graph_verify_round")))

    def check_device_errors(self, stream=0):
        st = _args.stream(stream, "check_device_errors")
        self._check(self._lib.kda_check_device_errors(self._handle("check_device_errors"), st))

    # ---- pool ----
    def pool_view(self, name, layer=-1):
        """Pool tensor `name` (POOL_TENSORS) of `layer` (-1: all layers) as a PoolView."""
        c_name = _args.string(name, "pool_view", "name")
        layer = self._layer(layer, "pool_view", lo=-1)
        t = _dlpack.DLTensor()
        self._check(self._lib.kda_pool_view(self._handle("pool_view"), c_name, layer,
                                            ctypes.byref(t)))
        return PoolView(self, name, layer, t)

    def pool_array(self, name, layer=-1):
        """Host backends: the pool tensor as a writable numpy array over the pool's memory
        (bfloat16 as uint16); valid while the backend lives (it keeps it alive)."""
        return self.pool_view(name, layer).numpy()
