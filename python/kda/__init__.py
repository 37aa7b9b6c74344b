"""kda: the KDA attention backend from Python, over its C ABI (capi/kda_c.h) with ctypes.

    import kda
    be = kda.Backend(model=kda.Model(num_layers=1, H=2, HV=4, K=64, V=64),
                     flags=["--speculative-num-draft-tokens", "4"], device="host")
    be.set_layer_weights(0, A_log, dt_bias, conv_weight, conv_bias)
    slot = be.allocate_slot()
    be.prepare(T=4, slots=[slot])
    be.verify(0, mixed_qkv, a, b, out, stream=s)      # any __dlpack__ tensors
    be.commit(accepted_lengths, stream=s)

Tensors: torch tensors (taken from their metadata, no __dlpack__ round trip and no stream
synchronisation: they must be ordered on the call's stream, which by default is torch's current
stream) or any object with ``__dlpack__`` (numpy arrays on the host; ``kda.via_dlpack(t)`` sends a
torch tensor through its capsule, with the producer's stream synchronisation); numpy has no
bfloat16, so pass bf16 data as uint16 wrapped in ``kda.bf16(array)``. The package never owns a
tensor: it borrows it for the call (weights and an external pool: for as long as the backend may
use them, and it keeps references to them). Streams: ``None`` (the default) = torch's current
stream of the backend's device when torch is imported and the backend is on CUDA, else 0; an
integer cudaStream_t handle (e.g. ``torch.cuda.current_stream().cuda_stream``) or an object with
``.cuda_stream``; 0 = the legacy default stream; the host kernel set ignores it. Memory: the
engine's allocator (``allocator=kda.TorchAllocator()``: PyTorch's caching allocator) and engine-
owned pool tensors (``external_pool={...}``) are Backend options; ``kda.ops`` runs verify / commit
/ materialize on the engine's own tensors without a Backend. Lifetime: pool views (and tensors
made from them) keep the backend's memory alive; ``close()`` ends the Backend's use at once and
frees its memory when the last view is gone. Errors: an argument of the wrong Python type
raises TypeError naming it; every other failure raises ``kda.Error`` (``.code``, ``.code_name``;
the message names the argument): integers outside their C type's or their own range, strings
with a NUL or not UTF-8 encodable, and everything the library refuses (_args.py). The library:
``library=PATH``, else $KDA_LIBRARY, else beside the package or in <prefix>/lib (see
_lib.candidates).
"""

import ctypes
import dataclasses
import sys
import weakref
from dataclasses import dataclass

from . import _args
from . import _dlpack
from . import _lib
from ._errors import CODE_NAMES as _CODE_NAMES  # noqa: F401 - kda._CODE_NAMES, as before
from ._errors import (CUDA, INTERNAL, INVALID_ARGUMENT, IO, LIFECYCLE, OK, OUT_OF_MEMORY,
                      UNSUPPORTED, Error)

POOL_TENSORS = ("conv_state", "ssm_state", "conv_window", "snapshots", "ring_rawv", "ring_rawk",
                "ring_g", "ring_beta", "ring_pending", "ring_u", "ring_cursor", "qkv_act")

