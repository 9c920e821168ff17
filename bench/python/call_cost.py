"""Host cost of a compiled partition called from Python (issue 15 item 6),
on the CPU or (--device cuda) a GPU: torch.compile(backend=kiln) against eager and
against backend="aot_eager" (Dynamo + AOTAutograd, eager kernels: the
floor of any AOTAutograd backend), on a tiny
pointwise chain (the call overhead dominates) and on layer norm 4096x1024.
Kiln twice: through the CPython extension _kiln_call ("kiln-ext", the
default where it is built) and through ctypes ("kiln-ctypes", what
KILN_NO_EXTENSION=1 gives). "call" columns: the Kiln partition alone
(KilnPartition called with the same inputs, the FX/AOTAutograd wrappers
left out), the host cost a compiled partition adds on top of its kernels
plus the kernels. --clock=cpu measures the process's CPU time
(time.process_time: every thread's) instead of wall time, steadier on a
loaded machine. On CUDA each figure is "host/synced": the loop's wall time
per call before the final torch.cuda.synchronize() (what the host spends to
enqueue a call) and after it (kernels included); the chain's kernels are
tiny, so its synced figure is the host cost too. On CUDA also "kiln-cg"
(kiln.backend(cudagraphs=True)) and "inductor-cg" (mode="reduce-overhead"):
the whole graph replayed by PyTorch's CUDA graph trees. "kiln-ext-hit":
the same graph compiled again after torch._dynamo.reset(), from the AOT
cache (kiln/aot_cache.py: Kiln's own autograd.Function and inference
wrapper instead of AOTAutograd's runtime wrappers); the other kiln columns
compile without that cache.

    PY=$(bash deploy/python-env.sh)
    build/server/kilnd --listen=127.0.0.1:7799 --metrics_listen= &
    KILN_LIB=build/client/libkiln_c.so PYTHONPATH=python \\
      $PY bench/python/call_cost.py --server 127.0.0.1:7799 [--device cuda]
"""

import argparse
import os
import tempfile
import time

import torch

import kiln
from kiln import _binding, dynamo


CLOCK = time.perf_counter
CUDA = False


def per_call_us(fn, *args, iters=2000, warmup=50):
    """Best of 5 loops, microseconds per call; on CUDA "host/synced"."""
    for _ in range(warmup):
        fn(*args)
    best, best_host = float("inf"), float("inf")
    for _ in range(5):
        if CUDA:
            torch.cuda.synchronize()
        t0 = CLOCK()
        for _ in range(iters):
            fn(*args)
        t1 = CLOCK()
        if CUDA:
            torch.cuda.synchronize()
        t2 = CLOCK()
        best_host = min(best_host, (t1 - t0) / iters * 1e6)
        best = min(best, (t2 - t0) / iters * 1e6)
    return Timing(best_host, best) if CUDA else Timing(best, best)


class Timing(float):
    """A per-call time (synced); prints as host/synced on CUDA."""

    def __new__(cls, host, synced):
        t = super().__new__(cls, synced)
        t.host = host
        return t

    def __format__(self, spec):
        if not CUDA:
            return format(float(self), spec)
        return f"{self.host:.1f}/{float(self):.1f}".rjust(13)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--server", required=True)
    ap.add_argument("--clock", choices=("wall", "cpu"), default="wall")
    ap.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    ap.add_argument("--train", default="",
                    help="comma-separated train_ops.py cases: time each "
                    "partition of their training step alone instead")
    a = ap.parse_args()
    # A private AOT cache: the kiln-ext-hit column fills it first.
    os.environ["KILN_AOT_CACHE_DIR"] = tempfile.mkdtemp(prefix="kiln_aot_")
    global CLOCK, CUDA
    CLOCK = time.process_time if a.clock == "cpu" else time.perf_counter
    CUDA = a.device == "cuda"
    dev = torch.device(a.device)
    torch.set_num_threads(1)
    if a.train:
        train_partitions(a.train.split(","), dev, a.server)
        return

    def chain(x):
        return torch.tanh(x * 2 + 1).sigmoid()

    ln = torch.nn.LayerNorm(1024).eval().to(dev)
    cases = [("chain 8x16", chain, torch.randn(8, 16, device=dev), 2000),
             ("layer_norm 4096x1024", ln, torch.randn(4096, 1024, device=dev),
              100 if not CUDA else 1000)]
    have_ext = _binding.extension() is not None
    where = torch.cuda.get_device_name() if CUDA else "CPU"
    print(f"{where}, torch {torch.__version__}, 1 thread; microseconds per call (best "
          f"of 5, {a.clock} clock); extension "
          f"{'built' if have_ext else 'NOT built'}")
    with torch.no_grad():
        for name, fn, x, iters in cases:
            floor = torch.compile(fn, backend="aot_eager")
            eager = per_call_us(fn, x, iters=iters)
            floor_us = per_call_us(floor, x, iters=iters)
            row = f"{name:22s} eager {eager:8.1f}  aot_eager {floor_us:8.1f}"
            for path in ("ctypes", "ext"):
                if path == "ext" and not have_ext:
                    continue
                compiled, parts = compile_kiln(fn, x, a.server,
                                               ext=path == "ext")
                total = per_call_us(compiled, x, iters=iters)
                # The partition alone, on the inputs the FX module passes it
                # (the forward graph of an inference call takes x, params).
                call = sum(per_call_us(p, *p_args, iters=iters)
                           for p, p_args in parts)
                row += (f"  kiln-{path} {total:8.1f} (call {call:6.1f}, "
                        f"{len(parts)} partition(s))")
            if have_ext:
                for _ in range(2):  # the first stores, the second hits
                    torch._dynamo.reset()
                    hit, _ = compile_kiln(fn, x, a.server, ext=True,
                                          aot_cache=True)
                row += f"  kiln-ext-hit {per_call_us(hit, x, iters=iters):8.1f}"
            if CUDA:  # whole graphs replayed: CUDA graph trees
                cg = torch.compile(fn, backend=kiln.backend(
                    server=a.server, fallback="error", cudagraphs=True))
                ind = torch.compile(fn, mode="reduce-overhead")
                row += (f"  kiln-cg {per_call_us(cg, x, iters=iters):8.1f}"
                        f"  inductor-cg {per_call_us(ind, x, iters=iters):8.1f}")
            print(row)


