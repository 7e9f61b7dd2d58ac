"""Repository rules for the system (Debian) libraries pstrain builds against.

Nothing here downloads anything: each rule points Bazel at files that
`make setup` installed with apt-get.
"""

def _system_library_repository_impl(ctx):
    # Headers live in /usr/include, which the auto-configured C++ toolchain
    # already searches, so the BUILD file only has to carry link flags.
    ctx.symlink(ctx.attr.build_file, "BUILD.bazel")
    ctx.file("WORKSPACE", "workspace(name = \"%s\")\n" % ctx.name)

    # Abseil's libraries, in link order (what pkg-config prints for the ones
    # pstrain uses). Releases split libraries out: Debian 13's Abseil has
    # string_view and kernel_timeout_internal (which absl::CondVar's timed waits
    # need) in libraries of their own, linked where they exist. (Linking
    # every installed libabsl_* instead runs static initialisers that clash,
    # absl_log_flags's among them.)
    libdir = "/usr/lib/x86_64-linux-gnu/"
    absl = [
        "flags_parse", "flags_usage", "flags_usage_internal", "flags_internal", "flags_marshalling",
        "flags_reflection", "flags_config", "flags_program_name", "flags_private_handle_accessor",
        "flags_commandlineflag", "flags_commandlineflag_internal", "statusor", "status", "cord",
        "cordz_info", "cord_internal", "cordz_functions", "cordz_handle", "hash", "city", "low_level_hash",
        "raw_hash_set", "hashtablez_sampler", "exponential_biased", "synchronization",
        "graphcycles_internal", "stacktrace", "symbolize", "debugging_internal", "demangle_internal",
        "malloc_internal", "kernel_timeout_internal", "time", "civil_time", "time_zone", "str_format_internal", "strings",
        "strings_internal", "string_view", "strerror", "bad_optional_access", "bad_variant_access", "base",
        "spinlock_wait", "int128", "throw_delegate", "raw_logging_internal", "log_severity",
    ]
    linkopts = ["-labsl_" + n for n in absl if ctx.path(libdir + "libabsl_" + n + ".so").exists] + ["-lpthread"]
    ctx.file("absl.bzl", "ABSL_LINKOPTS = %r\n" % linkopts)

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

_CUDA_BUILD = """\
package(default_visibility = ["//visibility:public"])

# NCCL and the CUDA runtime from {root} (found at fetch time).
cc_library(
    name = "nccl",
    hdrs = glob(["include/**"], allow_empty = True),
    includes = ["include"],
    linkopts = [
        "-L{lib}",
        "-Wl,-rpath,{lib}",
        "-lnccl",
        "-lcudart",
    ],
)
"""

def _cuda_repository_impl(ctx):
    # The NCCL backend is built when a CUDA toolkit with NCCL is found
    # (PSTRAIN_CUDA, default /usr/local/cuda); otherwise @cuda//:defs.bzl
    # says HAVE_NCCL = False and the backend reports that it is not built.
    root = ctx.os.environ.get("PSTRAIN_CUDA", "/usr/local/cuda")
    lib = root + "/lib64"
    found = (ctx.path(root + "/include/nccl.h").exists and ctx.path(root + "/include/cuda_runtime.h").exists and
             ctx.path(lib + "/libnccl.so").exists and ctx.path(lib + "/libcudart.so").exists)
    ctx.file("WORKSPACE", "workspace(name = \"cuda\")\n")
    if found:
        ctx.symlink(root + "/include", "include")
        ctx.file("BUILD.bazel", _CUDA_BUILD.format(root = root, lib = lib))
    else:
        ctx.file("BUILD.bazel", "package(default_visibility = [\"//visibility:public\"])\n" +
                                "cc_library(name = \"nccl\")\n")
    ctx.file("defs.bzl", "HAVE_NCCL = %s\nCUDA_ROOT = \"%s\"\n" % (found, root))

cuda_repository = repository_rule(
    implementation = _cuda_repository_impl,
    environ = ["PSTRAIN_CUDA"],
    local = True,
)
