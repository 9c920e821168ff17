"""The fast call path (issue 15 item 6): the CPython extension _kiln_call
(python/ext/kiln_call.c) against the ctypes path and eager on the CPU:
strided and offset inputs, outputs that are inputs come back as the same
objects, dynamic sizes, several threads, the C API's errors unchanged, and
KILN_NO_EXTENSION=1 (the ctypes fallback). See conftest.py for how it runs.
"""

from __future__ import annotations

import gc
import os
import pathlib
import subprocess
import sys
import threading
import weakref

import pytest
import torch

import kiln
from kiln import _binding, dynamo
from conftest import PYTHON_DIR, ROOT

torch.manual_seed(0)

GRAPH = (ROOT / "examples" / "graphs" / "dynamic_batch.json").read_text()


def extension_built() -> bool:
    lib = pathlib.Path(os.environ["KILN_LIB"])
    lib_dir = lib if lib.is_dir() else lib.parent
    return any(lib_dir.glob("_kiln_call*.so"))


needs_extension = pytest.mark.skipif(
    not extension_built() or os.environ.get("KILN_NO_EXTENSION"),
    reason="_kiln_call not built next to libkiln_c.so (python3-dev missing)")


def reference(x, scale):
    return torch.tanh(x * scale + 1).mean(dim=1)


def test_extension_loads_where_it_is_built():
    """Built next to the library means used: the package must not silently
    fall back to ctypes (that would hide a broken extension)."""
    if os.environ.get("KILN_NO_EXTENSION"):
        assert _binding.extension() is None
    else:
        assert (_binding.extension() is not None) == extension_built()


@needs_extension
def test_call_path_results_and_aliases(daemon):
    exe = kiln.Client(daemon.address).cpu_executable(GRAPH)
    # args: (x, a non-tensor, scale); Kiln inputs are args 0 and 2; results:
    # the Kiln output, x itself, the Kiln output again, scale itself.
    call = exe.call_path([0, 2], [("kiln", 0), ("input", 0), ("kiln", 0),
                                  ("input", 2)])
    x, scale = torch.randn(5, 16), torch.randn(16)
    out = call(x, "not a tensor", scale)
    assert isinstance(out, tuple) and len(out) == 4
    assert out[1] is x and out[3] is scale
    assert out[0] is out[2]
    torch.testing.assert_close(out[0], reference(x, scale))
    assert out[0].is_contiguous() and out[0].dtype == torch.float32
    # One entry, not a tuple; static sizes given (no per-call size query).
    single = exe.call_path([0, 1], [("kiln", 0)], tuple_output=False,
                           static_sizes=[(5,)])
    y = single(x, scale)
    assert isinstance(y, torch.Tensor)
    torch.testing.assert_close(y, reference(x, scale))
    # __call__ goes through the extension too, and returns a list.
    (z,) = exe(x, scale)
    torch.testing.assert_close(z, reference(x, scale))
    # A call path keeps its executable alive; __call__'s cached one does
    # not keep it from being freed.
    ref = weakref.ref(exe)
    del exe
    gc.collect()
    assert ref() is not None
    torch.testing.assert_close(single(x, scale), reference(x, scale))
    del call, single
    gc.collect()
    assert ref() is None


