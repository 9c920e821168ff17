// Writes the CUDA runtime tests' hand-written PTX to argv[1], so that the
// build can assemble it into a real sm_90 cubin with ptxas where the toolkit
// is installed (tests/unit/CMakeLists.txt).
#include <cstdio>

#include "tests/unit/cuda_test_util.h"

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s OUT.ptx\n", argv[0]);
    return 2;
  }
  std::FILE* out = std::fopen(argv[1], "w");
  if (out == nullptr) {
    std::perror(argv[1]);
    return 1;
  }
  const bool ok = std::fputs(kiln::testing_cuda::kPointwisePtx, out) >= 0;
  return std::fclose(out) == 0 && ok ? 0 : 1;
}
