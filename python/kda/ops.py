"""kda.ops: verify, commit and materialize on tensors the caller owns (backend/ops.h over the C
ABI's kda_op_*), FlashInfer-style: no Backend object, no memory of their own. An engine that
keeps its recurrent-state pool (SGLang's MambaPool: [layers, size + 1, ...] tensors in contract
§2's layouts) calls them on its own buffers with its own slot numbers:

    pool = {"conv_state": conv, "ssm_state": ssm, "conv_window": window, "ring_rawv": rawv,
            "ring_rawk": rawk, "ring_g": g, "ring_beta": beta, "qkv_act": act}   # [layers, ...]
    for l in range(layers):
        kda.ops.verify(mixed_qkv[l], a[l], b[l], out[l], A_log=..., dt_bias=..., conv_weight=...,
                       state=kda.ops.layer(pool, l), slots=slots, rows=rows, T=T)
    kda.ops.commit(state=pool, slots=slots, rows=rows, T=T, accepted_lengths=accepted)

``state`` is a dict {name: tensor} (names: kda.POOL_TENSORS): one layer's for verify (no [layers]
dim), all layers' for commit and materialize. The record mode is what it holds (the four rings,
or snapshots); the deferred commit is on when ring_pending is given (with ring_cursor, ring_u).
Index tensors (slots, rows, query_start_loc, parents, accepted lengths and paths) are int32 on
the state's device. Shapes come from the tensors; every argument is checked before anything runs
(TypeError / kda.Error naming it, nothing changed). Tensors and streams as for kda.Backend:
``stream=None`` is torch's current stream of the state's CUDA device (torch imported), else 0.
The kernel set is the device's (one per device in the library).
"""

import ctypes
from dataclasses import dataclass

from . import _args
from . import _dlpack
from . import _lib
from ._errors import INVALID_ARGUMENT, OK, Error

__all__ = ["verify", "commit", "materialize", "layer", "CommitInfo"]


@dataclass
class CommitInfo:
    """What a commit ran: deferred (recorded the accepted counts, contract §7) or the state
    committed; reason: "ring_fold", "snapshot_copy" or "deferred_record"."""
    deferred: bool
    reason: str


_UNSTACKED = ("ring_cursor", "qkv_act")  # no [layers] dim


def layer(state, index):
    """One layer of a stacked state dict ([layers, ...] tensors): every tensor indexed [index]
    but ring_cursor and qkv_act, which have no layer dim. kda.bf16 wrappers are kept."""
    from . import bf16
    if not isinstance(state, dict):
        raise TypeError(f"ops.layer: state: expected a dict of tensors, got "
                        f"{type(state).__name__}")
    index = _args.integer(index, "ops.layer", "index", 0)
    out = {}
    for name, t in state.items():
        if t is None or name in _UNSTACKED:
            out[name] = t
        elif isinstance(t, bf16):
            out[name] = bf16(t.tensor[index])
        else:
            out[name] = t[index]
    return out


def _lib_of(library):
    return _lib.load(_args.path(library, "ops", "library"))


def _check(lib, status):
    if status != OK:
        raise Error(status, lib.kda_last_error().decode(errors="replace"))


def _device_of(t):
    """(DLPack device type, id) of a tensor (unwrapping kda.bf16 / kda.via_dlpack)."""
    from . import bf16, via_dlpack
    while isinstance(t, (bf16, via_dlpack)):
        t = t.tensor
    if _dlpack.is_torch_tensor(t):
        return _dlpack.torch_device(t)
    if hasattr(t, "__dlpack_device__"):
        device_type, device_id = t.__dlpack_device__()
        return int(device_type), int(device_id)
    return _dlpack.kDLCPU, 0


def _stream(stream, state, call):
    from . import _torch_stream
    if stream is not None:
        return _args.stream(stream, call)
    if not isinstance(state, dict) or state.get("ssm_state") is None:
        return 0
    return _torch_stream(*_device_of(state["ssm_state"]))


class _Args:
    """Borrowed tensors of one call (kept alive until the call returns)."""

    def __init__(self, call, stream):
        from . import _borrow_tensor
        self._borrow_tensor = _borrow_tensor
        self.call = call
        self.stream = stream
        self.kept = []

    def tensor(self, obj, name):
        b = self._borrow_tensor(obj, self.call, name, self.stream)
        if b is None:
            return None
        self.kept.append(b)
        return ctypes.pointer(b.tensor)

    def state(self, state):
        from . import _state_struct
        struct, kept = _state_struct(state, self.call, "state", self.stream)
        self.kept.append(kept)
        return struct

    def batch(self, T, slots, rows, query_start_loc, parents):
        return _lib.BatchTensors(_args.integer(T, self.call, "T", 1),
                                 self.tensor(slots, "batch.slots"),
                                 self.tensor(rows, "batch.rows"),
                                 self.tensor(query_start_loc, "batch.query_start_loc"),
                                 self.tensor(parents, "batch.parents"))


