"""DLPack (v0.6) structs and the capsule protocol over ctypes.

Import: ``as_dltensor`` turns a tensor into a ``DLTensor`` for one C call. A torch.Tensor (torch
already imported by the caller) is described straight from its metadata (data_ptr, shape, stride,
dtype, device): no ``__dlpack__``, no capsule, no event or stream synchronisation; the caller
orders the tensor on the call's stream (the package's default stream is torch's current one, on
which torch orders its own work). Any other object with ``__dlpack__`` (and a torch tensor wrapped
in ``kda.via_dlpack``) goes through its capsule, with the call's stream for CUDA producers.
The capsule is not consumed (its name stays "dltensor"): whoever holds the returned ``Borrowed``
keeps the capsule, and through it the producer's memory, alive; when it is dropped the capsule's
own destructor (the producer's) calls the managed tensor's deleter, as DLPack specifies for an
unconsumed capsule.

Export: ``export_capsule`` wraps memory the kda module owns (pool views) in a new "dltensor"
capsule; the managed tensor keeps the owner (the Backend) alive until the consumer calls its
deleter, or until the capsule dies unconsumed.
"""

import ctypes
import sys

kDLCPU = 1
kDLCUDA = 2
kDLCUDAHost = 3

kDLInt = 0
kDLUInt = 1
kDLFloat = 2
kDLBfloat = 4


class DLDevice(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int), ("device_id", ctypes.c_int)]


class DLDataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class DLTensor(ctypes.Structure):
    _fields_ = [
        ("data", ctypes.c_void_p),
        ("device", DLDevice),
        ("ndim", ctypes.c_int),
        ("dtype", DLDataType),
        ("shape", ctypes.POINTER(ctypes.c_int64)),
        ("strides", ctypes.POINTER(ctypes.c_int64)),
        ("byte_offset", ctypes.c_uint64),
    ]


class DLManagedTensor(ctypes.Structure):
    pass


_Deleter = ctypes.CFUNCTYPE(None, ctypes.POINTER(DLManagedTensor))
DLManagedTensor._fields_ = [
    ("dl_tensor", DLTensor),
    ("manager_ctx", ctypes.c_void_p),
    ("deleter", _Deleter),
]

_CAPSULE_NAME = b"dltensor"
_USED_NAME = b"used_dltensor"


def _pyapi(name, restype, argtypes):
    f = ctypes.PYFUNCTYPE(restype, *argtypes)((name, ctypes.pythonapi))
    return f


_GetPointer = _pyapi("PyCapsule_GetPointer", ctypes.c_void_p, [ctypes.py_object, ctypes.c_char_p])
_IsValid = _pyapi("PyCapsule_IsValid", ctypes.c_int, [ctypes.py_object, ctypes.c_char_p])
_CapsuleDestructor = ctypes.CFUNCTYPE(None, ctypes.c_void_p)
_New = _pyapi("PyCapsule_New", ctypes.py_object,
              [ctypes.c_void_p, ctypes.c_char_p, _CapsuleDestructor])
# Raw-pointer variants for the capsule destructor (it receives a PyObject*, not an object).
_IsValidRaw = _pyapi("PyCapsule_IsValid", ctypes.c_int, [ctypes.c_void_p, ctypes.c_char_p])
_GetPointerRaw = _pyapi("PyCapsule_GetPointer", ctypes.c_void_p,
                        [ctypes.c_void_p, ctypes.c_char_p])

_DTYPE_NAMES = {kDLInt: "int", kDLUInt: "uint", kDLFloat: "float", kDLBfloat: "bfloat"}


def dtype_name(dt):
    """DLPack dtype as "bfloat16", "float32", ... (the C ABI's spelling)."""
    base = _DTYPE_NAMES.get(dt.code)
    if base is None:
        return f"code {dt.code} ({dt.bits} bits)"
    name = f"{base}{dt.bits}"
    return name if dt.lanes == 1 else f"{name}x{dt.lanes}"


class Borrowed:
    """A DLTensor copied out of a producer's capsule (or built from a torch tensor's metadata);
    keeps the capsule (or the shape / stride arrays) and the producer's memory alive while
    referenced. ``ptr`` is what the C call takes."""

    __slots__ = ("tensor", "capsule", "source")

    def __init__(self, tensor, capsule, source):
        self.tensor = tensor
        self.capsule = capsule
        self.source = source

    @property
    def ptr(self):
        return ctypes.byref(self.tensor)


# torch dtypes (by name, so torch is never imported here) as DLPack dtypes.
_TORCH_DTYPES = {
    "torch.bfloat16": (kDLBfloat, 16), "torch.float16": (kDLFloat, 16),
    "torch.float32": (kDLFloat, 32), "torch.float64": (kDLFloat, 64),
    "torch.int32": (kDLInt, 32), "torch.int64": (kDLInt, 64), "torch.int16": (kDLInt, 16),
    "torch.int8": (kDLInt, 8), "torch.uint8": (kDLUInt, 8), "torch.uint16": (kDLUInt, 16),
}


def is_torch_tensor(obj):
    """Whether obj is a torch.Tensor (False when torch was never imported)."""
    torch = sys.modules.get("torch")
    tensor_type = getattr(torch, "Tensor", None) if torch is not None else None
    return isinstance(tensor_type, type) and isinstance(obj, tensor_type)


def torch_device(obj):
    """A torch tensor's (DLPack device type, index)."""
    dev = obj.device
    if dev.type == "cuda":
        return kDLCUDA, 0 if dev.index is None else int(dev.index)
    if dev.type == "cpu":
        return kDLCPU, 0
    raise ValueError(f"a tensor on torch device {dev}, expected cpu or cuda")