@needs_extension
def test_call_path_strided_and_offset_inputs(daemon):
    """Views with storage offsets and strides through the backend: the
    partitions are called through the extension and match eager."""
    partitions = []
    init = dynamo.KilnPartition.__init__

    def record(self, *args, **kwargs):
        init(self, *args, **kwargs)
        partitions.append(self)

    def fn(x, y):
        return torch.sigmoid(x * 2 + y).sum(dim=-1), torch.tanh(y - x).mean(0)

    def restrided(x, y):  # eager gives y's (transposed) strides
        return torch.tanh(y - x) * 3

    base = torch.randn(12, 40)
    other = torch.randn(40, 12)
    x = base[2:10, 3:35:4]  # offset 83, strides (40, 4)
    y = other.t()[1:9, 5:13]  # transposed, offset 5*12+1
    assert x.storage_offset() and not x.is_contiguous()
    assert y.storage_offset() and not y.is_contiguous()
    try:
        dynamo.KilnPartition.__init__ = record
        backend = kiln.backend(server=daemon.address, fallback="error")
        compiled = torch.compile(fn, backend=backend)
        out = compiled(x, y)
        assert len(partitions) == 1 and partitions[0]._fast is not None
        # An output PyTorch expects non-contiguous: the extension runs the
        # program, Python restrides (as on the ctypes path).
        other_backend = kiln.backend(server=daemon.address, fallback="error")
        out2 = torch.compile(restrided, backend=other_backend)(x, y)
        assert len(partitions) == 2
        assert partitions[1]._fast is None and partitions[1]._run is not None
    finally:
        dynamo.KilnPartition.__init__ = init
    torch.testing.assert_close(out, fn(x, y))
    torch.testing.assert_close(out2, restrided(x, y))
    assert out2.stride() == restrided(x, y).stride()
    # Same layout, new values: no recompile, still right.
    base.normal_()
    torch.testing.assert_close(compiled(x, y), fn(x, y))
    assert backend.report.compiled_partitions == 1