__all__ = ["Backend", "Model", "Error", "DispatchInfo", "PoolView", "bf16", "via_dlpack",
           "Allocator", "TorchAllocator", "NumpyAllocator", "load_library", "ops",
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
    """What a verify ran: the fused kernel (with its V tile) or the unfused pair, and why; and
    its outputs' numerics (contract §10: fast_outputs, or exact) and why ("fast_requested",
    "auto_unmeasured", "exact_snapshot_mode", ...: kda::NumericsReason's names)."""
    fused: bool
    block_v: int
    reason: str
    fast_outputs: bool = False
    numerics_reason: str = ""

    @classmethod
    def _of(cls, info):
        """From the C ABI's kda_dispatch_info."""
        return cls(bool(info.fused), info.block_v, info.reason.decode() if info.reason else "",
                   bool(info.fast_outputs),
                   info.numerics_reason.decode() if info.numerics_reason else "")


class bf16:
    """Marks a 16-bit integer tensor (numpy uint16 holding bfloat16 bits) as bfloat16."""

    __slots__ = ("tensor",)

    def __init__(self, tensor):
        self.tensor = tensor


class via_dlpack:
    """Sends a tensor through its ``__dlpack__`` capsule (instead of the direct torch path). With
    ``sync=True`` (the default) a CUDA producer gets the call's stream and orders the tensor on it
    (torch records an event on its current stream and makes the call's stream wait); with
    ``sync=False`` it gets stream -1, DLPack's "no synchronisation": the no-sync DLPack path for a
    tensor already ordered on the call's stream (any producer: torch, cupy, ...)."""

    __slots__ = ("tensor", "sync")

    def __init__(self, tensor, sync=True):
        self.tensor = tensor
        self.sync = bool(sync)


_BF16 = _dlpack.DLDataType(_dlpack.kDLBfloat, 16, 1)


def _borrow_tensor(obj, call, name, stream=0):
    """obj (a tensor, kda.bf16, kda.via_dlpack; None: None) as a Borrowed DLTensor for one call.
    Not a tensor: TypeError; a tensor its producer will not export: kda.Error."""
    if obj is None:
        return None
    override = None
    force = False
    for _ in range(2):  # kda.bf16(kda.via_dlpack(t)) or kda.via_dlpack(kda.bf16(t))
        if isinstance(obj, via_dlpack):
            if not obj.sync:
                stream = -1  # DLPack: the producer must not synchronise
            obj, force = obj.tensor, True
        if isinstance(obj, bf16):
            obj, override = obj.tensor, _BF16
    if not hasattr(obj, "__dlpack__") and not _dlpack.is_torch_tensor(obj):
        raise TypeError(f"{call}: {name}: expected a tensor with __dlpack__ (numpy array, "
                        f"torch tensor), got {type(obj).__name__}")
    try:
        return _dlpack.as_dltensor(obj, f"{call}: {name}", stream, override, force)
    except Exception as e:  # the producer's own error, whatever its type
        message = str(e) if str(e).startswith(call) else f"{call}: {name}: {e}"
        if isinstance(e, TypeError):
            raise TypeError(message) from None
        raise Error(INVALID_ARGUMENT, message) from None


def _torch_stream(device_type, device_id):
    """torch's current stream of a CUDA device, when torch is imported; else 0."""
    torch = sys.modules.get("torch")
    if device_type != _dlpack.kDLCUDA or torch is None:
        return 0
    return int(torch.cuda.current_stream(device_id).cuda_stream)


# ---- engine allocators ----

class Allocator:
    """An engine allocator for ``Backend(allocator=...)``: every byte the backend owns comes from
    ``alloc`` and returns through ``free`` when it is destroyed. ``device`` is "host" or
    "cuda:N", ``stream`` the backend's allocation stream (an int cudaStream_t). ``alloc`` returns
    the block's address (an int, aligned to 256 bytes; 0 = out of memory); ``free`` must not
    raise. Exceptions raised by either are reported by the Backend call that caused them."""

    def alloc(self, nbytes, device, stream):
        raise NotImplementedError

    def free(self, ptr, nbytes, device, stream):
        raise NotImplementedError


class TorchAllocator(Allocator):
    """PyTorch's CUDA caching allocator (torch.cuda.caching_allocator_alloc / _delete): the
    backend's memory is in torch's pool and budget (torch.cuda.memory_allocated counts it),
    allocated on the backend's allocation stream. CUDA backends only."""

    def alloc(self, nbytes, device, stream):
        import torch
        if not device.startswith("cuda"):
            raise Error(UNSUPPORTED, f"TorchAllocator: {device} memory: torch's caching "
                        "allocator serves CUDA devices only")
        index = int(device.split(":")[1])
        return int(torch.cuda.caching_allocator_alloc(int(nbytes), device=index,
                                                      stream=int(stream)))

    def free(self, ptr, nbytes, device, stream):
        import torch
        torch.cuda.caching_allocator_delete(int(ptr))


class NumpyAllocator(Allocator):
    """Host memory from numpy (host backends: tests, tools). ``live`` maps each live block's
    address to its size; ``allocations`` / ``frees`` count calls."""

    def __init__(self):
        self.live = {}
        self._arrays = {}
        self.allocations = 0
        self.frees = 0

    def alloc(self, nbytes, device, stream):
        import numpy as np
        if device != "host":
            raise Error(UNSUPPORTED, f"NumpyAllocator: {device} memory: numpy serves the host")
        raw = np.empty(int(nbytes) + 256, np.uint8)
        address = raw.ctypes.data
        offset = (-address) % 256
        ptr = address + offset
        self._arrays[ptr] = raw
        self.live[ptr] = int(nbytes)
        self.allocations += 1
        return ptr

    def free(self, ptr, nbytes, device, stream):
        if self.live.pop(ptr, None) != int(nbytes):
            raise Error(INTERNAL, f"NumpyAllocator: free of {ptr:#x} ({nbytes} bytes): not a "
                        "live block of that size")
        del self._arrays[ptr]
        self.frees += 1


def _device_name(device_type, device_id):
    return f"cuda:{device_id}" if device_type == _dlpack.kDLCUDA else "host"


def _c_allocator(allocator, errors):
    """The kda_allocator struct over a Python Allocator, and the ctypes callbacks to keep alive.
    Exceptions inside the callbacks are appended to `errors` (alloc then returns NULL)."""

    def alloc(ctx, nbytes, device_type, device_id, stream):
        try:
            ptr = int(allocator.alloc(int(nbytes), _device_name(device_type, device_id),
                                      int(stream or 0)))
            return ptr or None
        except BaseException as e:  # noqa: B036 - reported by the Backend call
            errors.append(e)
            return None

    def free(ctx, ptr, nbytes, device_type, device_id, stream):
        try:
            allocator.free(int(ptr), int(nbytes), _device_name(device_type, device_id),
                           int(stream or 0))
        except BaseException as e:  # noqa: B036
            errors.append(e)

    fns = (_lib.AllocFn(alloc), _lib.FreeFn(free), _lib.ReleaseFn(lambda ctx: None))
    return _lib.Allocator(None, *fns), fns


def _state_struct(tensors, call, prefix, stream):
    """A dict {name: tensor} (names: POOL_TENSORS) as a kda_state_tensors struct; returns
    (struct, the Borrowed tensors to keep alive)."""
    if not isinstance(tensors, dict):
        raise TypeError(f"{call}: {prefix}: expected a dict of tensors (names "
                        f"{', '.join(POOL_TENSORS)}), got {type(tensors).__name__}")
    struct = _lib.StateTensors()
    kept = []
    for key, value in tensors.items():
        if not isinstance(key, str):
            raise TypeError(f"{call}: {prefix}: keys are tensor names (str), got "
                            f"{type(key).__name__}")
        if key not in POOL_TENSORS:
            raise Error(INVALID_ARGUMENT, f"{call}: {prefix}: unknown tensor {key!r} (names: "
                        f"{', '.join(POOL_TENSORS)})")
        b = _borrow_tensor(value, call, f"{prefix}.{key}", stream)
        if b is not None:
            setattr(struct, key, ctypes.pointer(b.tensor))
            kept.append(b)
    return struct, kept


class _Owner:
    """What the C backend's life hangs on: the Backend holds it until close(), its pool views,
    their numpy arrays and DLPack exports hold it too; the C backend (its pool and the memory it
    took from the engine's allocator) is destroyed when the last of them lets go."""

    __slots__ = ("__weakref__",)


def _destroy(lib, handle, keep):
    lib.kda_backend_destroy(handle)
    keep.clear()  # the allocator callbacks and external tensors, after the last free




class PoolView:
    """A pool tensor as a DLPack producer (``__dlpack__``, ``__dlpack_device__``): the backend's
    pool memory (or the engine's, for an external pool), kept alive by the view and by every
    tensor made from it (``torch.from_dlpack(view)``, ``numpy()``), also across Backend.close():
    the backend is destroyed only when the last of them is gone, so no view ever points at freed
    memory. ``dtype`` is "bfloat16", "float32" or "int32"; shape and strides are in elements."""

    def __init__(self, owner, name, layer, tensor):
        self._backend = owner
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
                 memory_budget_bytes=0, allocator=None, allocation_stream=None,
                 external_pool=None, library=None):
        """allocator: None (cudaMalloc / host memory), "torch" (kda.TorchAllocator()) or a
        kda.Allocator: every byte the backend owns comes from it, on allocation_stream (None:
        torch's current stream of a CUDA device when torch is imported, else 0).
        external_pool: {name: tensor} of engine-owned pool tensors (POOL_TENSORS names, with a
        leading [layers] dim; memory_pool/pool_storage.h) used in place of the backend's own."""
        self._h = None
        self._owner = None
        self._weights = {}
        model = Model._from(model)
        c_model = model._c()
        flag_list = _args.sequence(flags, "create", "flags")
        encoded = [_args.string(f, "create", f"flags[{i}]") for i, f in enumerate(flag_list)]
        c_device = _args.string(device, "create", "device")
        budget = _args.integer(memory_budget_bytes, "create", "memory_budget_bytes", 0,
                               _args.INT64_MAX)
        extra = _args.integer(extra_slots, "create", "extra_slots", 0)
        if isinstance(allocator, str):
            if allocator != "torch":
                raise Error(INVALID_ARGUMENT, f"create: allocator: {allocator!r} unknown, "
                            "expected 'torch', a kda.Allocator or None")
            allocator = TorchAllocator()
        if allocator is not None and not isinstance(allocator, Allocator):
            raise TypeError(f"create: allocator: expected a kda.Allocator, 'torch' or None, got "
                            f"{type(allocator).__name__}")
        device_type = _dlpack.kDLCUDA if device.startswith("cuda") else _dlpack.kDLCPU
        device_id = int(device[5:]) if device.startswith("cuda:") and device[5:].isdigit() else 0
        if allocation_stream is None:
            stream = _torch_stream(device_type, device_id)
        else:
            stream = _args.stream(allocation_stream, "create")
        self._lib = _lib.load(_args.path(library, "create", "library"))
        keep = []  # alive until the C backend is destroyed (its last free)
        options = _lib.BackendOptions(budget, extra, None, stream or None, None)
        errors = []
        if allocator is not None:
            c_alloc, fns = _c_allocator(allocator, errors)
            keep.extend((c_alloc, fns, allocator))
            options.allocator = ctypes.pointer(c_alloc)
        if external_pool is not None:
            struct, kept = _state_struct(external_pool, "create", "external_pool", stream)
            keep.extend((struct, kept))
            options.external_pool = ctypes.pointer(struct)
        argv = (ctypes.c_char_p * max(len(encoded), 1))(*encoded)
        handle = ctypes.c_void_p()
        status = self._lib.kda_backend_create(ctypes.byref(c_model), argv, len(encoded),
                                              c_device, ctypes.byref(options),
                                              ctypes.byref(handle))
        if status != OK:
            message = self._lib.kda_last_error().decode(errors="replace")
            if errors:
                message += f" (the allocator raised {type(errors[0]).__name__}: {errors[0]})"
            raise Error(status, message)
        if errors:  # a free failed while create cleaned up after itself: not reached on success
            raise Error(INTERNAL, f"create: the allocator raised {errors[0]!r}")
        self._h = handle
        self._owner = _Owner()
        self._allocator_errors = errors
        # Destroys the C backend when the owner goes: at close(), or later if views hold it.
        self._finalizer = weakref.finalize(self._owner, _destroy, self._lib, handle, keep)
        self.model = model
        self.flags = tuple(flag_list)
        self.device = device
        self.allocator = allocator
        # The configuration's ranges (fixed at creation), for the arguments' own range checks.
        info = self.info()
        self._num_layers = info["num_layers"]
        self._num_slots = info["num_slots"]
        self._num_rows = info["num_rows"]
        self._max_tokens = info["max_draft_tokens"]
        self._device_type = _dlpack.kDLCUDA if info["device"] != "host" else _dlpack.kDLCPU
        self._device_id = int(info["device"][5:]) if info["device"] != "host" else 0

    # ---- plumbing ----
    def _check(self, status):
        if status != OK:
            raise Error(status, self._lib.kda_last_error().decode(errors="replace"))

    def _handle(self, call):
        if self._h is None:
            raise Error(LIFECYCLE, f"{call}: the backend is closed")
        return self._h

    def _borrow(self, obj, call, name, stream=0):
        """obj as a Borrowed DLTensor for one call (None: None); see _borrow_tensor."""
        return _borrow_tensor(obj, call, name, stream)

    def _stream(self, stream, call):
        """The call's stream: None = torch's current stream of the backend's CUDA device (torch
        imported), else 0; otherwise as _args.stream."""
        if stream is None:
            return _torch_stream(self._device_type, self._device_id)
        return _args.stream(stream, call)

    def _layer(self, layer, call, lo=0):
        return _args.integer(layer, call, "layer", lo, self._num_layers, hi_open=True)

    def _slot(self, slot, call, name):
        return _args.integer(slot, call, name, 0, self._num_slots, hi_open=True)

    def close(self):
        """Ends the Backend (every later call raises kda.Error(LIFECYCLE)); idempotent. Its
        memory (pool, index buffers; the allocator's blocks) is freed now, or, while pool views
        or tensors made from them are alive, when the last of them is gone (``released`` says
        which): a view never outlives the memory it points at. Work enqueued on a stream must
        have run before the memory is freed."""
        if self._h is not None:
            self._h = None
            self._weights.clear()
            self._owner = None  # the finalizer runs now unless a view holds the owner
            if self._allocator_errors:
                error, self._allocator_errors[:] = self._allocator_errors[0], []
                raise Error(INTERNAL, f"close: the allocator's free raised {error!r}")

    @property
    def closed(self):
        """close() was called."""
        return self._h is None

    @property
    def released(self):
        """The C backend is destroyed and its memory freed (after close() and the last view)."""
        return self._h is None and not self._finalizer.alive

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __del__(self):
        try:
            self.close()
        except Exception:  # interpreter shutdown, or an allocator that raised
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
    def allocate_slot(self, stream=None):
        st = self._stream(stream, "allocate_slot")
        slot = ctypes.c_int32(-1)
        self._check(self._lib.kda_allocate_slot(self._handle("allocate_slot"), st,
                                                ctypes.byref(slot)))
        return slot.value

    def release_slot(self, slot):
        slot = self._slot(slot, "release_slot", "slot")
        self._check(self._lib.kda_release_slot(self._handle("release_slot"), slot))

    def claim_slot(self, slot, keep_state=False, stream=None):
        """The engine's own slot number `slot` becomes allocated (its MambaPool index): zeroed
        like allocate_slot, or with keep_state=True the conv / SSM state the engine wrote into
        its external pool kept (only the ring cursor and pending counts are zeroed)."""
        slot = self._slot(slot, "claim_slot", "slot")
        keep = _args.flag(keep_state, "claim_slot", "keep_state")
        st = self._stream(stream, "claim_slot")
        self._check(self._lib.kda_claim_slot(self._handle("claim_slot"), slot, keep, st))

    def memory_report(self):
        """Bytes of the backend's memory per part: total_bytes (= pool_bytes + workspace_bytes),
        pool_bytes, conv_state_bytes, ssm_state_bytes, ring_bytes, conv_window_bytes,
        snapshot_bytes, qkv_act_bytes, workspace_bytes (index buffers, flags), allocated_bytes
        (what the backend allocated: from the allocator when one is given), external_bytes (in
        the engine's external_pool tensors), bytes_per_slot, bytes_per_row,
        snapshot_mode_total_bytes, ring_mode_total_bytes, from_allocator (bool)."""
        out = _lib.MemoryReport()
        self._check(self._lib.kda_memory_report_get(self._handle("memory_report"),
                                                    ctypes.byref(out)))
        report = {name: int(getattr(out, name)) for name in _lib.MEMORY_REPORT_FIELDS}
        report["from_allocator"] = bool(out.from_allocator)
        return report

    def copy_slot(self, src, dst, stream=None):
        src = self._slot(src, "copy_slot", "src")
        dst = self._slot(dst, "copy_slot", "dst")
        st = self._stream(stream, "copy_slot")
        self._check(self._lib.kda_copy_slot(self._handle("copy_slot"), src, dst, st))

    # ---- lifecycle ----
    def prepare(self, T, slots, rows=None, stream=None, *, lengths=None, offsets=None,
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
        st = self._stream(stream, call)
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

    def prepare_extend(self, T, slots, track_slots=None, track_steps=None, stream=None):
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
        st = self._stream(stream, call)
        self._check(self._lib.kda_prepare_extend(self._handle(call), T, s, n, ts, tp, st))

    def _run(self, fn, name, layer, mixed_qkv, a, b, out, stream, *extra):
        layer = self._layer(layer, name)
        call = f"{name}(layer {layer})"
        st = self._stream(stream, call)
        h = self._handle(call)
        ts = [self._borrow(t, call, n, st) for t, n in
              ((mixed_qkv, "mixed_qkv"), (a, "a"), (b, "b"), (out, "out"))]
        self._check(fn(h, layer, *[t.ptr if t is not None else None for t in ts], st, *extra))

    def verify(self, layer, mixed_qkv, a, b, out, stream=None):
        """Verifies `layer` of the prepared round; returns the DispatchInfo."""
        info = _lib.DispatchInfo()
        self._run(self._lib.kda_verify, "verify", layer, mixed_qkv, a, b, out, stream,
                  ctypes.byref(info))
        return DispatchInfo._of(info)

    def extend(self, layer, mixed_qkv, a, b, out, stream=None):
        """Runs `layer` of the prepared extend round (the state after its tokens is committed)."""
        self._run(self._lib.kda_extend, "extend", layer, mixed_qkv, a, b, out, stream)

    def commit(self, accepted_lengths, stream=None, track_slots=None, track_steps=None):
        """Commits every layer: accepted_lengths [B] int32 on the backend's device; with
        track_slots/track_steps ([B] int32 on the device) also the prefix-cache tracks."""
        st = self._stream(stream, "commit")
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

    def commit_tree(self, accepted_lengths, accepted_paths, stream=None, track_slots=None,
                    track_steps=None):
        """Commits a tree round: accepted_lengths [B] and accepted_paths [B, T] int32 on the
        backend's device (request i's path: node indices root first, accepted_lengths[i] of
        them); with track_slots/track_steps ([B] int32) also the prefix-cache tracks (track step
        k = the path's node k)."""
        st = self._stream(stream, "commit_tree")
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

    def materialize(self, slots, stream=None):
        """Deferred commit: folds the pending steps of `slots` (allocated, distinct)."""
        s, n = _args.int_array(slots, "materialize", "slots", 0, self._num_slots, hi_open=True)
        st = self._stream(stream, "materialize")
        self._check(self._lib.kda_materialize(self._handle("materialize"), s, n, st))

    def abort_round(self, stream=None):
        st = self._stream(stream, "abort_round")
        self._check(self._lib.kda_abort_round(self._handle("abort_round"), st))

    def record_graph_verify_round(self):
        self._check(self._lib.kda_record_graph_verify_round(
            self._handle("record_graph_verify_round")))

    def check_device_errors(self, stream=None):
        st = self._stream(stream, "check_device_errors")
        self._check(self._lib.kda_check_device_errors(self._handle("check_device_errors"), st))

    # ---- pool ----
    def pool_view(self, name, layer=-1):
        """Pool tensor `name` (POOL_TENSORS) of `layer` (-1: all layers) as a PoolView."""
        c_name = _args.string(name, "pool_view", "name")
        layer = self._layer(layer, "pool_view", lo=-1)
        t = _dlpack.DLTensor()
        self._check(self._lib.kda_pool_view(self._handle("pool_view"), c_name, layer,
                                            ctypes.byref(t)))
        return PoolView(self._owner, name, layer, t)

    def pool_array(self, name, layer=-1):
        """Host backends: the pool tensor as a writable numpy array over the pool's memory
        (bfloat16 as uint16); it keeps the backend's memory alive (also across close())."""
        return self.pool_view(name, layer).numpy()


from . import ops  # noqa: E402,F401 - kda.ops (needs the names above)