def from_torch(obj, where, dtype_override=None):
    """A torch tensor's DLTensor from its metadata (no __dlpack__, no synchronisation)."""
    layout = str(getattr(obj, "layout", "torch.strided"))
    if layout != "torch.strided":
        raise ValueError(f"{where}: a {layout} tensor, expected a strided (dense) one")
    code_bits = _TORCH_DTYPES.get(str(obj.dtype))
    if code_bits is None:
        raise ValueError(f"{where}: torch dtype {obj.dtype} has no DLPack equivalent here")
    device_type, device_id = torch_device(obj)
    shape = tuple(int(x) for x in obj.shape)
    strides = tuple(int(x) for x in obj.stride())
    ndim = len(shape)
    shape_arr = (ctypes.c_int64 * max(ndim, 1))(*shape)
    strides_arr = (ctypes.c_int64 * max(ndim, 1))(*strides)
    tensor = DLTensor()
    tensor.data = int(obj.data_ptr()) or None
    tensor.device = DLDevice(device_type, device_id)
    tensor.ndim = ndim
    tensor.dtype = DLDataType(code_bits[0], code_bits[1], 1)
    tensor.shape = ctypes.cast(shape_arr, ctypes.POINTER(ctypes.c_int64))
    tensor.strides = ctypes.cast(strides_arr, ctypes.POINTER(ctypes.c_int64))
    tensor.byte_offset = 0
    if dtype_override is not None:
        _override(tensor, dtype_override, where)
    return Borrowed(tensor, (shape_arr, strides_arr), obj)


def _override(tensor, dtype_override, where):
    got = tensor.dtype
    if got.bits != 16 or got.lanes != 1 or got.code not in (kDLInt, kDLUInt):
        raise ValueError(f"{where}: bf16() reinterprets 16-bit integer tensors, got "
                         f"{dtype_name(got)}")
    tensor.dtype = dtype_override


def as_dltensor(obj, where, stream=None, dtype_override=None, force_dlpack=False):
    """``obj.__dlpack__()`` as a Borrowed DLTensor (a torch tensor: from_torch, unless
    ``force_dlpack``). ``where`` names the argument in errors (raised as TypeError/ValueError by
    the caller's wrapper). ``stream``: the consumer's CUDA stream handle for CUDA producers
    (DLPack: 1 = the legacy default stream, -1 = no synchronisation). A ``dtype_override`` (DLDataType) reinterprets a
    16-bit integer tensor, e.g. numpy uint16 as bfloat16 (numpy has no bfloat16)."""
    if not force_dlpack and is_torch_tensor(obj):
        return from_torch(obj, where, dtype_override)
    if not hasattr(obj, "__dlpack__"):
        raise TypeError(f"{where}: expected a tensor with __dlpack__ (numpy array, torch "
                        f"tensor), got {type(obj).__name__}")
    device_type = kDLCPU
    if hasattr(obj, "__dlpack_device__"):
        device_type = int(obj.__dlpack_device__()[0])
    if device_type == kDLCUDA:
        capsule = obj.__dlpack__(stream=1 if not stream else int(stream))
    else:
        capsule = obj.__dlpack__()
    if not _IsValid(capsule, _CAPSULE_NAME):
        raise ValueError(f"{where}: __dlpack__ did not return an unused 'dltensor' capsule")
    managed = ctypes.cast(_GetPointer(capsule, _CAPSULE_NAME), ctypes.POINTER(DLManagedTensor))
    tensor = DLTensor.from_buffer_copy(managed.contents.dl_tensor)
    if dtype_override is not None:
        _override(tensor, dtype_override, where)
    return Borrowed(tensor, capsule, obj)


# Exported managed tensors, by address: alive until their deleter runs.
_exported = {}


@_Deleter
def _delete_exported(managed_ptr):
    _exported.pop(ctypes.cast(managed_ptr, ctypes.c_void_p).value, None)


@_CapsuleDestructor
def _destroy_capsule(capsule_ptr):
    # Consumed capsules are renamed "used_dltensor": the consumer calls the deleter.
    if _IsValidRaw(capsule_ptr, _CAPSULE_NAME):
        managed = ctypes.cast(_GetPointerRaw(capsule_ptr, _CAPSULE_NAME),
                              ctypes.POINTER(DLManagedTensor))
        managed.contents.deleter(managed)


def export_capsule(tensor, owner):
    """A new "dltensor" capsule over ``tensor`` (a DLTensor whose shape/strides may point into
    memory of ``owner``); the managed tensor copies shape and strides and keeps ``owner``
    alive until deleted."""
    ndim = tensor.ndim
    shape = (ctypes.c_int64 * max(ndim, 1))(*[tensor.shape[d] for d in range(ndim)])
    strides = (ctypes.c_int64 * max(ndim, 1))(*[tensor.strides[d] for d in range(ndim)])
    managed = DLManagedTensor()
    managed.dl_tensor = DLTensor.from_buffer_copy(tensor)
    managed.dl_tensor.shape = ctypes.cast(shape, ctypes.POINTER(ctypes.c_int64))
    managed.dl_tensor.strides = ctypes.cast(strides, ctypes.POINTER(ctypes.c_int64))
    managed.manager_ctx = None
    managed.deleter = _delete_exported
    address = ctypes.addressof(managed)
    _exported[address] = (managed, shape, strides, owner)
    return _New(address, _CAPSULE_NAME, _destroy_capsule)
