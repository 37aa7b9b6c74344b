"""Finding and loading the C ABI library (capi/kda_c.h) and declaring its functions."""

import ctypes
import ctypes.util
import os
import sys

from ._dlpack import DLTensor

ABI_VERSION = 5  # KDA_C_ABI_VERSION of the header this package was written against

# Library file names, most specific first: the C ABI library of the Bazel tree, then the
# installed libkda.so (its soname libkda.so.0; it exports the same kda_* symbols).
_NAMES = ("libkda_c.so", "libkda.so", "libkda.so.0")


class ModelConfig(ctypes.Structure):
    _fields_ = [
        ("num_layers", ctypes.c_int32),
        ("H", ctypes.c_int32),
        ("HV", ctypes.c_int32),
        ("K", ctypes.c_int32),
        ("V", ctypes.c_int32),
        ("gate", ctypes.c_int32),
        ("lower_bound", ctypes.c_float),
        ("conv_weight_dtype", ctypes.c_int32),
        ("has_conv_bias", ctypes.c_int32),
    ]


AllocFn = ctypes.CFUNCTYPE(ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64, ctypes.c_int32,
                           ctypes.c_int32, ctypes.c_void_p)
FreeFn = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64, ctypes.c_int32,
                          ctypes.c_int32, ctypes.c_void_p)
ReleaseFn = ctypes.CFUNCTYPE(None, ctypes.c_void_p)


class Allocator(ctypes.Structure):
    _fields_ = [("ctx", ctypes.c_void_p), ("alloc", AllocFn), ("free", FreeFn),
                ("release", ReleaseFn)]


_dl = ctypes.POINTER(DLTensor)

STATE_TENSORS = ("conv_state", "ssm_state", "conv_window", "snapshots", "ring_rawv", "ring_rawk",
                 "ring_g", "ring_beta", "ring_cursor", "ring_pending", "ring_u", "qkv_act")


class StateTensors(ctypes.Structure):
    _fields_ = [(name, _dl) for name in STATE_TENSORS]


class BackendOptions(ctypes.Structure):
    _fields_ = [("memory_budget_bytes", ctypes.c_int64), ("extra_slots", ctypes.c_int32),
                ("allocator", ctypes.POINTER(Allocator)), ("allocation_stream", ctypes.c_void_p),
                ("external_pool", ctypes.POINTER(StateTensors))]


MEMORY_REPORT_FIELDS = (
    "total_bytes", "pool_bytes", "conv_state_bytes", "ssm_state_bytes", "ring_bytes",
    "conv_window_bytes", "snapshot_bytes", "qkv_act_bytes", "workspace_bytes", "allocated_bytes",
    "external_bytes", "bytes_per_slot", "bytes_per_row", "snapshot_mode_total_bytes",
    "ring_mode_total_bytes")


class MemoryReport(ctypes.Structure):
    _fields_ = [(name, ctypes.c_int64) for name in MEMORY_REPORT_FIELDS] + [
        ("from_allocator", ctypes.c_int32)]


class BatchTensors(ctypes.Structure):
    _fields_ = [("T", ctypes.c_int32), ("slots", _dl), ("rows", _dl), ("query_start_loc", _dl),
                ("parents", _dl)]


class VerifyOp(ctypes.Structure):
    _fields_ = [(name, _dl) for name in ("mixed_qkv", "a", "b", "out", "A_log", "dt_bias",
                                         "conv_weight", "conv_bias")] + [
        ("state", StateTensors), ("batch", BatchTensors), ("gate", ctypes.c_int32),
        ("lower_bound", ctypes.c_float), ("fused_verify", ctypes.c_int32),
        ("fused_ring_max_batch", ctypes.c_int32), ("block_v", ctypes.c_int32),
        ("numerics", ctypes.c_int32), ("lazy", ctypes.c_int32)]


class CommitOp(ctypes.Structure):
    _fields_ = [("state", StateTensors), ("batch", BatchTensors)] + [
        (name, _dl) for name in ("accepted_lengths", "accepted_paths", "track_slots",
                                 "track_steps", "checked_accepted", "error_flag")] + [
        ("lazy", ctypes.c_int32), ("lazy_fold_interval", ctypes.c_int32)]


class CommitInfo(ctypes.Structure):
    _fields_ = [("deferred", ctypes.c_int32), ("reason", ctypes.c_char_p)]


class DispatchInfo(ctypes.Structure):
    _fields_ = [("fused", ctypes.c_int32), ("block_v", ctypes.c_int32),
                ("reason", ctypes.c_char_p), ("fast_outputs", ctypes.c_int32),
                ("numerics_reason", ctypes.c_char_p)]


class BackendInfo(ctypes.Structure):
    _fields_ = [(name, ctypes.c_int32) for name in (
        "num_layers", "num_slots", "num_rows", "max_draft_tokens", "ring_len", "record_mode",
        "deferred_commit", "device_type", "device_id", "free_slots", "batch_size",
        "tokens_per_request", "draft_shape")] + [("batch_tokens", ctypes.c_int64)]


_p = ctypes.c_void_p
_i32 = ctypes.c_int32
_i32p = ctypes.POINTER(ctypes.c_int32)

