#!/usr/bin/env bash
# Runs Kiln's GPU tests and benchmarks from the relocatable bundle on a GPU
# machine that has none of the build's dependencies (an NVIDIA driver,
# glibc >= 2.36 and, for bench and python, python3 with torch):
#
#   make bundle BUNDLE_EXTRA="build/tests/gpu/cuda_gpu_test build/bench/gpu/cuda_bench build/tests/unit/cuda_runtime_test"
#   deploy/run-on-gpu.sh build-bundle/kiln-linux-x86_64.tar.xz tests|python|backend|pybench|coverage|callcost|compilebench|attention|trainops|profile|gemm|realmodels|idioms|steptime|inputwrites|convblock|mlpblock|epiloguecost|halfpointwise|bench|all [OUT_DIR]
#
# tests: cuda_runtime_test and cuda_gpu_test (its Client test starts the
# bundle's kilnd); python: the Python binding with PyTorch
# (kiln/share/kiln/tests/python_binding_test.py, both allocators);
# backend: the model suite through torch.compile(backend=kiln) on the GPU
# (tests/gpu/backend_gpu_test.py, $BACKEND_ARGS passed on, e.g. "--models
# blocked-cumsum"); pybench: bench/python/gpu_gemm.py and
# step_time.py --device cuda; coverage: bench/python/coverage.py --device
# cuda over the suite and bench/python/zoo.py; callcost:
# bench/python/call_cost.py --device cuda against the bundle's kilnd
# ($CALLCOST_ARGS passed on, e.g. "--train group_norm");
# attention: bench/python/attention.py --device cuda ($ATTN_ARGS); trainops:
# bench/python/train_ops.py --device cuda ($TRAINOPS_ARGS, e.g. --recompute); profile:
# bench/python/kernel_profile.py --timeline ($PROFILE_ARGS passed on, e.g.
# "--case group_norm"); gemm: bench/python/gpu_gemm.py
# alone ($GEMM_ARGS passed on); realmodels: bench/python/real_models.py
# --device cuda ($REAL_ARGS; libraries from $KILN_REAL_MODELS_DIR or the
# tarball $KILN_REAL_MODELS_TAR); step: bench/python/model_step.py --device
# cuda ($STEP_ARGS passed on, e.g. "tv_resnet18 --profile 25"); convblock:
# bench/python/conv_block.py --device cuda ($CONV_ARGS); mlpblock:
# bench/python/mlp_block.py --device cuda ($MLP_ARGS); epiloguecost:
# bench/python/epilogue_cost.py ($EPI_ARGS); halfpointwise:
# bench/gpu/half_pointwise.sh ($HALF_ARGS); optimizer:
# bench/python/optimizer_step.py --device cuda ($OPT_ARGS); all:
# tests, python and backend. $PYTHON names the interpreter (default python3).
# The extension _kiln_call is built for $PYTHON on first use when the bundle's
# was built for another Python (kiln/_ext_build.py; needs cc and Python.h).
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
# Convolutions run cuDNN 9 (runtime/cuda_cudnn.h): $KILN_CUDNN, else
# ldconfig's, else the CUDA toolkit's, else PyTorch's wheel (nvidia-cudnn)
# in python3's site-packages. A process that imported torch finds torch's.
if [[ -z ${KILN_CUDNN:-} ]] && ! ldconfig -p 2>/dev/null | grep -q 'libcudnn\.so\.9 '; then
  cand=
  for d in /usr/local/cuda/lib64 /usr/local/cuda-1*/lib64; do
    [[ -z $cand && -e $d/libcudnn.so.9 ]] && cand=$d/libcudnn.so.9
  done
  if [[ -z $cand ]] && command -v python3 >/dev/null; then
    cand=$(python3 -c 'import site,glob,sys
for p in site.getsitepackages():
    for f in glob.glob(p + "/nvidia/**/libcudnn.so.9", recursive=True):
        print(f); sys.exit()' 2>/dev/null || true)
  fi
  [[ -n $cand ]] && export KILN_CUDNN=$cand
fi
echo "cuDNN: ${KILN_CUDNN:-by soname}"
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
  "${PYTHON:-python3}" "$here/tests/gpu/backend_gpu_test.py" ${BACKEND_ARGS:-} || status=1
fi
if [[ $what == pybench ]]; then
  "${PYTHON:-python3}" "$here/bench/python/gpu_gemm.py" || status=1
  "${PYTHON:-python3}" "$here/bench/python/step_time.py" --device cuda || status=1
fi
if [[ $what == steptime ]]; then
  # bench/python/step_time.py --device cuda alone ($STEPTIME_ARGS passed on).
  # shellcheck disable=SC2086
  "${PYTHON:-python3}" "$here/bench/python/step_time.py" --device cuda ${STEPTIME_ARGS:-} || status=1
fi
if [[ $what == coverage ]]; then
  (cd "$here/bench/python" && "${PYTHON:-python3}" coverage.py --device cuda \
     $(sed -n 's/^ALL = \[\(.*\)\]/\1/p' zoo.py | tr -d '",' | sed 's/[^ ]\+/zoo:&/g')) || status=1
fi
if [[ $what == callcost ]]; then
  "$K/bin/kilnd" --listen=127.0.0.1:0 --metrics_listen= --port_file="$work/port" \
    --data_dir="$work/data" >"$work/kilnd.log" 2>&1 &
  for _ in $(seq 100); do [[ -s $work/port ]] && break; sleep 0.1; done
  PYTHONPATH=$here/python "${PYTHON:-python3}" "$here/bench/python/call_cost.py" --device cuda \
    --server "127.0.0.1:$(head -1 "$work/port")" ${CALLCOST_ARGS:-} || status=1
  kill %1 || true
fi
if [[ $what == compilebench ]]; then
  # compile_bench (a bundle --extra) once per thread setting in
  # $COMPILE_THREADS (default "1 0": one module, every core), for both back
  # ends' KILN_*_COMPILE_THREADS ($COMPILE_ARGS passed on, e.g. graphs in
  # KILN_BENCH_GRAPHS and --benchmark_filter).
  for t in ${COMPILE_THREADS:-1 0}; do
    echo "== KILN_CUDA_COMPILE_THREADS=$t KILN_CPU_COMPILE_THREADS=$t"
    # shellcheck disable=SC2086
    KILN_CUDA_COMPILE_THREADS=$t KILN_CPU_COMPILE_THREADS=$t \
      "$K/bin/compile_bench" ${COMPILE_ARGS:-} || status=1
  done
fi
# realmodels and step take their models' libraries from
# $KILN_REAL_MODELS_DIR, or a tarball of that directory
# ($KILN_REAL_MODELS_TAR, unpacked here).
if [[ ($what == realmodels || $what == step) && -n ${KILN_REAL_MODELS_TAR:-} ]]; then
  mkdir -p "$work/real-models"
  tar -xJf "$KILN_REAL_MODELS_TAR" -C "$work/real-models"
  export KILN_REAL_MODELS_DIR=$work/real-models
fi
if [[ $what == realmodels ]]; then
  # bench/python/real_models.py --device cuda ($REAL_ARGS passed on).
  # shellcheck disable=SC2086
  "${PYTHON:-python3}" "$here/bench/python/real_models.py" --device cuda ${REAL_ARGS:-} || status=1
fi
if [[ $what == idioms ]]; then
  # bench/python/idioms.py --device cuda ($IDIOM_ARGS passed on).
  # shellcheck disable=SC2086
  "${PYTHON:-python3}" "$here/bench/python/idioms.py" --device cuda ${IDIOM_ARGS:-} || status=1
fi
if [[ $what == convblock ]]; then
  # bench/python/conv_block.py --device cuda ($CONV_ARGS passed on).
  # shellcheck disable=SC2086
  "${PYTHON:-python3}" "$here/bench/python/conv_block.py" --device cuda ${CONV_ARGS:-} || status=1
fi
if [[ $what == mlpblock ]]; then
  # bench/python/mlp_block.py --device cuda ($MLP_ARGS passed on).
  # shellcheck disable=SC2086
  "${PYTHON:-python3}" "$here/bench/python/mlp_block.py" --device cuda ${MLP_ARGS:-} || status=1
fi
if [[ $what == halfpointwise ]]; then
  # bench/gpu/half_pointwise.sh ($HALF_ARGS passed on: ROWS COLS DTYPE); the
  # bundle must carry cuda_bench (bundle.sh --extra).
  # shellcheck disable=SC2086
  KILN=$K "$here/bench/gpu/half_pointwise.sh" ${HALF_ARGS:-} || status=1
fi
if [[ $what == epiloguecost ]]; then
  # bench/python/epilogue_cost.py ($EPI_ARGS passed on): the host cost of
  # one linear layer with and without cuBLASLt's epilogues.
  # shellcheck disable=SC2086
  "${PYTHON:-python3}" "$here/bench/python/epilogue_cost.py" ${EPI_ARGS:-} || status=1
fi
if [[ $what == step ]]; then
  # bench/python/model_step.py --device cuda ($STEP_ARGS passed on: one
  # model's step time on one backend, --profile N for its costliest kernels).
  # shellcheck disable=SC2086
  "${PYTHON:-python3}" "$here/bench/python/model_step.py" --device cuda ${STEP_ARGS:-} || status=1
fi
if [[ $what == inputwrites ]]; then
  # bench/python/input_writes.py --device cuda ($WRITES_ARGS passed on).
  # shellcheck disable=SC2086
  "${PYTHON:-python3}" "$here/bench/python/input_writes.py" --device cuda ${WRITES_ARGS:-} || status=1
fi
if [[ $what == optimizer ]]; then
  # bench/python/optimizer_step.py --device cuda ($OPT_ARGS passed on).
  # shellcheck disable=SC2086
  "${PYTHON:-python3}" "$here/bench/python/optimizer_step.py" --device cuda ${OPT_ARGS:-} || status=1
fi
if [[ $what == attention ]]; then
  # shellcheck disable=SC2086
  "${PYTHON:-python3}" "$here/bench/python/attention.py" --device cuda ${ATTN_ARGS:-} || status=1
fi
if [[ $what == trainops ]]; then
  # shellcheck disable=SC2086
  "${PYTHON:-python3}" "$here/bench/python/train_ops.py" --device cuda ${TRAINOPS_ARGS:-} || status=1
fi
if [[ $what == profile ]]; then
  # shellcheck disable=SC2086
  "${PYTHON:-python3}" "$here/bench/python/kernel_profile.py" --timeline ${PROFILE_ARGS:-} || status=1
fi
if [[ $what == gemm ]]; then
  # shellcheck disable=SC2086
  "${PYTHON:-python3}" "$here/bench/python/gpu_gemm.py" ${GEMM_ARGS:-} || status=1
fi
if [[ $what == bench ]]; then
  KILN_CUDA_BENCH=$K/bin/cuda_bench "$here/bench/gpu/run.sh" "$out" || status=1
fi
exit $status
