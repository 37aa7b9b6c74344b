"""catch_test: a Catch2 test of this package (links :catch_main and Catch2)."""

load("@rules_cc//cc:defs.bzl", "cc_test")

def catch_test(name, srcs = [], deps = [], size = "small", gpu = False, tags = [], **kwargs):
    """A cc_test with the Catch2 main.

    Args:
      name: target name.
      srcs: test sources.
      deps: libraries under test (:catch_main and @catch2 are added).
      size: Bazel test size.
      gpu: needs a CUDA device: tagged `gpu`, so `bazel test //...` compiles it but skips it
        (.bazelrc test_tag_filters) and tools/gpu_bundle.sh collects it for a GPU host.
      tags: further tags.
      **kwargs: passed to cc_test (copts, args, ...).
    """
    cc_test(
        name = name,
        size = size,
        srcs = srcs,
        tags = (["gpu"] if gpu else []) + tags,
        deps = [":catch_main", "@catch2"] + deps,
        **kwargs
    )
