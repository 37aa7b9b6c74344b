"""The checks the Python tests share: one kda_replay directory through kda.Backend (verify and
commit of its one layer) against kda_replay's outputs on the same directory, bitwise, and bad
inputs raising kda.Error naming the argument with nothing changed.

The tensor side is pluggable (``Tensors``): numpy arrays on the host kernel set
(test_replay_host.py), torch CUDA tensors on the CUDA kernel set (test_torch_cuda.py).
"""

import json
import os
import subprocess

import numpy as np

import kda


def make_example(replay, directory, options=()):
    subprocess.run([replay, "--make-example", directory, *options], check=True,
                   stdout=subprocess.DEVNULL)


def run_replay(replay, directory, out, mode, device):
    """kda_replay --in directory --out out --mode mode --device device; returns summary.json."""
    subprocess.run([replay, "--in", directory, "--out", out, "--mode", mode, "--device", device],
                   check=True, stdout=subprocess.DEVNULL)
    with open(os.path.join(out, "summary.json")) as f:
        return json.load(f)


def load(directory, name):
    return np.load(os.path.join(directory, name + ".npy"))


class NumpyTensors:
    """Host tensors: numpy arrays (bf16 as uint16 wrapped in kda.bf16)."""

    device = "host"
    stream = 0

    def bf16(self, array_u16):
        return kda.bf16(np.ascontiguousarray(array_u16))

    def plain(self, array):
        return np.ascontiguousarray(array)

    def empty_bf16(self, shape):
        return kda.bf16(np.zeros(shape, np.uint16))

    def to_numpy(self, t):
        return t.tensor if isinstance(t, kda.bf16) else np.asarray(t)

    def pool(self, backend, name, layer):
        return backend.pool_array(name, layer).copy()

    def write_pool(self, backend, name, layer, values):
        backend.pool_array(name, layer)[...] = values

    def sync(self):
        pass


def _same(name, got, want):
    got = np.ascontiguousarray(got)
    want = np.ascontiguousarray(want)
    assert got.shape == want.shape, f"{name}: shape {got.shape}, kda_replay {want.shape}"
    assert got.dtype.itemsize == want.dtype.itemsize, f"{name}: dtype {got.dtype} vs {want.dtype}"
    if got.tobytes() != want.tobytes():
        diff = np.flatnonzero(got.view(np.uint8) != want.view(np.uint8))
        raise AssertionError(f"{name}: not bitwise equal to kda_replay ({diff.size} bytes "
                             f"differ, first at byte {diff[0]})")


def expect_error(fn, code, *needles):
    """fn() must raise kda.Error with `code` and a message containing every needle."""
    try:
        fn()
    except kda.Error as e:
        assert e.code == code, f"code {e.code_name}, expected {kda._CODE_NAMES[code]}: {e}"
        for n in needles:
            assert n in str(e), f"message {str(e)!r} does not contain {n!r}"
        return str(e)
    raise AssertionError(f"no kda.Error (expected one containing {needles})")


