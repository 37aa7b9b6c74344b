"""cuda_library: compiles .cu files with the system nvcc and wraps them in a cc_library.

Build settings (command line):
  --define=kda_cuda_archs=90a,100a   SASS targets (default: sm_90a and sm_100a)
  --define=kda_ptxas_verbose=1       print ptxas register/spill reports (-Xptxas -v)
"""

load("@local_cuda//:defs.bzl", "NVCC")
load("@rules_cc//cc:defs.bzl", "cc_library")

_DEFAULT_ARCHS = "90a,100a"

def _gencode_flags(archs):
    flags = []
    for arch in archs.split(","):
        arch = arch.strip()
        if not arch:
            continue
        flags += ["-gencode", "arch=compute_%s,code=sm_%s" % (arch, arch)]
    return flags

def _cuda_objects_impl(ctx):
    cc_infos = [dep[CcInfo] for dep in ctx.attr.deps if CcInfo in dep]
    includes = depset(transitive = [i.compilation_context.includes for i in cc_infos])
    quote_includes = depset(transitive = [i.compilation_context.quote_includes for i in cc_infos])
    system_includes = depset(transitive = [i.compilation_context.system_includes for i in cc_infos])
    defines = depset(transitive = [i.compilation_context.defines for i in cc_infos])
    headers = depset(
        ctx.files.hdrs,
        transitive = [i.compilation_context.headers for i in cc_infos],
    )

    common = [
        "-std=c++17",
        "-O3",
        "-lineinfo",
        "-Xcompiler=-fPIC,-Wall,-Wextra,-Werror",
        "-Werror=all-warnings",
        "-I.",
        "-I" + ctx.bin_dir.path,
    ]
    for inc in includes.to_list():
        common += ["-I" + inc]
    for inc in quote_includes.to_list():
        common += ["-I" + inc]
    for inc in system_includes.to_list():
        common += ["-isystem", inc]
    for d in defines.to_list():
        common += ["-D" + d]
    common += _gencode_flags(ctx.var.get("kda_cuda_archs", _DEFAULT_ARCHS))
    if ctx.var.get("kda_ptxas_verbose", "0") == "1":
        common += ["-Xptxas", "-v"]
    common += ctx.attr.copts

    outs = []
    for src in ctx.files.srcs:
        out = ctx.actions.declare_file(
            "_objs/%s/%s.pic.o" % (ctx.label.name, src.path.replace("/", "_")),
        )
        ctx.actions.run(
            executable = NVCC,
            arguments = common + ["-c", src.path, "-o", out.path],
            inputs = depset([src], transitive = [headers]),
            outputs = [out],
            mnemonic = "Nvcc",
            progress_message = "nvcc %s" % src.short_path,
            use_default_shell_env = True,
        )
        outs.append(out)
    return [DefaultInfo(files = depset(outs))]

_cuda_objects = rule(
    implementation = _cuda_objects_impl,
    attrs = {
        "srcs": attr.label_list(allow_files = [".cu"]),
        "hdrs": attr.label_list(allow_files = [".h", ".cuh"]),
        "deps": attr.label_list(providers = [CcInfo]),
        "copts": attr.string_list(),
    },
)

def cuda_library(name, srcs, hdrs = [], textual_hdrs = [], deps = [], copts = [], **kwargs):
    """A cc_library whose .cu sources are compiled by nvcc.

    Args:
      name: target name; dependents link it like any cc_library.
      srcs: .cu files, one object each.
      hdrs: public headers (.h plain C++, .cuh nvcc-only).
      textual_hdrs: private headers the .cu files include (e.g. kernel bodies).
      deps: cc_library deps; their headers, includes and defines reach nvcc.
      copts: extra nvcc flags.
      **kwargs: passed to the cc_library (visibility, tags, ...).
    """
    _cuda_objects(
        name = name + "_nvcc",
        srcs = srcs,
        hdrs = hdrs + textual_hdrs,
        deps = deps + ["@local_cuda//:cuda_headers"],
        copts = copts,
        tags = kwargs.get("tags", []),
    )
    cc_library(
        name = name,
        srcs = [":" + name + "_nvcc"],
        hdrs = hdrs,
        textual_hdrs = textual_hdrs,
        deps = deps + ["@local_cuda//:cudart"],
        alwayslink = True,
        linkstatic = True,
        **kwargs
    )
