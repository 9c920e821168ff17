#!/usr/bin/env bash
# Runs Kiln's GPU tests and benchmarks from the relocatable bundle on a GPU
# machine that has none of the build's dependencies (an NVIDIA driver,
# glibc >= 2.36 and, for bench and python, python3 with torch):
#
#   make bundle BUNDLE_EXTRA="build/tests/gpu/cuda_gpu_test build/bench/gpu/cuda_bench build/tests/unit/cuda_runtime_test"
#   deploy/run-on-gpu.sh build-bundle/kiln-linux-x86_64.tar.xz tests|python|backend|pybench|bench|all [OUT_DIR]
#
# tests: cuda_runtime_test and cuda_gpu_test (its Client test starts the
# bundle's kilnd); python: the Python binding with PyTorch
# (kiln/share/kiln/tests/python_binding_test.py, both allocators);
# backend: the model suite through torch.compile(backend=kiln) on the GPU
# (tests/gpu/backend_gpu_test.py); pybench: bench/python/gpu_gemm.py and
# step_time.py --device cuda; all: tests, python and backend. $PYTHON names
# the interpreter (default python3).
#
# kilnd's CUDA compiles need nvJitLink 13: $KILN_NVJITLINK, else ldconfig's,
# else the CUDA toolkit's, else one from a pip wheel (nvidia-nvjitlink) in
# python3's site-packages.
set -euo pipefail
bundle=${1:?usage: run-on-gpu.sh BUNDLE.tar.xz tests|python|backend|pybench|bench|all [OUT_DIR]}
what=${2:-all}
out=${3:-${OUT:-$(mktemp -d)}}
here=$(cd "$(dirname "$0")/.." && pwd)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
tar -xJf "$bundle" -C "$work"
K=$work/kiln

if [[ -z ${KILN_NVJITLINK:-} ]]; then
  cand=$(ldconfig -p 2>/dev/null | awk '/libnvJitLink\.so\.13 /{print $NF; exit}')
  for d in /usr/local/cuda/lib64 /usr/local/cuda-13*/lib64; do
    [[ -z $cand && -e $d/libnvJitLink.so.13 ]] && cand=$d/libnvJitLink.so.13
  done
  if [[ -z $cand ]] && command -v python3 >/dev/null; then
    cand=$(python3 -c 'import site,glob,sys
for p in site.getsitepackages():
    for f in glob.glob(p + "/nvidia/**/libnvJitLink.so.13", recursive=True):
        print(f); sys.exit()' 2>/dev/null || true)
  fi
  [[ -n $cand ]] && export KILN_NVJITLINK=$cand
fi
echo "nvJitLink: ${KILN_NVJITLINK:-not found}"
export KILN_EXAMPLES_DIR=$K/share/kiln/examples/graphs
export KILN_LIBDEVICE=$K/share/kiln/libdevice.10.bc
export KILN_KILND=$K/bin/kilnd  # the daemon the Client tests start
export KILN_LIB=$K/lib/libkiln_c.so
# cuda_runtime_test's real-cubin case, when the build's cubin came along.
if [[ -z ${KILN_TEST_CUBIN:-} && -e $here/build/tests/unit/pointwise_sm90.cubin ]]; then
  export KILN_TEST_CUBIN=$here/build/tests/unit/pointwise_sm90.cubin
fi

status=0
if [[ $what == tests || $what == all ]]; then
  "$K/bin/cuda_runtime_test" || status=1
  "$K/bin/cuda_gpu_test" || status=1
fi
if [[ $what == python || $what == all ]]; then
  "${PYTHON:-python3}" "$K/share/kiln/tests/python_binding_test.py" || status=1
fi
if [[ $what == backend || $what == all ]]; then
  "${PYTHON:-python3}" "$here/tests/gpu/backend_gpu_test.py" || status=1
fi
if [[ $what == pybench ]]; then
  "${PYTHON:-python3}" "$here/bench/python/gpu_gemm.py" || status=1
  "${PYTHON:-python3}" "$here/bench/python/step_time.py" --device cuda || status=1
fi
if [[ $what == bench ]]; then
  KILN_CUDA_BENCH=$K/bin/cuda_bench "$here/bench/gpu/run.sh" "$out" || status=1
fi
exit $status
