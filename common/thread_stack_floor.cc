// A floor under the stack size that libraries ask for their threads.
//
// glibc carves a thread's static TLS out of its stack, so pthread_create
// fails with EINVAL when the requested stack cannot hold it. A process that
// links LibTorch has ~100 KiB of static TLS (OpenBLAS 60 KiB, glog 30 KiB,
// libtorch_cpu 10 KiB, ...), and Debian's civetweb -- the HTTP server under
// prometheus-cpp's Exposer -- asks for 100 KiB stacks (USE_STACK_SIZE), so
// the worker's metrics endpoint could not start ("null context when
// constructing CivetServer"; gdb: pthread_create returned 22).
//
// Linking this file into a binary (alwayslink, symbol exported with
// --export-dynamic-symbol) interposes pthread_attr_setstacksize for every
// library in the process: requests below kFloor are raised to kFloor, larger
// ones are left alone. Stacks are virtual memory, touched only as used.
#include <dlfcn.h>
#include <pthread.h>

#include <cstddef>

namespace {

constexpr size_t kFloor = 1 << 20;

using SetStackSize = int (*)(pthread_attr_t*, size_t);

SetStackSize Next() {
  static const SetStackSize next = reinterpret_cast<SetStackSize>(dlsym(RTLD_NEXT, "pthread_attr_setstacksize"));
  return next;
}

}  // namespace

extern "C" int pthread_attr_setstacksize(pthread_attr_t* attr, size_t size) {
  return Next()(attr, size < kFloor ? kFloor : size);
}
