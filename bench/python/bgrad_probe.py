"""Which layouts and dtypes cuBLASLt's bias-gradient epilogues (BGRADA,
BGRADB) take on this GPU and library, whether their sums are right, and
what they cost against the same product without the epilogue plus
torch.sum (the decision behind compiler/gemm_epilogue.h's bias gradients):

    $PY bench/python/bgrad_probe.py [--m 768 --n 3072 --k 8192]

Column-major, in cuBLASLt's terms: D (M x N) = op(A) @ op(B);
BGRADA writes bias[i] = sum_p op(A)[i, p] (M elements), BGRADB bias[j] =
sum_p op(B)[p, j] (N elements). Each row: dtype, transa, transb,
epilogue, bias dtype, algorithms the heuristic returned, the largest
error of D and of the bias against float64, and microseconds per call of
plain / with the epilogue / plain + torch.sum (median of --iters).
"""

from __future__ import annotations

import argparse
import ctypes
import statistics

import torch

R_32F, R_16F, R_16BF = 0, 2, 14
COMPUTE_32F = 68
DESC_TRANSA, DESC_TRANSB, DESC_EPILOGUE = 3, 4, 7
DESC_BIAS_POINTER, DESC_BIAS_DATA_TYPE = 8, 26
PREF_MAX_WORKSPACE = 1
OP_N, OP_T = 0, 1
EPI_DEFAULT, EPI_BGRADA, EPI_BGRADB = 1, 256, 512
TYPES = {torch.float32: R_32F, torch.float16: R_16F, torch.bfloat16: R_16BF}


class Heuristic(ctypes.Structure):
    _fields_ = [("algo", ctypes.c_uint64 * 8), ("workspace", ctypes.c_size_t),
                ("state", ctypes.c_int), ("waves", ctypes.c_float),
                ("reserved", ctypes.c_int * 4)]


def load() -> ctypes.CDLL:
    for name in ("libcublasLt.so.13", "libcublasLt.so.12", "libcublasLt.so"):
        try:
            return ctypes.CDLL(name)
        except OSError:
            pass
    raise SystemExit("no libcublasLt")


LT = load()
V = ctypes.c_void_p
P = ctypes.POINTER
_S = ctypes.c_size_t
for _name, _args in {
        "cublasLtCreate": [P(V)],
        "cublasLtMatmulDescCreate": [P(V), ctypes.c_int, ctypes.c_int],
        "cublasLtMatmulDescSetAttribute": [V, ctypes.c_int, V, _S],
        "cublasLtMatrixLayoutCreate": [P(V), ctypes.c_int, ctypes.c_uint64,
                                       ctypes.c_uint64, ctypes.c_int64],
        "cublasLtMatmulPreferenceCreate": [P(V)],
        "cublasLtMatmulPreferenceSetAttribute": [V, ctypes.c_int, V, _S],
        "cublasLtMatmulAlgoGetHeuristic": [V, V, V, V, V, V, V, ctypes.c_int,
                                           V, P(ctypes.c_int)],
        "cublasLtMatmul": [V, V, V, V, V, V, V, V, V, V, V, V, V, V, _S, V],
}.items():
    getattr(LT, _name).argtypes = _args
    getattr(LT, _name).restype = ctypes.c_int
LT.cublasLtGetVersion.restype = ctypes.c_size_t


def check(status: int, what: str) -> None:
    if status != 0:
        raise RuntimeError(f"{what}: cublas status {status}")


def set_attr(desc: V, attr: int, value: ctypes._SimpleCData) -> None:
    check(LT.cublasLtMatmulDescSetAttribute(
        desc, attr, ctypes.addressof(value),
        ctypes.sizeof(value)), f"attr {attr}")


def layout(dtype: int, rows: int, cols: int) -> V:
    lay = V()
    check(LT.cublasLtMatrixLayoutCreate(ctypes.byref(lay), dtype,
                                        ctypes.c_uint64(rows),
                                        ctypes.c_uint64(cols),
                                        ctypes.c_int64(rows)), "layout")
    return lay


def median_us(fn, iters: int) -> float:
    """Median of `iters` CUDA-event timings of fn(), microseconds."""
    times = []
    for _ in range(iters):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(
            enable_timing=True)
        s.record()
        fn()
        e.record()
        torch.cuda.synchronize()
        times.append(s.elapsed_time(e) * 1e3)
    return statistics.median(times)


