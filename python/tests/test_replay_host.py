"""The Python package on the host kernel set with numpy, against kda_replay --device host:
verify and commit outputs and states bitwise equal in both record modes (eager and deferred
commit in ring mode), on two example directories; bad inputs raise kda.Error naming the
argument; pool views export through DLPack.

Usage: test_replay_host.py --replay PATH/kda_replay [--library PATH/libkda_c.so] [--work DIR]
(the library also from $KDA_LIBRARY). Exit status 0 when every check passes.
"""

import argparse
import gc
import os
import sys
import tempfile

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import kda  # noqa: E402
from replay_check import NumpyTensors, check_examples, expect_error  # noqa: E402

EXAMPLES = {
    "default": [],
    "padded_safe_bf16": ["--pad-request", "--lower-bound", "-5", "--conv-dtype", "bf16",
                         "--no-rows", "--seed", "3", "--B", "3", "--T", "3"],
}


def check_dlpack_export(library, work):
    """Pool views are DLPack producers: numpy.from_dlpack sees the pool's memory (no copy), and
    the view's capsule keeps the backend alive."""
    model = kda.Model(num_layers=2, H=2, HV=4, K=64, V=64)
    be = kda.Backend(model=model, flags=["--max-running-requests", "2"], library=library)
    view = be.pool_view("ssm_state", 1)
    assert view.shape == (2, 4, 64, 64) and view.dtype == "float32", (view.shape, view.dtype)
    arr = be.pool_array("ssm_state", 1)
    arr[1, 2, 3, 4] = 42.0
    exported = np.from_dlpack(view)
    assert exported.shape == view.shape and exported[1, 2, 3, 4] == 42.0
    assert exported.__array_interface__["data"][0] == view.data_ptr
    capsule = view.__dlpack__()  # unconsumed: its destructor calls the deleter
    del capsule
    cursor = be.pool_array("conv_state", -1)
    assert cursor.shape == (2, 2, 3, 512) and cursor.dtype == np.uint16
    del be, view
    gc.collect()
    assert exported[1, 2, 3, 4] == 42.0  # the export keeps the pool alive
    del exported, arr, cursor
    gc.collect()
    assert not kda._dlpack._exported, "an exported managed tensor was never deleted"

    expect_error(lambda: kda.Backend(model=model, flags=["--speculative-num-draft-tokens", "0"],
                                     library=library),
                 kda.INVALID_ARGUMENT, "--speculative-num-draft-tokens")
    expect_error(lambda: kda.Backend(model=model, flags=["--no-such-flag"], library=library),
                 kda.INVALID_ARGUMENT, "'--no-such-flag' is not a flag of the module")
    expect_error(lambda: kda.Backend(model=model, device="tpu:0", library=library),
                 kda.INVALID_ARGUMENT, "create: device 'tpu:0' unsupported")
    expect_error(lambda: kda.Backend(model=kda.Model(num_layers=1, H=2, HV=3, K=64, V=64),
                                     library=library), kda.INVALID_ARGUMENT, "HV")
    try:
        kda.Backend(model=model, library="/nonexistent/libkda_c.so")
    except OSError as e:
        assert "/nonexistent/libkda_c.so (no such file)" in str(e), str(e)
    else:
        raise AssertionError("a missing library= path loaded something")


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--replay", required=True, help="the kda_replay binary")
    p.add_argument("--library", default=None, help="libkda_c.so (default: $KDA_LIBRARY, ...)")
    p.add_argument("--work", default=None, help="scratch directory (default: a temporary one)")
    args = p.parse_args()
    work = args.work or tempfile.mkdtemp(prefix="kda_py_", dir=os.environ.get("TEST_TMPDIR"))
    print(f"kda: library {kda.load_library(args.library)._name}")

    checks = check_examples(args.replay, work, EXAMPLES, NumpyTensors, library=args.library)
    check_dlpack_export(args.library, work)
    print(f"OK: {checks} replay checks bitwise equal to kda_replay --device host; DLPack "
          "export and create errors checked")
    return 0


if __name__ == "__main__":
    sys.exit(main())
