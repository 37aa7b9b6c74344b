"""The Python package with torch CUDA tensors on the CUDA kernel set (a GPU host; not run in
CI). Skipped (exit 0) when torch or a CUDA device is absent.

* the checks of test_replay_host.py, against kda_replay --device cuda:N on the same directories
  (bitwise: the same kernels), with the CUDA stream passed as torch's integer handle;
* engine-owned memory (issue 58): Backends on torch's caching allocator (kda.TorchAllocator), on
  an external pool of torch tensors (padded pitches, spare slots) and on both, bitwise the owning
  Backend over random dense / ragged / tree rounds in snapshot, eager and deferred ring mode;
  torch.cuda.memory_allocated counts the allocator's bytes and drops back after close
  (check_engine_memory_torch);
* kda.ops on SGLang-shaped torch CUDA buffers bitwise kda.Backend (check_ops_torch);
* a torch.cuda.CUDAGraph: prepare outside, verify and commit captured on torch's capture stream
  (the default stream=None: torch's current stream), replayed across changing batches of one
  bucket (B = 3, T = 3: other slots, a padding request or none, other weights, state and inputs
  per replay), every replay bitwise kda_replay --device cuda:N on its directory, in snapshot,
  eager ring and deferred ring mode (check_graph_replay);
* pool views made torch tensors keep the backend's memory alive across close()
  (check_lifetime_torch).

Usage: test_torch_cuda.py --replay PATH/kda_replay [--library PATH/libkda_c.so] [--device N]
"""

import argparse
import os
import sys
import tempfile

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import gc  # noqa: E402

import kda  # noqa: E402
import test_engine_host as host  # noqa: E402
from replay_check import _same, check_examples, load, make_example, run_replay  # noqa: E402
from test_replay_host import EXAMPLES  # noqa: E402

try:
    import torch
except ImportError:
    torch = None


class TorchTensors:
    """CUDA tensors: torch (bf16 natively), on one stream (a non-default one: the stream
    handle must reach the kernels)."""

    def __init__(self, index):
        self.device = f"cuda:{index}"
        self.torch_device = torch.device("cuda", index)
        self.side = torch.cuda.Stream(device=self.torch_device)
        self.stream = self.side.cuda_stream

    def _to(self, host):
        with torch.cuda.stream(self.side):
            return host.to(self.torch_device, non_blocking=False)

    def bf16(self, array_u16):
        host = torch.from_numpy(np.ascontiguousarray(array_u16).view(np.int16))
        return self._to(host.view(torch.bfloat16))

    def plain(self, array):
        array = np.ascontiguousarray(array)
        if array.dtype == np.uint16:
            array = array.view(np.int16)  # torch has no uint16 tensors before 2.3
        return self._to(torch.from_numpy(array))

    def empty_bf16(self, shape):
        with torch.cuda.stream(self.side):
            return torch.zeros(shape, dtype=torch.bfloat16, device=self.torch_device)

    def to_numpy(self, t):
        self.sync()
        if t.dtype == torch.bfloat16:
            return t.view(torch.int16).cpu().numpy().view(np.uint16)
        return t.cpu().numpy()

    def pool(self, backend, name, layer):
        return self.to_numpy(torch.from_dlpack(backend.pool_view(name, layer)))

    def write_pool(self, backend, name, layer, values):
        dst = torch.from_dlpack(backend.pool_view(name, layer))
        src = self.bf16(values) if dst.dtype == torch.bfloat16 else self.plain(values)
        with torch.cuda.stream(self.side):
            dst.copy_(src)
        self.sync()

    def sync(self):
        torch.cuda.synchronize(self.torch_device)



# ---- engine integration (issue 58) with torch CUDA tensors ----

def to_torch(array, device):
    """A numpy array (bf16 bits as uint16) as a torch CUDA tensor (bf16 as torch.bfloat16)."""
    array = np.ascontiguousarray(array)
    if array.dtype == np.uint16:
        return torch.from_numpy(array.view(np.int16)).view(torch.bfloat16).to(device)
    return torch.from_numpy(array).to(device)


def to_numpy(t):
    torch.cuda.synchronize(t.device)
    if t.dtype == torch.bfloat16:
        return t.view(torch.int16).cpu().numpy().view(np.uint16)
    return t.cpu().numpy()


def view_of(be, name, layer=-1):
    return torch.from_dlpack(be.pool_view(name, layer))