def verify(mixed_qkv, a, b, out, *, A_log, dt_bias, conv_weight, conv_bias=None, state, slots,
           rows, T, query_start_loc=None, parents=None, gate="standard", lower_bound=0.0,
           fused=True, fused_ring_max_batch=1, block_v=0, numerics="auto", lazy=False,
           stream=None, library=None):
    """Verifies one layer (contract §1) on the caller's tensors: mixed_qkv [N, D], a [N, HV*K],
    b [N, HV] bf16 (inner dim contiguous), out [N, HV, V] bf16; the weights; state: one layer's
    dict (conv_state, ssm_state, conv_window, the snapshots or the four rings; deferred:
    ring_cursor, ring_pending, ring_u; qkv_act when the unfused path runs); slots, rows [B] int32
    on the device; T tokens per request; query_start_loc [B + 1] (a ragged chain) or parents
    [B, T] (a tree). gate "standard" / "safe" (with lower_bound); fused, fused_ring_max_batch,
    block_v and numerics ("auto", "exact" or "fast") are --kda-fused-verify,
    --kda-fused-ring-max-batch, --kda-verify-block-v and --kda-verify-numerics. lazy: the
    state is the lazy write-back's (contract §11: ring_cursor and ring_pending, no ring_u); the
    verify folds nothing and its fast outputs take the pending steps as history. Returns the
    dispatcher's kda.DispatchInfo."""
    from . import DispatchInfo
    call = "ops.verify"
    lib = _lib_of(library)
    st = _stream(stream, state, call)
    gates = {"standard": 0, "safe": 1}
    g = _args.string(gate, call, "gate").decode()
    if g not in gates:
        raise Error(INVALID_ARGUMENT, f"{call}: gate '{g}' unsupported, expected 'standard' or "
                    "'safe'")
    args = _Args(call, st)
    op = _lib.VerifyOp()
    for name, t in (("mixed_qkv", mixed_qkv), ("a", a), ("b", b), ("out", out), ("A_log", A_log),
                    ("dt_bias", dt_bias), ("conv_weight", conv_weight), ("conv_bias", conv_bias)):
        setattr(op, name, args.tensor(t, name))
    op.state = args.state(state)
    op.batch = args.batch(T, slots, rows, query_start_loc, parents)
    op.gate = gates[g]
    op.lower_bound = _args.real(lower_bound, call, "lower_bound")
    op.fused_verify = _args.flag(fused, call, "fused")
    op.fused_ring_max_batch = _args.integer(fused_ring_max_batch, call, "fused_ring_max_batch", 0)
    op.block_v = _args.integer(block_v, call, "block_v", 0)
    numerics_values = {"auto": 0, "exact": 1, "fast": 2}  # KDA_NUMERICS_*
    n = _args.string(numerics, call, "numerics").decode()
    if n not in numerics_values:
        raise Error(INVALID_ARGUMENT, f"{call}: numerics '{n}' unsupported, expected 'auto', "
                    "'exact' or 'fast'")
    op.numerics = numerics_values[n]
    op.lazy = _args.flag(lazy, call, "lazy")
    info = _lib.DispatchInfo()
    _check(lib, lib.kda_op_verify(ctypes.byref(op), st, ctypes.byref(info)))
    return DispatchInfo._of(info)


def commit(*, state, slots, rows, T, accepted_lengths, query_start_loc=None, parents=None,
           accepted_paths=None, track_slots=None, track_steps=None, checked_accepted=None,
           error_flag=None, lazy=False, lazy_fold_interval=0, stream=None, library=None):
    """Commits every layer of `state` (all layers' dict) after a verify round of the batch
    (slots, rows, T, query_start_loc / parents as verified): accepted_lengths [B] int32 (tree:
    with accepted_paths [B, T]); optional prefix-cache tracks (track_slots, track_steps [B]);
    checked_accepted [B] int32 scratch for a ragged or tree round; error_flag [1] int32 gets the
    CommitError bits of bad lengths / paths / tracks. With ring_pending in `state` it records the
    deferred counts instead of folding; lazy (the state as verify's lazy): the accepted steps join
    the pending ones, folded where the next draft would not fit the ring (or at
    lazy_fold_interval pending steps). Returns a CommitInfo."""
    call = "ops.commit"
    lib = _lib_of(library)
    st = _stream(stream, state, call)
    args = _Args(call, st)
    op = _lib.CommitOp()
    op.state = args.state(state)
    op.batch = args.batch(T, slots, rows, query_start_loc, parents)
    for name, t in (("accepted_lengths", accepted_lengths), ("accepted_paths", accepted_paths),
                    ("track_slots", track_slots), ("track_steps", track_steps),
                    ("checked_accepted", checked_accepted), ("error_flag", error_flag)):
        setattr(op, name, args.tensor(t, name))
    op.lazy = _args.flag(lazy, call, "lazy")
    op.lazy_fold_interval = _args.integer(lazy_fold_interval, call, "lazy_fold_interval", 0)
    info = _lib.CommitInfo()
    _check(lib, lib.kda_op_commit(ctypes.byref(op), st, ctypes.byref(info)))
    return CommitInfo(bool(info.deferred), info.reason.decode() if info.reason else "")


def materialize(*, state, slots, stream=None, library=None):
    """Deferred commit: folds the pending steps of slots ([n] int32 on the device, distinct)
    into every layer's state (all layers' dict with ring_cursor, ring_pending, and ring_u
    unless the state is the lazy write-back's)."""
    call = "ops.materialize"
    lib = _lib_of(library)
    st = _stream(stream, state, call)
    args = _Args(call, st)
    struct = args.state(state)
    s = args.tensor(slots, "slots")
    _check(lib, lib.kda_op_materialize(ctypes.byref(struct), s, st))