def train_partitions(names, dev, server):
    """Per partition of each train_ops.py case's training step (forward,
    loss, backward): its host/synced time per call alone, and per call the
    kernels and memory copies/sets it runs and the blocks it allocates from
    PyTorch's allocator (where the host time goes)."""
    from torch.autograd import DeviceType  # noqa: PLC0415
    from torch.profiler import ProfilerActivity, profile  # noqa: PLC0415

    from train_ops import cases  # noqa: PLC0415

    where = torch.cuda.get_device_name() if CUDA else "CPU"
    print(f"{where}, torch {torch.__version__}; per partition call: "
          "microseconds (best of 5), GPU activities, allocations")
    for name, module, inputs in cases(str(dev), CUDA):
        if name not in names:
            continue
        torch._dynamo.reset()
        compiled, parts = compile_kiln(
            module, None, server, ext=True,
            run=lambda c, inputs=inputs: c(*inputs).backward())
        for i, (p, p_args) in enumerate(parts):
            us = per_call_us(p, *p_args, iters=200, warmup=20)
            allocs = 0
            if CUDA:
                before = torch.cuda.memory_stats()["allocation.all.allocated"]
                p(*p_args)
                allocs = (torch.cuda.memory_stats()["allocation.all.allocated"]
                          - before)
            with profile(activities=[ProfilerActivity.CPU] +
                         ([ProfilerActivity.CUDA] if CUDA else [])) as prof:
                p(*p_args)
                if CUDA:
                    torch.cuda.synchronize()
            gpu = [e.name for e in prof.events()
                   if e.device_type == DeviceType.CUDA]
            print(f"{name:12s} partition {i} ({len(p_args)} args): {us}  "
                  f"{len(gpu)} GPU activities, {allocs} allocations")


def compile_kiln(fn, x, server, ext, run=None, aot_cache=False, options=None):
    """torch.compile(fn, backend=kiln) through the extension or ctypes
    (with or without the AOT cache; `options`: more kiln.backend
    arguments), first called as run(compiled) (default: on x, checked
    against eager); returns it and [(partition, its first arguments)] of
    its compiled partitions."""
    saved = _binding._ext
    parts = []
    init = dynamo.KilnPartition.__init__
    forward = dynamo.KilnPartition.__call__

    def record(self, *args, **kwargs):
        init(self, *args, **kwargs)
        parts.append([self, None])

    def spy(self, *args):
        for p in parts:
            if p[0] is self and p[1] is None:
                p[1] = args
        return forward(self, *args)

    try:
        if not ext:
            _binding._ext = False  # as KILN_NO_EXTENSION=1
        dynamo.KilnPartition.__init__ = record
        dynamo.KilnPartition.__call__ = spy
        backend = kiln.backend(server=server, fallback="error",
                               aot_cache=aot_cache, **(options or {}))
        compiled = torch.compile(fn, backend=backend)
        if run is not None:
            run(compiled)
        else:
            torch.testing.assert_close(compiled(x), fn(x), atol=1e-4,
                                       rtol=1e-4)
    finally:
        _binding._ext = saved
        dynamo.KilnPartition.__init__ = init
        dynamo.KilnPartition.__call__ = forward
    assert all((p._fast is not None) == ext for p, _ in parts)
    return compiled, [tuple(p) for p in parts]


if __name__ == "__main__":
    main()