def torch_backend(library, device, ring, deferred, topk, **kw):
    be = kda.Backend(model=host.model(), flags=host.flags(ring, deferred, topk), extra_slots=1,
                     device=str(device), library=library, **kw)
    be._w = [tuple(to_torch(w, device) for w in ws) for ws in host.weights(100)]
    for layer, w in enumerate(be._w):
        be.set_layer_weights(layer, *w)
    return be


def fill_torch(be, ring, seed):
    rng = np.random.default_rng(seed)
    for name, (dtype, shape) in host.pool_shapes(ring, False).items():
        if name == "qkv_act":
            continue
        t = view_of(be, name)
        values = host.bits(rng, tuple(t.shape), 0.5) if dtype == np.uint16 else \
            (rng.standard_normal(tuple(t.shape)) * 0.2).astype(dtype)
        t.copy_(to_torch(values, t.device))
    torch.cuda.synchronize()


def torch_round(be, r, device):
    """host.backend_round with torch CUDA tensors on torch's current stream (stream=None)."""
    kw = {}
    if r.lengths is not None:
        kw["lengths"] = r.lengths
    if r.parents is not None:
        kw["parents"] = r.parents
    be.prepare(r.T, r.slots, r.rows, **kw)
    outs = []
    for layer in range(host.L_):
        q, a, b = (to_torch(x, device) for x in r.inputs[layer])
        out = to_torch(r.garbage, device)
        be.verify(layer, q, a, b, out)
        outs.append(to_numpy(out))
    acc = to_torch(np.array(r.accepted, np.int32), device)
    if r.tree:
        be.commit_tree(acc, to_torch(np.array(r.paths, np.int32).reshape(r.B, r.T), device))
    else:
        be.commit(acc)
    be.check_device_errors()
    return outs


def padded_torch(dtype, shape, pitch_dim, device):
    """host.padded with torch: a strided view into a bigger byte tensor filled with 0x5A."""
    itemsize = torch.tensor([], dtype=dtype).element_size()
    pad = 16 // itemsize
    strides, span = [0] * len(shape), 1
    for d in range(len(shape) - 1, -1, -1):
        strides[d] = span
        span *= shape[d]
        if pitch_dim >= 0 and d in (pitch_dim, pitch_dim - 1):
            strides[d] += pad if d == pitch_dim else 2 * pad
            span = strides[d] * shape[d]
    base = torch.full(((span + 256) * itemsize,), 0x5A, dtype=torch.uint8, device=device)
    offset = (-base.data_ptr()) % 256
    flat = base[offset:offset + span * itemsize].view(dtype)
    return torch.as_strided(flat, shape, strides), base


_TORCH_DTYPES = {np.uint16: "bfloat16", np.float32: "float32", np.int32: "int32"}


def external_pool_torch(ring, deferred, device, state_only=False):
    tensors, bases = {}, []
    for name, (dtype, shape) in host.pool_shapes(ring, deferred, slots=host.S + 2,
                                                 rows=host.R + 1, steps=host.T_MAX + 1,
                                                 cursor=True).items():
        if state_only and name not in ("conv_state", "ssm_state"):
            continue
        pitch = -1 if name in ("qkv_act", "ring_cursor", "ring_pending") else 1
        t, base = padded_torch(getattr(torch, _TORCH_DTYPES[dtype]), shape, pitch, device)
        tensors[name] = t
        bases.append(base)
    return tensors, bases