@needs_extension
def test_call_path_dynamic_sizes_from_threads(daemon):
    exe = kiln.Client(daemon.address).cpu_executable(GRAPH)
    call = exe.call_path([0, 1], [("kiln", 0)], tuple_output=False)
    scale = torch.randn(16)
    errors = []

    def work(rows):
        try:
            for _ in range(200):
                a = torch.randn(rows, 16)
                torch.testing.assert_close(call(a, scale), reference(a, scale))
        except Exception as e:  # noqa: BLE001
            errors.append(e)

    threads = [threading.Thread(target=work, args=(r,)) for r in (2, 3, 9, 33)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors


def errors_of(fn):
    try:
        fn()
    except kiln.KilnError as e:
        return (e.code_name, e.message)
    raise AssertionError("no KilnError")


@needs_extension
def test_call_path_errors_are_the_c_apis(daemon):
    """Wrong dtype, wrong shape, an unsupported dtype, a non-tensor, a CUDA
    or meta tensor: the extension raises exactly what the ctypes path
    raises (the C API's status where the C API checks)."""
    exe = kiln.Client(daemon.address).cpu_executable(GRAPH)
    call = exe.call_path([0, 1], [("kiln", 0)])
    scale = torch.randn(16)
    bad = [
        (torch.randn(4, 15), scale),  # dim 1 is 16
        (torch.randn(4, 16, 1), scale),  # rank
        (torch.randn(4, 16).to(torch.int32), scale),  # a dtype Kiln runs
        (torch.randn(4, 16).double(), scale),  # a dtype Kiln does not run
        (torch.randn(4, 16), torch.randn(17)),
        (torch.randn(4, 16, device="meta"), scale),
    ]
    for x, s in bad:
        fast = errors_of(lambda: call(x, s))
        if x.is_meta:
            slow = ("INVALID_ARGUMENT", "input 0 is not a CPU torch.Tensor")
        elif x.dtype == torch.float64:
            slow = errors_of(lambda: exe.output_sizes([x, s]))
        else:
            slow = errors_of(lambda: exe.output_sizes([x, s]))
            # The C API's own wording, naming the input.
            assert "input" in slow[1], slow
        assert fast == slow, (x.shape, x.dtype)
        assert fast[0] == "INVALID_ARGUMENT"
    # Static sizes skip the size query: the run's guards still check.
    static = exe.call_path([0, 1], [("kiln", 0)], static_sizes=[(4,)])
    x = torch.randn(4, 15)
    assert errors_of(lambda: static(x, scale)) == errors_of(
        lambda: exe.run_into([x, scale], [torch.empty(4)]))
    assert errors_of(lambda: call(torch.randn(4, 16)))[0] == "INVALID_ARGUMENT"
    assert errors_of(lambda: call(3.0, scale)) == (
        "INVALID_ARGUMENT", "input 0 is not a CPU torch.Tensor")


def test_ctypes_fallback_without_extension(daemon):
    """KILN_NO_EXTENSION=1: no extension loaded, the backend still runs
    partitions in Kiln (ctypes) with eager's results."""
    script = r"""
import sys, torch, kiln
from kiln import _binding
assert _binding.extension() is None
def fn(x, y):
    return torch.sigmoid(x * 2 + y).sum(dim=-1), torch.tanh(y - x)
x, y = torch.randn(8, 64)[:, ::2], torch.randn(8, 32)
backend = kiln.backend(server=sys.argv[1], fallback="error")
out = torch.compile(fn, backend=backend)(x, y)
torch.testing.assert_close(out, fn(x, y))
assert backend.report.compiled_partitions >= 1, str(backend.report)
exe = kiln.Client(sys.argv[1]).cpu_executable(open(sys.argv[2]).read())
(z,) = exe(torch.randn(3, 16), torch.ones(16))
assert z.shape == (3,)
print("ok")
"""
    env = dict(os.environ, KILN_NO_EXTENSION="1",
               PYTHONPATH=PYTHON_DIR + os.pathsep + os.environ.get(
                   "PYTHONPATH", ""))
    graph = ROOT / "examples" / "graphs" / "dynamic_batch.json"
    done = subprocess.run([sys.executable, "-c", script, daemon.address,
                           str(graph)], env=env, capture_output=True,
                          text=True, timeout=600)
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr


needs_gpu = pytest.mark.skipif(
    not torch.cuda.is_available() or not extension_built()
    or bool(os.environ.get("KILN_NO_EXTENSION")),
    reason="needs a CUDA GPU and _kiln_call")


@needs_gpu
@pytest.mark.parametrize("allocator", ["torch", "kiln"])
def test_cuda_call_path(daemon, allocator):
    """CUDA executables through the extension: torch's current stream, the
    same results as eager and as the ctypes path, inputs returned as
    themselves, the device check and the C API's guard errors."""
    major, minor = torch.cuda.get_device_capability()
    graph = (ROOT / "examples" / "graphs" / "softmax.json").read_text()
    exe = kiln.Client(daemon.address).cuda_executable(
        graph, target=f"sm_{major}{minor}", allocator=allocator)
    x = torch.randn(64, 1024, device="cuda")
    call = exe.call_path([0], [("kiln", 0), ("input", 0)])
    y, same = call(x)
    assert same is x
    torch.testing.assert_close(y, torch.softmax(x, -1))
    assert y.device == x.device and y.is_contiguous()
    (z,) = exe(x)  # __call__ through the extension too
    torch.testing.assert_close(z, y)
    (w,) = exe(x, stream=torch.cuda.current_stream())  # the ctypes path
    torch.testing.assert_close(w, y)
    # On a side stream made current: enqueued there.
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        (v,) = exe(x)
    side.synchronize()
    torch.testing.assert_close(v, y)
    fast = errors_of(lambda: call(torch.randn(64, 1000, device="cuda")))
    slow = errors_of(lambda: exe.run_raw(
        [(x.data_ptr(), "float32", (64, 1000), (1000, 1))],
        torch.cuda.current_stream().cuda_stream))
    assert fast == slow and fast[0] == "INVALID_ARGUMENT"
    assert errors_of(lambda: call(x.cpu())) == (
        "INVALID_ARGUMENT",
        f"input 0 is not a CUDA tensor of device {exe.device} (the "
        "executable's)")
    # Outputs outlive the executable (their memory is the allocator's).
    del exe, call
    torch.cuda.synchronize()
    torch.testing.assert_close(y, torch.softmax(x, -1))
