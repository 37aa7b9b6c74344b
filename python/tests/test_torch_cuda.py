"""The Python package with torch CUDA tensors on the CUDA kernel set (a GPU host; not run in
CI): the checks of test_replay_host.py, against kda_replay --device cuda:N on the same
directories (bitwise: the same kernels), with the CUDA stream passed as torch's integer handle.
Skipped (exit 0) when torch or a CUDA device is absent.

Usage: test_torch_cuda.py --replay PATH/kda_replay [--library PATH/libkda_c.so] [--device N]
"""

import argparse
import os
import sys
import tempfile

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import kda  # noqa: E402
from replay_check import check_examples  # noqa: E402
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
    return 0


if __name__ == "__main__":
    sys.exit(main())