def check_engine_memory_torch(library, device, seed=58):
    checks = 0
    for what, ring, deferred, topk in host.MODES:
        torch.cuda.synchronize()
        gc.collect()
        baseline = torch.cuda.memory_allocated(device)
        ext, ext_bases = external_pool_torch(ring, deferred, device)
        state, state_bases = external_pool_torch(ring, deferred, device, state_only=True)
        with_pools = torch.cuda.memory_allocated(device)
        backends = [torch_backend(library, device, ring, deferred, topk),
                    torch_backend(library, device, ring, deferred, topk, external_pool=ext),
                    torch_backend(library, device, ring, deferred, topk, allocator="torch"),
                    torch_backend(library, device, ring, deferred, topk, allocator="torch",
                                  external_pool=state)]
        reports = [be.memory_report() for be in backends]
        grown = torch.cuda.memory_allocated(device) - with_pools
        owned = reports[2]["allocated_bytes"] + reports[3]["allocated_bytes"]
        assert grown >= owned, f"{what}: torch counts {grown} bytes, the backends took {owned}"
        assert reports[1]["external_bytes"] == reports[1]["pool_bytes"], reports[1]
        assert reports[2]["from_allocator"] and reports[3]["from_allocator"]
        for be in backends:
            for _ in range(host.S):
                be.allocate_slot()
            fill_torch(be, ring, seed)
        rng = np.random.default_rng(seed + 2)
        for rnd in range(8):
            r = host.Round(rng, topk)
            outs = [torch_round(be, r, device) for be in backends]
            for i, be in enumerate(backends[1:], 1):
                for layer in range(host.L_):
                    host.same(f"{what} backend {i} round {rnd} layer {layer}", outs[i][layer],
                              outs[0][layer])
                for name in host.pool_shapes(ring, deferred):
                    if name != "qkv_act":
                        host.same(f"{what} backend {i} round {rnd}: {name}",
                                  to_numpy(view_of(be, name)), to_numpy(view_of(backends[0], name)))
            checks += 1
        for be in backends:
            be.close()
            assert be.released
        del be, backends, ext, state, ext_bases, state_bases
        gc.collect()
        torch.cuda.synchronize()
        after = torch.cuda.memory_allocated(device)
        assert after == baseline, f"{what}: {after - baseline} bytes still allocated after close"
    return checks


def check_ops_torch(library, device, seed=58):
    """kda.ops on SGLang-shaped torch CUDA buffers is bitwise kda.Backend."""
    checks = 0
    for what, ring, deferred, topk in host.MODES:
        be = torch_backend(library, device, ring, deferred, topk)
        for _ in range(host.S):
            be.allocate_slot()
        fill_torch(be, ring, seed)
        pool = {}
        for name, (dtype, shape) in host.pool_shapes(ring, deferred, slots=host.S + 1).items():
            t = torch.zeros(shape, dtype=getattr(torch, _TORCH_DTYPES[dtype]), device=device)
            if name != "qkv_act":
                src = view_of(be, name)
                if name in host.SLOT_TENSORS:
                    t[:, :host.S].copy_(src)
                elif name == "ring_cursor":
                    t[:host.S].copy_(src)
                else:
                    t.copy_(src)
            pool[name] = t
        rng = np.random.default_rng(seed + 1)
        for rnd in range(6):
            r = host.Round(rng, topk)
            outs = torch_round(be, r, device)
            slots = to_torch(np.array(r.slots, np.int32), device)
            rows = to_torch(np.array(r.rows if r.rows is not None else range(r.B), np.int32),
                            device)
            qsl = None if r.lengths is None else to_torch(
                np.concatenate([[0], np.cumsum(r.lengths)]).astype(np.int32), device)
            parents = to_torch(np.array(r.parents, np.int32).reshape(r.B, r.T), device) \
                if r.tree else None
            for layer in range(host.L_):
                q, a, b = (to_torch(x, device) for x in r.inputs[layer])
                out = to_torch(r.garbage, device)
                w = be._w[layer]
                # mixed_qkv through the no-sync DLPack path (ordered on this stream already).
                kda.ops.verify(kda.via_dlpack(q, sync=False), a, b, out, A_log=w[0],
                               dt_bias=w[1], conv_weight=w[2],
                               conv_bias=w[3], state=kda.ops.layer(pool, layer), slots=slots,
                               rows=rows, T=r.T, query_start_loc=qsl, parents=parents,
                               fused_ring_max_batch=2, library=library)
                host.same(f"ops {what} round {rnd} layer {layer}", to_numpy(out), outs[layer])
            flag = torch.zeros(1, dtype=torch.int32, device=device)
            kda.ops.commit(
                state=pool, slots=slots, rows=rows, T=r.T,
                accepted_lengths=to_torch(np.array(r.accepted, np.int32), device),
                query_start_loc=qsl, parents=parents,
                accepted_paths=to_torch(np.array(r.paths, np.int32).reshape(r.B, r.T), device)
                if r.tree else None,
                checked_accepted=torch.zeros(r.B, dtype=torch.int32, device=device),
                error_flag=flag, library=library)
            assert int(flag.item()) == 0
            for name in pool:
                if name == "qkv_act":
                    continue
                got = pool[name]
                got = got[:, :host.S] if name in host.SLOT_TENSORS else \
                    got[:host.S] if name == "ring_cursor" else got
                host.same(f"ops {what} round {rnd}: {name}", to_numpy(got),
                          to_numpy(view_of(be, name)))
            checks += 1
        be.close()
    return checks


