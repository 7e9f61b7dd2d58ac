"""Repository rules for the system (Debian) libraries pstrain builds against.

Nothing here downloads anything: each rule points Bazel at files that
`make setup` installed with apt-get.
"""

def _system_library_repository_impl(ctx):
    # Headers live in /usr/include, which the auto-configured C++ toolchain
    # already searches, so the BUILD file only has to carry link flags.
    ctx.symlink(ctx.attr.build_file, "BUILD.bazel")
    ctx.file("WORKSPACE", "workspace(name = \"%s\")\n" % ctx.name)

system_library_repository = repository_rule(
    implementation = _system_library_repository_impl,
    attrs = {"build_file": attr.label(mandatory = True, allow_single_file = True)},
    local = True,
)

_LIBTORCH_BUILD = """\
package(default_visibility = ["//visibility:public"])

# LibTorch from {root}. Only code that needs tensors depends on this target:
# its headers are the single biggest cost of a build on a small machine.
cc_library(
    name = "torch",
    hdrs = glob([
        "include/ATen/**",
        "include/c10/**",
        "include/caffe2/**",
        "include/torch/**",
    ], allow_empty = True),
    includes = [
        "include",
        "include/torch/csrc/api/include",
    ],
    defines = [
        "USE_C10D_GLOO",
        "USE_DISTRIBUTED",
    ],
    linkopts = [
        "-L{lib}",
        "-Wl,-rpath,{lib}",
        "-ltorch",
        "-ltorch_cpu",
        "-lc10",
        "-lpthread",
    ],
)
"""

def _libtorch_repository_impl(ctx):
    root = ctx.os.environ.get("PSTRAIN_LIBTORCH", "/usr")
    include = ctx.path(root + "/include")
    if not include.get_child("torch").exists:
        fail("PSTRAIN_LIBTORCH=%s has no include/torch: install libtorch-dev (make setup) " % root +
             "or point PSTRAIN_LIBTORCH at an unpacked LibTorch")
    lib = root + "/lib"
    if not ctx.path(lib + "/libtorch.so").exists:
        lib = root + "/lib/x86_64-linux-gnu"
    if not ctx.path(lib + "/libtorch.so").exists:
        fail("no libtorch.so under %s/lib or %s/lib/x86_64-linux-gnu" % (root, root))
    for sub in ["ATen", "c10", "caffe2", "torch"]:
        if include.get_child(sub).exists:
            ctx.symlink(include.get_child(sub), "include/" + sub)
    ctx.file("WORKSPACE", "workspace(name = \"libtorch\")\n")
    ctx.file("BUILD.bazel", _LIBTORCH_BUILD.format(root = root, lib = lib))

libtorch_repository = repository_rule(
    implementation = _libtorch_repository_impl,
    environ = ["PSTRAIN_LIBTORCH"],
    local = True,
)
