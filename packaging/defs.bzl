"""Rules of //packaging: whole_archive (link every object of a library set into a shared
library) and kda_headers (the workspace headers the public headers are taken from)."""

load("@bazel_tools//tools/cpp:toolchain_utils.bzl", "find_cpp_toolchain")

def _whole_archive_impl(ctx):
    cc_toolchain = find_cpp_toolchain(ctx)
    feature_configuration = cc_common.configure_features(
        ctx = ctx,
        cc_toolchain = cc_toolchain,
        requested_features = ctx.features,
        unsupported_features = ctx.disabled_features,
    )
    merged = cc_common.merge_cc_infos(cc_infos = [d[CcInfo] for d in ctx.attr.deps])
    inputs = []
    for linker_input in merged.linking_context.linker_inputs.to_list():
        libraries = []
        for lib in linker_input.libraries:
            archive = lib.pic_static_library or lib.static_library
            if archive and archive.owner.workspace_name == "" and not lib.alwayslink:
                lib = cc_common.create_library_to_link(
                    actions = ctx.actions,
                    feature_configuration = feature_configuration,
                    cc_toolchain = cc_toolchain,
                    static_library = lib.static_library,
                    pic_static_library = lib.pic_static_library,
                    alwayslink = True,
                )
            libraries.append(lib)
        inputs.append(cc_common.create_linker_input(
            owner = linker_input.owner,
            libraries = depset(libraries),
            user_link_flags = depset(linker_input.user_link_flags),
            additional_inputs = depset(linker_input.additional_inputs),
        ))
    return [CcInfo(
        compilation_context = merged.compilation_context,
        linking_context = cc_common.create_linking_context(
            linker_inputs = depset(inputs, order = "topological"),
        ),
    )]

whole_archive = rule(
    implementation = _whole_archive_impl,
    doc = """The deps, with every library of this workspace marked alwayslink.

A shared library links an archive's objects only when something references them; a
linkshared cc_binary on this CcInfo gets all of them (every public entry point), as
--whole-archive would. External libraries (the static CUDA runtime, system libraries) stay
as they are: only what the workspace's objects use is taken from them.""",
    attrs = {
        "deps": attr.label_list(providers = [CcInfo]),
        "_cc_toolchain": attr.label(default = "@bazel_tools//tools/cpp:current_cc_toolchain"),
    },
    fragments = ["cpp"],
    toolchains = ["@bazel_tools//tools/cpp:toolchain_type"],
    incompatible_use_toolchain_transition = True,
)

def _kda_headers_impl(ctx):
    headers = []
    for dep in ctx.attr.deps:
        for f in dep[CcInfo].compilation_context.headers.to_list():
            if f.is_source and f.owner.workspace_name == "" and f.extension == "h":
                headers.append(f)
    return [DefaultInfo(
        files = depset(headers),
        runfiles = ctx.runfiles(files = headers),
    )]

kda_headers = rule(
    implementation = _kda_headers_impl,
    doc = """The headers of this workspace that the deps' compilation contexts carry (hdrs,
headers among srcs, textual_hdrs; not @fmt, @spdlog or the CUDA toolkit). install.sh installs
the include closure of the public roots out of this set, so an internal header is installed
only when a public one includes it, and a newly included one without a BUILD change.""",
    attrs = {"deps": attr.label_list(providers = [CcInfo])},
)