def check_graph_replay(replay, work, library, index, device=None, use_graph=True):
    """A torch.cuda.CUDAGraph of one layer's verify + the commit, captured once, replayed for
    batches of one bucket (B = 3, T = 3) with other slots, padding, weights, state and inputs:
    every replay bitwise kda_replay --device cuda:index on its directory. (use_graph=False runs
    each step eagerly instead, and device / kda_replay on the host: a check of this check.)"""
    device = device or torch.device("cuda", index)
    backend_device = f"cuda:{index}" if device.type == "cuda" else "host"
    checks = 0
    directories = []
    for i in range(4):
        d = os.path.join(work, f"graph_{i}")
        make_example(replay, d, ["--B", "3", "--T", "3", "--seed", str(20 + i)] +
                     (["--pad-request"] if i % 2 else []))
        directories.append(d)
    for mode, deferred in (("snapshot", False), ("ring", False), ("ring", True)):
        ring = mode == "ring"
        flags = ["--speculative-num-draft-tokens", "3", "--max-running-requests", "4",
                 "--kda-deferred-commit", "on" if deferred else "off"]
        if ring:
            flags += ["--enable-linear-replayssm-spec"]
        be = kda.Backend(model=kda.Model(num_layers=1, H=2, HV=4, K=64, V=64, has_conv_bias=True),
                         flags=flags, device=backend_device, extra_slots=1, allocator="torch",
                         library=library)
        S = be.info()["num_slots"]
        for _ in range(S):
            be.allocate_slot()
        # The graph's static tensors: weights, inputs, output, accepted lengths.
        first = directories[0]
        static = {name: to_torch(load(first, name), device) for name in
                  ("A_log", "dt_bias", "conv_weight", "conv_bias", "mixed_qkv", "a", "b")}
        static["accepted"] = to_torch(load(first, "accepted").astype(np.int32), device)
        out = torch.zeros((9, 4, 64), dtype=torch.bfloat16, device=device)
        be.set_layer_weights(0, static["A_log"], static["dt_bias"], static["conv_weight"],
                             static["conv_bias"])

        def load_directory(d, shift):
            """The directory's weights, inputs and state (its slot s in backend slot
            (s + shift) % S); returns the batch's slots and rows."""
            for name in ("A_log", "dt_bias", "conv_weight", "conv_bias", "mixed_qkv", "a", "b"):
                static[name].copy_(to_torch(load(d, name), device))
            static["accepted"].copy_(to_torch(load(d, "accepted").astype(np.int32), device))
            perm = [(s + shift) % S for s in range(S)]
            for name in ("ssm_state", "conv_state"):
                src = to_torch(load(d, name), device)
                dst = view_of(be, name, 0)
                for s in range(S):
                    dst[perm[s]].copy_(src[s])
            if ring:
                view_of(be, "ring_cursor").zero_()
                view_of(be, "ring_pending", 0).zero_()
            dir_slots = load(d, "slots").tolist()
            slots = [perm[s] if s >= 0 else -1 for s in dir_slots]
            # A padding request's row is never read (the directory's is out of range): any row.
            rows = [int(r) if s >= 0 else 0 for s, r in zip(dir_slots, load(d, "rows"))]
            return slots, rows, perm

        def step():  # the captured work: no stream given, torch's current one
            be.verify(0, static["mixed_qkv"], static["a"], static["b"], out)
            be.commit(static["accepted"])

        # Warm-up (eager), then the capture: prepare outside, verify + commit inside, on
        # torch's capture stream.
        slots, rows, _ = load_directory(first, 0)
        be.prepare(3, slots, rows)
        step()
        torch.cuda.synchronize(device)
        graph = None
        if use_graph:
            be.prepare(3, slots, rows)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                step()
        assert be.round_state.startswith("idle"), be.round_state
        for i, d in enumerate(directories):
            slots, rows, perm = load_directory(d, shift=i + 1)
            be.prepare(3, slots, rows)  # uploads the batch's indices on torch's current stream
            if use_graph:
                graph.replay()
            else:
                step()
            be.abort_round()  # the replay ran the round: this only ends it on the host
            if deferred:
                be.materialize([s for s in slots if s >= 0])
            torch.cuda.synchronize(device)
            ref = os.path.join(work, f"graph_{i}_{mode}_ref")
            run_replay(replay, d, ref, mode, backend_device)
            live = [(n, s) for n, s in enumerate(load(d, "slots").tolist()) if s >= 0]
            T = 3
            got_out, want_out = to_numpy(out), load(ref, "output")
            for n, _ in live:
                _same(f"graph {mode}{' deferred' if deferred else ''} replay {i}: output of "
                      f"request {n}", got_out[n * T:(n + 1) * T], want_out[n * T:(n + 1) * T])
            window, want_window = to_numpy(view_of(be, "conv_window", 0)), load(ref, "conv_window")
            for n, _ in live:
                _same(f"graph replay {i}: conv_window row {rows[n]}", window[rows[n], :T],
                      want_window[rows[n], :T])
            if ring:
                for name in ("ring_rawv", "ring_rawk", "ring_g", "ring_beta"):
                    got, want = to_numpy(view_of(be, name, 0)), load(ref, name)
                    for _, s in live:
                        _same(f"graph replay {i}: {name} slot {s}", got[perm[s], :, :T],
                              want[s, :, :T])
            else:
                got, want = to_numpy(view_of(be, "snapshots", 0)), load(ref, "snapshots")
                for n, _ in live:
                    _same(f"graph replay {i}: snapshots row {rows[n]}", got[rows[n], :T],
                          want[rows[n], :T])
            for name in ("ssm_state", "conv_state"):
                got, want = to_numpy(view_of(be, name, 0)), load(ref, name)
                for _, s in live:
                    _same(f"graph replay {i}: committed {name} slot {s}", got[perm[s]], want[s])
            checks += 1
        del graph
        be.close()
    return checks


