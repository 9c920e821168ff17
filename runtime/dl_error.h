// dlerror()'s text, for the runtime's dlopen/dlsym failures (the CUDA
// driver, cuBLASLt, cuDNN, the CPU BLAS, CPU artifacts' shared objects).
//
// Thread-safety: dlerror() reports the calling thread's last error; call
// right after the failed dlopen or dlsym on the same thread.
#ifndef KILN_RUNTIME_DL_ERROR_H_
#define KILN_RUNTIME_DL_ERROR_H_

#include <dlfcn.h>

#include <string>

namespace kiln {

// The loader's message, or "unknown dlopen error" when it left none.
inline std::string DlError() {
  const char* message = dlerror();
  return message != nullptr ? message : "unknown dlopen error";
}

}  // namespace kiln

#endif  // KILN_RUNTIME_DL_ERROR_H_
