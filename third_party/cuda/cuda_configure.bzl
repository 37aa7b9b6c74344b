"""Repository rule exposing the system CUDA toolkit ($CUDA_HOME, default /usr/local/cuda)."""

_BUILD = """
package(default_visibility = ["//visibility:public"])

# Runtime API headers for plain C++ (.cc) files; nvcc finds its own headers.
cc_library(
    name = "cuda_headers",
    hdrs = glob(["include/*.h", "include/crt/*.h", "include/crt/*.hpp"]),
    includes = ["include"],
)

# Static cudart: binaries carried to a GPU host need no libcudart.so beside them.
cc_library(
    name = "cudart",
    srcs = ["lib64/libcudart_static.a"],
    linkopts = ["-ldl", "-lpthread", "-lrt"],
    deps = [":cuda_headers"],
)

# cuBLASLt, shared (the toolkit ships no static copy): tools only (kda_bench's step GEMMs), never
# the library. The run path points at the toolkit's lib64, where a GPU host with the toolkit has it.
cc_library(
    name = "cublaslt",
    srcs = ["lib64/libcublasLt.so"],
    hdrs = glob(["include/*.hpp", "include/nv/**"]),  # cublasLt.h pulls in cuda_fp16.h
    includes = ["include"],
    linkopts = ["-Wl,-rpath,%s/lib64"],
    deps = [":cuda_headers"],
)
"""

def _cuda_configure_impl(rctx):
    root = rctx.os.environ.get("CUDA_HOME", "/usr/local/cuda")
    nvcc = rctx.path(root + "/bin/nvcc")
    if not nvcc.exists:
        fail("CUDA toolkit not found: %s does not exist (set CUDA_HOME)" % nvcc)
    rctx.symlink(root + "/include", "include")
    rctx.symlink(root + "/lib64", "lib64")
    rctx.file("BUILD", _BUILD.replace("%s/lib64", root + "/lib64"))
    rctx.file("defs.bzl", 'CUDA_HOME = "%s"\nNVCC = "%s"\n' % (root, nvcc))

cuda_configure = repository_rule(
    implementation = _cuda_configure_impl,
    environ = ["CUDA_HOME"],
    local = True,
)
