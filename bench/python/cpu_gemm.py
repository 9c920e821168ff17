"""CPU matrix products through Kiln's extern GEMM call (issue 16) against
eager PyTorch, side by side in one run, on 2 threads:

  * sgemm 1024^3: torch.mm eagerly, and a Kiln partition that is one
    extern call into the CPU runtime's BLAS (PyTorch's MKL by default in a
    PyTorch process, oneDNN's sgemm with KILN_TORCH_MKL=0, OpenBLAS with
    KILN_BLAS=libopenblas.so.0: runtime/cpu_blas.h), and
    the same with the reference BLAS (KILN_BLAS=<path>) to show why
    OpenBLAS is the default;
  * an MLP block (LayerNorm, Linear 1024->4096, GELU, Linear 4096->1024,
    residual) forward + backward on 256 tokens: eager, Kiln and, with
    --inductor, Inductor.

    PY=$(bash deploy/python-env.sh)
    build/server/kilnd --listen=127.0.0.1:7799 --metrics_listen= &
    OPENBLAS_NUM_THREADS=2 KILN_LIB=build/client/libkiln_c.so PYTHONPATH=python \\
      $PY bench/python/cpu_gemm.py --server 127.0.0.1:7799 [--inductor]
    $PY bench/python/cpu_gemm.py --server 127.0.0.1:7799 --shapes

--shapes times only the products of real models' steps (SHAPES), with
Kiln on PyTorch's MKL, on oneDNN and on OpenBLAS, each in a process of its
own. With --dtype bfloat16 the products are bfloat16 (torch.mm's oneDNN
kernel eagerly): Kiln with the runtime's default (the library's bfloat16
GEMM with AMX or below 2^26 multiply-adds, else widened:
CpuBlas::LibraryBf16Gemm), through MKL's and oneDNN's bfloat16 GEMMs
(KILN_ONEDNN_BF16=1) into a float32 C rounded by one kernel, and with
KILN_ONEDNN_BF16=0 (operands widened to float32 by the runtime, then
sgemm).

Times are the median of --repeats runs after warm-up; GFLOP/s counts
2*m*n*k per product.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time

import torch

import kiln

REF_BLAS = "/usr/lib/x86_64-linux-gnu/blas/libblas.so.3"


def median_ms(fn, *args, repeats=7, warmup=2, inner=1):
    for _ in range(warmup):
        fn(*args)
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        for _ in range(inner):
            fn(*args)
        times.append((time.perf_counter() - t0) / inner * 1e3)
    return statistics.median(times)


def gemm_row(server: str, n: int, label: str) -> str:
    a, b = torch.randn(n, n), torch.randn(n, n)
    backend = kiln.backend(server=server, fallback="error")
    mm = torch.compile(lambda x, y: x @ y, backend=backend)
    torch.testing.assert_close(mm(a, b), a @ b, rtol=1e-4, atol=1e-3)
    flops = 2 * n ** 3
    kiln_ms = median_ms(mm, a, b)
    eager_ms = median_ms(torch.mm, a, b)
    return (f"sgemm {n}^3        eager {eager_ms:8.2f} ms "
            f"({flops / eager_ms / 1e6:6.1f} GFLOP/s)   kiln[{label}] "
            f"{kiln_ms:8.2f} ms ({flops / kiln_ms / 1e6:6.1f} GFLOP/s)  "
            f"kiln/eager {eager_ms / kiln_ms:5.2f}x")


# Products of real models' training steps (m, n, k, A transposed, B
# transposed): timm ViT-tiny at 8 images of 64x64 (136 tokens, width 192,
# MLP 768: its forward product and two backward ones), BERT-base at 512
# tokens (a projection and the MLP's first layer), the small BERT of
# real_models.py (width 64), and 1024^3.
SHAPES = [(136, 768, 192, False, True), (136, 192, 768, False, True),
          (192, 768, 136, True, False), (512, 768, 768, False, True),
          (512, 3072, 768, False, True), (512, 64, 64, False, True),
          (1024, 1024, 1024, False, False)]


def shape_rows(server: str, label: str,
               dtype: torch.dtype = torch.float32) -> list:
    """torch.mm against a Kiln partition of one product, per SHAPES."""
    backend = kiln.backend(server=server, fallback="error")
    rows = []
    tol = (dict(rtol=1e-4, atol=1e-3) if dtype == torch.float32
           else dict(rtol=2e-2, atol=2e-1))
    for m, n, k, ta, tb in SHAPES:
        a = torch.randn(k, m).t() if ta else torch.randn(m, k)
        b = torch.randn(n, k).t() if tb else torch.randn(k, n)
        a, b = a.to(dtype), b.to(dtype)
        mm = torch.compile(lambda x, y: x @ y, backend=backend, dynamic=False)
        torch.testing.assert_close(mm(a, b), a @ b, **tol)
        inner = max(3, int(3e8 / (m * n * k)))
        eager_ms = median_ms(torch.mm, a, b, inner=inner)
        kiln_ms = median_ms(mm, a, b, inner=inner)
        gf = 2 * m * n * k / 1e6
        rows.append(f"{m}x{n}x{k}{' A^T' if ta else ''}{' B^T' if tb else ''}"
                    f"  eager {eager_ms * 1e3:8.1f} us ({gf / eager_ms:5.0f} "
                    f"GFLOP/s)  kiln[{label}] {kiln_ms * 1e3:8.1f} us "
                    f"({gf / kiln_ms:5.0f} GFLOP/s)  kiln/eager "
                    f"{eager_ms / kiln_ms:4.2f}x")
        torch._dynamo.reset()
    return rows


class MLPBlock(torch.nn.Module):
    def __init__(self, d: int = 1024, hidden: int = 4096) -> None:
        super().__init__()
        self.ln = torch.nn.LayerNorm(d)
        self.fc1 = torch.nn.Linear(d, hidden)
        self.fc2 = torch.nn.Linear(hidden, d)

    def forward(self, x):
        return x + self.fc2(torch.nn.functional.gelu(self.fc1(self.ln(x))))


def step(model, x):
    model.zero_grad(set_to_none=True)
    model(x).sum().backward()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--server", required=True)
    ap.add_argument("--n", type=int, default=1024)
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--inductor", action="store_true")
    ap.add_argument("--shapes", action="store_true",
                    help="only the products of SHAPES, on the default BLAS "
                    "and on OpenBLAS (KILN_BLAS=libopenblas.so.0)")
    ap.add_argument("--dtype", default="float32",
                    choices=["float32", "bfloat16"],
                    help="of --shapes' products")
    ap.add_argument("--gemm-only", help=argparse.SUPPRESS)  # child: a label
    ap.add_argument("--shapes-only", help=argparse.SUPPRESS)  # child: a label
    a = ap.parse_args()
    torch.set_num_threads(2)
    if a.gemm_only:
        print(gemm_row(a.server, a.n, a.gemm_only))
        return
    dtype = getattr(torch, a.dtype)
    if a.shapes_only:
        print("\n".join(shape_rows(a.server, a.shapes_only, dtype)))
        return
    if a.shapes:
        # Each library in a process of its own (chosen once per process),
        # one after the other.
        runs = ([("mkl", {}), ("onednn", {"KILN_TORCH_MKL": "0"}),
                 ("openblas", {"KILN_BLAS": "libopenblas.so.0"})]
                if dtype == torch.float32 else
                [("default", {}),
                 ("mkl-bf16", {"KILN_ONEDNN_BF16": "1"}),
                 ("onednn-bf16",
                  {"KILN_TORCH_MKL": "0", "KILN_ONEDNN_BF16": "1"}),
                 ("widened", {"KILN_ONEDNN_BF16": "0"})])
        for label, env in runs:
            out = subprocess.run(
                [sys.executable, __file__, "--server", a.server,
                 "--dtype", a.dtype, "--shapes-only", label],
                env=dict(os.environ, **env),
                capture_output=True, text=True, check=True)
            print(out.stdout.strip())
        return
    print(f"torch {torch.__version__}, 2 threads, "
          f"OPENBLAS_NUM_THREADS={os.environ.get('OPENBLAS_NUM_THREADS', '-')}")
    print(gemm_row(a.server, a.n, "default"))
    if os.path.exists(REF_BLAS):
        # The reference BLAS, in a process of its own (the library is
        # chosen once per process).
        env = dict(os.environ, KILN_BLAS=REF_BLAS)
        out = subprocess.run(
            [sys.executable, __file__, "--server", a.server, "--n", "512",
             "--gemm-only", "refblas"], env=env, capture_output=True,
            text=True, check=True)
        print(out.stdout.strip(), "(n=512: the reference BLAS is slow)")
        print(gemm_row(a.server, 512, "default"))

    torch.manual_seed(0)
    x = torch.randn(256, 1024, requires_grad=False)
    rows = []
    for name in ["eager", "kiln"] + (["inductor"] if a.inductor else []):
        model = MLPBlock()
        if name == "kiln":
            model = torch.compile(model, backend=kiln.backend(
                server=a.server, fallback="error"))
        elif name == "inductor":
            model = torch.compile(model)
        rows.append((name, median_ms(step, model, x, repeats=a.repeats)))
    base = rows[0][1]
    print("MLP block 256x1024 (hidden 4096) fwd+bwd: " + "   ".join(
        f"{n} {ms:7.2f} ms ({base / ms:4.2f}x eager)" for n, ms in rows))


if __name__ == "__main__":
    main()