def run(handle: V, dt: torch.dtype, ta: int, tb: int, epi: int,
        bias_dt: torch.dtype, M: int, N: int, K: int, iters: int,
        ws: torch.Tensor) -> str:
    dev = "cuda"
    # Column-major storage: a matrix rows x cols is a torch tensor
    # (cols, rows) row-major.
    a_rows, a_cols = (M, K) if ta == OP_N else (K, M)
    b_rows, b_cols = (K, N) if tb == OP_N else (N, K)
    A = torch.randn(a_cols, a_rows, device=dev).to(dt)
    B = torch.randn(b_cols, b_rows, device=dev).to(dt)
    D = torch.empty(N, M, device=dev, dtype=dt)
    nb = M if epi == EPI_BGRADA else N
    bias = torch.full((nb,), float("nan"), device=dev, dtype=bias_dt)
    desc = V()
    check(LT.cublasLtMatmulDescCreate(ctypes.byref(desc), COMPUTE_32F, R_32F),
          "desc")
    set_attr(desc, DESC_TRANSA, ctypes.c_int32(ta))
    set_attr(desc, DESC_TRANSB, ctypes.c_int32(tb))
    set_attr(desc, DESC_EPILOGUE, ctypes.c_uint32(epi))
    if epi != EPI_DEFAULT:
        set_attr(desc, DESC_BIAS_POINTER, ctypes.c_void_p(bias.data_ptr()))
        set_attr(desc, DESC_BIAS_DATA_TYPE, ctypes.c_int32(TYPES[bias_dt]))
    t = TYPES[dt]
    la, lb, ld = layout(t, a_rows, a_cols), layout(t, b_rows, b_cols), \
        layout(t, M, N)
    pref = V()
    check(LT.cublasLtMatmulPreferenceCreate(ctypes.byref(pref)), "pref")
    wsb = ctypes.c_size_t(ws.numel())
    check(LT.cublasLtMatmulPreferenceSetAttribute(
        pref, PREF_MAX_WORKSPACE, ctypes.addressof(wsb),
        ctypes.sizeof(wsb)), "ws")
    results = (Heuristic * 8)()
    count = ctypes.c_int(0)
    st = LT.cublasLtMatmulAlgoGetHeuristic(handle, desc, la, lb, ld, ld, pref,
                                           8, ctypes.cast(results, V),
                                           ctypes.byref(count))
    if st != 0 or count.value == 0:
        return f"no algorithm (status {st}, {count.value})"
    alpha, beta = ctypes.c_float(1.0), ctypes.c_float(0.0)
    stream = V(torch.cuda.current_stream().cuda_stream)

    def call() -> None:
        check(LT.cublasLtMatmul(handle, desc,
                                ctypes.addressof(alpha),
                                V(A.data_ptr()), la, V(B.data_ptr()), lb,
                                ctypes.addressof(beta),
                                V(D.data_ptr()), ld, V(D.data_ptr()), ld,
                                ctypes.addressof(results[0].algo),
                                V(ws.data_ptr()),
                                ctypes.c_size_t(ws.numel()), stream), "matmul")

    call()
    torch.cuda.synchronize()
    opA = A.double().t() if ta == OP_N else A.double()  # M x K
    opB = B.double().t() if tb == OP_N else B.double()  # K x N
    want = opA @ opB
    d_err = ((D.double().t() - want).abs().max() /
             want.abs().max().clamp_min(1e-30)).item()
    b_err = float("nan")
    if epi != EPI_DEFAULT:
        wb = opA.sum(1) if epi == EPI_BGRADA else opB.sum(0)
        b_err = ((bias.double() - wb).abs().max() /
                 wb.abs().max().clamp_min(1e-30)).item()
    return (f"algos {count.value} D err {d_err:.1e} bias err {b_err:.1e} "
            f"{median_us(call, iters):.1f} us")


def torch_row(dt: torch.dtype, M: int, N: int, K: int, iters: int) -> str:
    # Kiln's weight gradient: grad_w = g^T @ x, grad_b = g.sum(0).
    g = torch.randn(K, M, device="cuda").to(dt)
    x = torch.randn(K, N, device="cuda").to(dt)
    rows = []
    for what, f in (("mm", lambda: g.t() @ x),
                     ("mm+sum", lambda: (g.t() @ x, g.sum(0)))):
        f()
        rows.append(f"{what} {median_us(f, iters):.1f} us")
    return ", ".join(rows)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--m", type=int, default=768)
    ap.add_argument("--n", type=int, default=3072)
    ap.add_argument("--k", type=int, default=8192)
    ap.add_argument("--iters", type=int, default=21)
    a = ap.parse_args()
    torch.cuda.init()
    torch.zeros(1, device="cuda") @ torch.zeros(1, device="cuda")
    handle = V()
    check(LT.cublasLtCreate(ctypes.byref(handle)), "create")
    ws = torch.empty(32 << 20, dtype=torch.uint8, device="cuda")
    print(f"cuBLASLt {LT.cublasLtGetVersion()}, {torch.cuda.get_device_name()}"
          f", M {a.m} N {a.n} K {a.k}")
    ops = {OP_N: "N", OP_T: "T"}
    epis = {EPI_DEFAULT: "plain", EPI_BGRADA: "BGRADA", EPI_BGRADB: "BGRADB"}
    for dt in (torch.float32, torch.float16, torch.bfloat16):
        print(f"torch {str(dt)[6:]}: {torch_row(dt, a.m, a.n, a.k, a.iters)}")
        for ta in (OP_N, OP_T):
            for tb in (OP_N, OP_T):
                for epi in (EPI_DEFAULT, EPI_BGRADA, EPI_BGRADB):
                    bias_dts = [dt] if epi == EPI_DEFAULT or dt == \
                        torch.float32 else [dt, torch.float32]
                    for bdt in bias_dts:
                        try:
                            r = run(handle, dt, ta, tb, epi, bdt, a.m, a.n,
                                    a.k, a.iters, ws)
                        except RuntimeError as e:
                            r = f"error {e}"
                        print(f"  {str(dt)[6:]:8} {ops[ta]}{ops[tb]} "
                              f"{epis[epi]:6} bias {str(bdt)[6:]:8} {r}",
                              flush=True)


if __name__ == "__main__":
    main()