def check_directory(replay, directory, work, mode, deferred, tensors, library=None,
                    replay_device="host", log=print):
    """Runs `directory` through kda_replay (mode, replay_device) and through kda.Backend on
    `tensors`' device; asserts every output and the committed state bitwise equal."""
    out = os.path.join(work, f"replay_{mode}_{replay_device.replace(':', '')}")
    summary = run_replay(replay, directory, out, mode, replay_device)
    with open(os.path.join(directory, "manifest.json")) as f:
        manifest = json.load(f)
    shapes = summary["shapes"]
    B, T, HV, V = shapes["B"], shapes["T"], shapes["HV"], shapes["V"]
    S, R, T_max, L = shapes["S"], shapes["R"], shapes["T_max"], shapes["L"]
    assert shapes["conv_state_layout"] == "SWD" and shapes["conv_window_layout"] == "SWD"
    ring = mode == "ring"

    model = kda.Model(num_layers=1, H=shapes["H"], HV=HV, K=shapes["K"], V=V,
                      gate=shapes["gate"],
                      lower_bound=shapes["lower_bound"] if shapes["lower_bound"] is not None
                      else 0.0,
                      conv_weight_dtype=shapes["conv_weight_dtype"],
                      has_conv_bias=shapes["conv_bias"])
    flags = ["--speculative-num-draft-tokens", str(T_max), "--max-running-requests", str(R),
             "--kda-deferred-commit", "on" if deferred else "off"]
    if ring:
        flags += ["--enable-linear-replayssm-spec", "--linear-replayssm-cache-len", str(L)]
    be = kda.Backend(model=model, flags=flags, device=tensors.device, extra_slots=S - R,
                     library=library)
    info = be.info()
    assert info["num_slots"] == S and info["num_rows"] == R, info
    assert info["record_mode"] == mode and be.deferred_commit == deferred, info

    bf16_weights = shapes["conv_weight_dtype"] == "bf16"
    wrap = tensors.bf16 if bf16_weights else tensors.plain
    weights = [tensors.plain(load(directory, "A_log")), tensors.plain(load(directory, "dt_bias")),
               wrap(load(directory, "conv_weight"))]
    weights.append(wrap(load(directory, "conv_bias")) if shapes["conv_bias"] else None)
    be.set_layer_weights(0, *weights)

    slots_all = [be.allocate_slot(tensors.stream) for _ in range(S)]
    assert sorted(slots_all) == list(range(S))
    tensors.write_pool(be, "conv_state", 0, load(directory, "conv_state"))
    tensors.write_pool(be, "ssm_state", 0, load(directory, "ssm_state"))

    slots = [int(s) for s in load(directory, "slots")]
    rows = [int(r) for r in load(directory, "rows")] if "rows" in manifest["tensors"] else None
    be.prepare(T, slots, rows, stream=tensors.stream)
    qkv = tensors.bf16(load(directory, "mixed_qkv"))
    a = tensors.bf16(load(directory, "a"))
    b = tensors.bf16(load(directory, "b"))
    out_t = tensors.empty_bf16((B * T, HV, V))
    decision = be.verify(0, qkv, a, b, out_t, stream=tensors.stream)
    tensors.sync()
    log(f"  verify: {'fused' if decision.fused else 'unfused'} ({decision.reason}); kda_replay: "
        f"{summary['path']} ({summary['dispatch']['reason']})")

    _same("output", tensors.to_numpy(out_t), load(out, "output"))
    _same("conv_window", tensors.pool(be, "conv_window", 0), load(out, "conv_window"))
    record_names = ["ring_rawv", "ring_rawk", "ring_g", "ring_beta"] if ring else ["snapshots"]
    for name in record_names:
        _same(name, tensors.pool(be, name, 0), load(out, name))

    accepted = tensors.plain(load(directory, "accepted").astype(np.int32))
    be.commit(accepted, stream=tensors.stream)
    if be.deferred_commit:
        be.materialize([s for s in slots if s >= 0], stream=tensors.stream)
    be.check_device_errors(tensors.stream)
    _same("ssm_state", tensors.pool(be, "ssm_state", 0), load(out, "ssm_state"))
    _same("conv_state", tensors.pool(be, "conv_state", 0), load(out, "conv_state"))

    check_bad_inputs(be, tensors, T, slots, rows, qkv, a, b, out_t, accepted, S)
    be.close()


def check_examples(replay, work, examples, make_tensors, library=None, replay_device="host"):
    """Every example directory (name -> kda_replay --make-example options) in snapshot mode and in
    ring mode with eager and deferred commit (check_directory); returns the number of checks."""
    checks = 0
    for name, options in examples.items():
        directory = os.path.join(work, name)
        make_example(replay, directory, options)
        for mode, deferred in (("snapshot", False), ("ring", False), ("ring", True)):
            print(f"{name}: {mode} mode{', deferred commit' if deferred else ''}")
            check_directory(replay, directory, directory, mode, deferred, make_tensors(),
                            library=library, replay_device=replay_device)
            checks += 1
    return checks