def check_lifetime_torch(library, device):
    """A torch tensor made from a pool view keeps the backend's memory (torch's caching
    allocator's blocks) alive across close(); the memory goes with the last view."""
    torch.cuda.synchronize()
    gc.collect()
    baseline = torch.cuda.memory_allocated(device)
    be = kda.Backend(model=host.model(), flags=host.flags(True, True), extra_slots=1,
                     device=str(device), allocator="torch", library=library)
    assert torch.cuda.memory_allocated(device) > baseline
    t = view_of(be, "ssm_state", 0)
    be.close()
    assert be.closed and not be.released
    t.fill_(3.0)  # live memory: the backend's blocks are still allocated
    torch.cuda.synchronize()
    assert float(t[0, 0, 0, 0]) == 3.0
    del t
    gc.collect()
    torch.cuda.synchronize()
    assert be.released and torch.cuda.memory_allocated(device) == baseline
    return 1


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--replay", required=True)
    p.add_argument("--library", default=None)
    p.add_argument("--device", type=int, default=0)
    p.add_argument("--work", default=None)
    args = p.parse_args()
    if torch is None or not torch.cuda.is_available():
        print("SKIPPED: " + ("torch is not installed" if torch is None else
                             "torch sees no CUDA device"))
        return 0
    work = args.work or tempfile.mkdtemp(prefix="kda_torch_")
    print(f"kda: library {kda.load_library(args.library)._name}; torch {torch.__version__} on "
          f"{torch.cuda.get_device_name(args.device)}")
    checks = check_examples(args.replay, work, EXAMPLES, lambda: TorchTensors(args.device),
                            library=args.library, replay_device=f"cuda:{args.device}")
    print(f"OK: {checks} replay checks with torch CUDA tensors bitwise equal to kda_replay "
          f"--device cuda:{args.device}")
    device = torch.device("cuda", args.device)
    torch.cuda.set_device(device)
    n = check_engine_memory_torch(args.library, device)
    print(f"OK: {n} rounds: torch caching allocator / external torch pool / both bitwise the "
          "owning Backend; torch counts and gets back every byte")
    n = check_ops_torch(args.library, device)
    print(f"OK: {n} rounds: kda.ops on SGLang-shaped torch CUDA buffers bitwise kda.Backend")
    n = check_graph_replay(args.replay, work, args.library, args.device)
    print(f"OK: {n} torch CUDA graph replays (one bucket, changing batches) bitwise kda_replay "
          f"--device cuda:{args.device}")
    check_lifetime_torch(args.library, device)
    print("OK: pool views made torch tensors keep the memory alive across close()")
    return 0


if __name__ == "__main__":
    sys.exit(main())