_SIGNATURES = {
    "kda_abi_version": (ctypes.c_int, []),
    "kda_last_error": (ctypes.c_char_p, []),
    "kda_last_error_code": (ctypes.c_int, []),
    "kda_status_name": (ctypes.c_char_p, [ctypes.c_int]),
    "kda_backend_create": (ctypes.c_int, [
        ctypes.POINTER(ModelConfig), ctypes.POINTER(ctypes.c_char_p), ctypes.c_int,
        ctypes.c_char_p, ctypes.POINTER(BackendOptions), ctypes.POINTER(_p)]),
    "kda_backend_destroy": (None, [_p]),
    "kda_set_layer_weights": (ctypes.c_int, [_p, ctypes.c_int, _dl, _dl, _dl, _dl]),
    "kda_allocate_slot": (ctypes.c_int, [_p, _p, _i32p]),
    "kda_release_slot": (ctypes.c_int, [_p, _i32]),
    "kda_copy_slot": (ctypes.c_int, [_p, _i32, _i32, _p]),
    "kda_prepare": (ctypes.c_int, [_p, _i32, _i32p, _i32, _i32p, _p]),
    "kda_prepare_shaped": (ctypes.c_int, [_p, _i32, _i32p, _i32, _i32p, _i32p, _i32p, _i32p,
                                          _p]),
    "kda_prepare_extend": (ctypes.c_int, [_p, _i32, _i32p, _i32, _i32p, _i32p, _p]),
    "kda_verify": (ctypes.c_int, [_p, ctypes.c_int, _dl, _dl, _dl, _dl, _p,
                                  ctypes.POINTER(DispatchInfo)]),
    "kda_extend": (ctypes.c_int, [_p, ctypes.c_int, _dl, _dl, _dl, _dl, _p]),
    "kda_commit": (ctypes.c_int, [_p, _dl, _p]),
    "kda_commit_tracked": (ctypes.c_int, [_p, _dl, _dl, _dl, _p]),
    "kda_commit_tree": (ctypes.c_int, [_p, _dl, _dl, _p]),
    "kda_commit_tree_tracked": (ctypes.c_int, [_p, _dl, _dl, _dl, _dl, _p]),
    "kda_materialize": (ctypes.c_int, [_p, _i32p, _i32, _p]),
    "kda_abort_round": (ctypes.c_int, [_p, _p]),
    "kda_record_graph_verify_round": (ctypes.c_int, [_p]),
    "kda_check_device_errors": (ctypes.c_int, [_p, _p]),
    "kda_backend_info_get": (ctypes.c_int, [_p, ctypes.POINTER(BackendInfo)]),
    "kda_round_state": (ctypes.c_int, [_p, ctypes.POINTER(ctypes.c_char_p)]),
    "kda_pool_view": (ctypes.c_int, [_p, ctypes.c_char_p, ctypes.c_int, _dl]),
    "kda_claim_slot": (ctypes.c_int, [_p, _i32, _i32, _p]),
    "kda_memory_report_get": (ctypes.c_int, [_p, ctypes.POINTER(MemoryReport)]),
    "kda_op_verify": (ctypes.c_int, [ctypes.POINTER(VerifyOp), _p, ctypes.POINTER(DispatchInfo)]),
    "kda_op_commit": (ctypes.c_int, [ctypes.POINTER(CommitOp), _p, ctypes.POINTER(CommitInfo)]),
    "kda_op_materialize": (ctypes.c_int, [ctypes.POINTER(StateTensors), _dl, _p]),
}


def candidates(path=None):
    """Where load() looks, in order: ``path``; $KDA_LIBRARY; beside the package (kda/ and its
    parent); <sys.prefix>/lib; the dynamic loader's search (ctypes.util.find_library)."""
    if path:
        return [path]
    out = []
    env = os.environ.get("KDA_LIBRARY")
    if env:
        out.append(env)
    here = os.path.dirname(os.path.abspath(__file__))
    for directory in (here, os.path.dirname(here), os.path.join(sys.prefix, "lib")):
        out.extend(os.path.join(directory, name) for name in _NAMES)
    for name in ("kda_c", "kda"):
        found = ctypes.util.find_library(name)
        if found:
            out.append(found)
    return out


_loaded = {}


def load(path=None):
    """The library as a ctypes.CDLL with every kda_* function declared (cached per path).
    An explicit ``path`` or $KDA_LIBRARY that does not load is an error (no fallback)."""
    tried = []
    explicit = bool(path) or bool(os.environ.get("KDA_LIBRARY"))
    for candidate in candidates(path):
        if candidate in _loaded:
            return _loaded[candidate]
        if os.path.sep in candidate and not os.path.exists(candidate):
            tried.append(f"{candidate} (no such file)")
            if explicit:
                break
            continue
        try:
            lib = ctypes.CDLL(candidate)
        except OSError as e:
            tried.append(f"{candidate} ({e})")
            if explicit:
                break
            continue
        if not hasattr(lib, "kda_abi_version"):
            tried.append(f"{candidate} (no kda_abi_version: not the KDA C ABI)")
            continue
        for name, (restype, argtypes) in _SIGNATURES.items():
            fn = getattr(lib, name)
            fn.restype = restype
            fn.argtypes = argtypes
        version = lib.kda_abi_version()
        if version != ABI_VERSION:
            raise OSError(f"kda: {candidate} has C ABI version {version}, this package needs "
                          f"{ABI_VERSION}")
        _loaded[candidate] = lib
        return lib
    raise OSError("kda: cannot load the KDA C library; set KDA_LIBRARY or pass library=PATH. "
                  "Tried: " + "; ".join(tried or ["nothing"]))