def _pool_bytes(be, tensors):
    out = {}
    for name in kda.POOL_TENSORS:
        try:
            out[name] = tensors.pool(be, name, -1).tobytes()
        except kda.Error:
            pass  # absent in this mode
    return out


def check_bad_inputs(be, tensors, T, slots, rows, qkv, a, b, out_t, accepted, S):
    """Bad inputs raise kda.Error naming the argument; the pool and the round are unchanged."""
    st = tensors.stream
    a_np = tensors.to_numpy(a)

    def rejected(fn, code, *needles):
        before, state = _pool_bytes(be, tensors), be.round_state
        msg = expect_error(fn, code, *needles)
        assert _pool_bytes(be, tensors) == before, f"pool changed by a failing call: {msg}"
        assert be.round_state == state, msg
        return msg

    rejected(lambda: be.verify(0, qkv, a, b, out_t, stream=st), kda.LIFECYCLE,
             "verify(layer 0): no batch prepared")
    rejected(lambda: be.commit(accepted, stream=st), kda.LIFECYCLE, "commit:")
    rejected(lambda: be.prepare(T, [S + 3] + slots[1:], rows, stream=st), kda.INVALID_ARGUMENT,
             f"prepare: slots[0] = {S + 3} out of range")
    rejected(lambda: be.prepare(T, slots, [0] * len(slots) if len(slots) > 1 else [-5],
                                stream=st), kda.INVALID_ARGUMENT, "prepare: rows")

    be.prepare(T, slots, rows, stream=st)
    as_f32 = tensors.plain(tensors.to_numpy(qkv).astype(np.float32))
    rejected(lambda: be.verify(0, as_f32, a, b, out_t, stream=st), kda.INVALID_ARGUMENT,
             "verify(layer 0): mixed_qkv: dtype float32 unsupported, expected bfloat16")
    rejected(lambda: be.verify(0, qkv, tensors.plain(a_np), b, out_t, stream=st),
             kda.INVALID_ARGUMENT, "verify(layer 0): a: dtype ", "unsupported, expected bfloat16")
    rejected(lambda: be.verify(0, qkv, tensors.bf16(a_np[1:]), b, out_t, stream=st),
             kda.INVALID_ARGUMENT, "verify(layer 0): a: expected shape")
    try:
        be.verify(0, qkv, a, [1, 2, 3], out_t, stream=st)
    except TypeError as e:  # a wrong Python type: TypeError, naming the argument
        assert "verify(layer 0): b: expected a tensor with __dlpack__" in str(e), str(e)
    else:
        raise AssertionError("a list passed as a tensor raised nothing")
    rejected(lambda: be.verify(0, qkv, a, b, None, stream=st), kda.INVALID_ARGUMENT,
             "verify(layer 0): out: NULL DLTensor")
    rejected(lambda: be.verify(3, qkv, a, b, out_t, stream=st), kda.INVALID_ARGUMENT,
             "verify: layer = 3 out of range [0, 1)")
    rejected(lambda: be.commit(accepted, stream=st), kda.LIFECYCLE, "commit: only 0 of 1 layers")
    be.verify(0, qkv, a, b, out_t, stream=st)
    as_i64 = tensors.plain(tensors.to_numpy(accepted).astype(np.int64))
    rejected(lambda: be.commit(as_i64, stream=st), kda.INVALID_ARGUMENT,
             "commit: accepted_lengths: dtype int64 unsupported, expected int32")
    rejected(lambda: be.commit(tensors.plain(tensors.to_numpy(accepted)[:1]), stream=st),
             kda.INVALID_ARGUMENT, "accepted_lengths")
    be.abort_round(st)
    rejected(lambda: be.release_slot(S + 7), kda.INVALID_ARGUMENT, str(S + 7))
    rejected(lambda: be.pool_view("snapshotz"), kda.INVALID_ARGUMENT,
             "pool_view: unknown tensor 'snapshotz'")
    rejected(lambda: be.allocate_slot(st), kda.OUT_OF_MEMORY, "")
