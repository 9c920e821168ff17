"""The Python binding (python/kiln) on a GPU with PyTorch: the example graphs
(and a few small graphs over the other dtypes) compiled by a kilnd from the
bundle, run on torch tensors through kiln.Client.cuda_executable with both
allocators ("torch": PyTorch's caching allocator; "kiln": Kiln's), compared
with eager PyTorch running the same Core ATen ops (torch.ops.aten). Also:
outputs are zero-copy torch tensors whose memory comes from (and goes back
to) the chosen allocator, runs on a side stream, the in-process cache and
Lookup counters, guard errors as KilnError.

From the relocatable bundle on the GPU machine (what deploy/run-on-gpu.sh
BUNDLE python does):

    tar -xJf kiln-linux-x86_64.tar.xz
    KILN_NVJITLINK=/path/to/libnvJitLink.so.13 \
      python3 kiln/share/kiln/tests/python_binding_test.py

The package and its library come from the bundle (kiln/python, kiln/lib);
kilnd is kiln/bin/kilnd started on 127.0.0.1:0 ($KILN_SERVER uses a running
one instead; $KILN_KILND, $KILN_LIB, $KILN_EXAMPLES_DIR and $KILN_PYTHON_DIR
override the bundle's paths). Needs torch with CUDA; without them every test
is skipped and says why.
"""

import gc
import json
import os
import pathlib
import subprocess
import sys
import tempfile
import time
import unittest

HERE = pathlib.Path(__file__).resolve().parent


def _bundle_root():
    # kiln/share/kiln/tests/<this> in the bundle; tests/gpu/<this> in a tree.
    for root in (HERE.parents[2], HERE.parents[1]):
        if (root / "python" / "kiln" / "__init__.py").exists():
            return root
    return HERE.parents[1]


ROOT = _bundle_root()
sys.path.insert(0, os.environ.get("KILN_PYTHON_DIR", str(ROOT / "python")))
import kiln  # noqa: E402

try:
    import torch
    HAVE_CUDA = torch.cuda.is_available()
    WHY = "" if HAVE_CUDA else "torch finds no CUDA device"
except ImportError as e:
    torch = None
    HAVE_CUDA = False
    WHY = f"no torch: {e}"


def _first_existing(*paths):
    for p in paths:
        if p and pathlib.Path(p).exists():
            return pathlib.Path(p)
    return pathlib.Path(paths[-1])


EXAMPLES = _first_existing(os.environ.get("KILN_EXAMPLES_DIR"),
                           ROOT / "share" / "kiln" / "examples" / "graphs",
                           ROOT / "examples" / "graphs")
KILND = _first_existing(os.environ.get("KILN_KILND"), ROOT / "bin" / "kilnd",
                        ROOT / "build" / "server" / "kilnd")

EXAMPLE_FILES = ["chain10.json", "chain30.json", "chain30_sum.json",
                 "softmax.json", "layer_norm.json", "reduce_two_dims.json",
                 "dynamic_batch.json"]


def _inline(inputs, nodes, outputs):
    return {"inputs": [{"name": n, "meta": {"dtype": d, "sizes": [
        {"value": str(s)} for s in sizes]}} for n, d, sizes in inputs],
        "nodes": [{"op": op, "args": args, "outputs": outs}
                  for op, args, outs in nodes],
        "outputs": outputs}


# Other dtypes: float16/bfloat16 arithmetic, bool and int64 outputs.
INLINE_GRAPHS = {
    "half_and_bool": _inline(
        [("x", "FLOAT16", [8, 32])],
        [("aten.mul.Tensor", [{"ref": "x"}, {"f": 1.5}], ["a"]),
         ("aten.sin.default", [{"ref": "a"}], ["b"]),
         ("aten.gt.Scalar", [{"ref": "b"}, {"f": 0.25}], ["c"])],
        ["b", "c"]),
    "bfloat16": _inline(
        [("x", "BFLOAT16", [4, 64]), ("y", "BFLOAT16", [64])],
        [("aten.add.Tensor", [{"ref": "x"}, {"ref": "y"}], ["a"]),
         ("aten.relu.default", [{"ref": "a"}], ["b"])],
        ["b"]),
    "int64_sum": _inline(
        [("x", "INT64", [6, 40])],
        [("aten.sum.dim_IntList", [{"ref": "x"}, {"ints": {"values": ["1"]}}],
          ["s"])],
        ["s"]),
}

_TORCH_DTYPES = {"FLOAT32": "float32", "FLOAT16": "float16",
                 "BFLOAT16": "bfloat16", "INT32": "int32", "INT64": "int64",
                 "BOOL": "bool"}


def _symbol_values(graph, value):
    return {s["name"]: value for s in graph.get("symbols", [])}


def make_inputs(graph, symbols, seed):
    g = torch.Generator(device="cuda").manual_seed(seed)
    tensors = []
    for inp in graph["inputs"]:
        meta = inp["meta"]
        dtype = getattr(torch, _TORCH_DTYPES[meta.get("dtype", "FLOAT32")])
        sizes = [int(d["value"]) if "value" in d else symbols[d["symbol"]]
                 for d in meta.get("sizes", [])]
        if dtype.is_floating_point:
            t = torch.randn(sizes, generator=g, device="cuda").to(dtype)
        elif dtype == torch.bool:
            t = torch.randint(0, 2, sizes, generator=g, device="cuda").bool()
        else:
            t = torch.randint(-100, 100, sizes, generator=g, device="cuda",
                              dtype=dtype)
        tensors.append(t)
    return tensors


def eager(graph, inputs, symbols):
    """Runs the graph's nodes as eager Core ATen ops."""
    env = {inp["name"]: t for inp, t in zip(graph["inputs"], inputs)}

    def value(a):
        if "ref" in a:
            return env[a["ref"]]
        if "i" in a:
            return int(a["i"])
        if "f" in a:
            return float(a["f"])
        if "b" in a:
            return bool(a["b"])
        if "ints" in a:
            return [int(v) for v in a["ints"].get("values", [])]
        if "dims" in a:
            return [int(d["value"]) if "value" in d else symbols[d["symbol"]]
                    for d in a["dims"].get("values", [])]
        if "refs" in a:
            return [env[r] for r in a["refs"].get("values", [])]
        if "dtype" in a:
            return getattr(torch, _TORCH_DTYPES[a["dtype"]])
        if "str" in a:
            return a["str"]
        if "none" in a:
            return None
        raise ValueError(f"argument {a}")

    for node in graph["nodes"]:
        _, name, overload = node["op"].split(".")
        fn = getattr(getattr(torch.ops.aten, name), overload)
        args, kwargs = [], {}
        for a in node.get("args", []):
            if a.get("name"):
                kwargs[a["name"]] = value(a)
            else:
                args.append(value(a))
        try:
            out = fn(*args, **kwargs)
        except (TypeError, RuntimeError):
            # An overload whose schema wants a Tensor where the graph has a
            # Python number (allowed for add/mul/...; not for every op).
            def tensor(v):
                if isinstance(v, (int, float)) and not isinstance(v, bool):
                    return torch.tensor(v, device="cuda")
                return v
            out = fn(*[tensor(a) for a in args],
                     **{k: tensor(v) for k, v in kwargs.items()})
        outs = node["outputs"]
        if len(outs) == 1:
            env[outs[0]] = out[0] if isinstance(out, (tuple, list)) else out
        else:
            for n, o in zip(outs, out):
                env[n] = o
    return [env[o] for o in graph["outputs"]]


def tolerance(dtype, fast_math=False):
    if dtype in (torch.float16, torch.bfloat16):
        return {"rtol": 2e-2, "atol": 2e-2}
    if dtype == torch.float32:
        return {"rtol": 1e-3, "atol": 1e-3} if fast_math else \
            {"rtol": 1e-4, "atol": 2e-5}
    return {"rtol": 0, "atol": 0}


class Server:
    def __init__(self):
        self.proc = None
        self.address = os.environ.get("KILN_SERVER")
        if self.address:
            return
        self.dir = tempfile.TemporaryDirectory(prefix="kiln_py_gpu_")
        port_file = pathlib.Path(self.dir.name) / "port"
        self.log = open(pathlib.Path(self.dir.name) / "kilnd.log", "wb")
        self.proc = subprocess.Popen([
            str(KILND), "--listen=127.0.0.1:0", "--metrics_listen=127.0.0.1:0",
            f"--data_dir={self.dir.name}/data", f"--port_file={port_file}"],
            stdout=self.log, stderr=subprocess.STDOUT)
        deadline = time.time() + 30
        while time.time() < deadline:
            lines = port_file.read_text().split() if port_file.exists() \
                else []
            if lines:  # the gRPC port, then the metrics port
                self.address = f"127.0.0.1:{int(lines[0])}"
                return
            time.sleep(0.05)
        log = (pathlib.Path(self.dir.name) / "kilnd.log").read_text()
        self.stop()
        raise RuntimeError(f"{KILND} did not start:\n{log}")

    def stop(self):
        if self.proc:
            self.proc.terminate()
            self.proc.wait()
            self.proc = None
            self.log.close()
            self.dir.cleanup()


@unittest.skipUnless(HAVE_CUDA, WHY)
class PythonBindingGpu(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.server = Server()
        major, minor = torch.cuda.get_device_capability()
        cls.arch = f"sm_{major}{minor}"
        print(f"\n{torch.cuda.get_device_name()} ({cls.arch}), torch "
              f"{torch.__version__}, kilnd {cls.server.address}, "
              f"library {kiln.load_library()._name}", file=sys.stderr)

    @classmethod
    def tearDownClass(cls):
        cls.server.stop()

    def graphs(self):
        for f in EXAMPLE_FILES:
            yield f, json.loads((EXAMPLES / f).read_text())
        yield from INLINE_GRAPHS.items()

    def check(self, exe, graph, name, symbols, seed, fast_math=False,
              stream=None):
        inputs = make_inputs(graph, symbols, seed)
        if stream is not None:
            stream.wait_stream(torch.cuda.current_stream())
        got = exe(*inputs, stream=stream)
        if stream is not None:
            torch.cuda.current_stream().wait_stream(stream)
        want = eager(graph, inputs, symbols)
        self.assertEqual(len(got), len(want), name)
        for i, (g, w) in enumerate(zip(got, want)):
            self.assertIsInstance(g, torch.Tensor)
            self.assertEqual(g.device, inputs[0].device, f"{name} output {i}")
            self.assertEqual(g.dtype, w.dtype, f"{name} output {i}")
            self.assertEqual(tuple(g.shape), tuple(w.shape),
                             f"{name} output {i}")
            self.assertTrue(g.is_contiguous())
            torch.testing.assert_close(g, w, equal_nan=True,
                                       msg=lambda m: f"{name} output {i}: {m}",
                                       **tolerance(w.dtype, fast_math))

    def test_graphs_match_eager_with_both_allocators(self):
        for allocator in ("torch", "kiln"):
            client = kiln.Client(self.server.address)
            count = 0
            for name, graph in self.graphs():
                with self.subTest(graph=name, allocator=allocator):
                    exe = client.cuda_executable(graph, target=self.arch,
                                                 allocator=allocator)
                    count += 1
                    for value in ((5, 64) if graph.get("symbols") else (0,)):
                        self.check(exe, graph, name,
                                   _symbol_values(graph, value), seed=value)
            c = client.counters()
            self.assertEqual(c["compiles"] + c["lookup_hits"], count)
            # Again: the in-process cache (keyed on the allocator too).
            for name, graph in self.graphs():
                client.cuda_executable(graph, target=self.arch,
                                       allocator=allocator)
            self.assertEqual(client.counters()["local_hits"], count)
            client.close()

    def test_fast_math(self):
        client = kiln.Client(self.server.address)
        graph = json.loads((EXAMPLES / "chain30.json").read_text())
        exe = client.cuda_executable(graph, target=self.arch, fast_math=True)
        self.check(exe, graph, "chain30 fast_math", {}, seed=7,
                   fast_math=True)

    def test_outputs_come_from_the_chosen_allocator_without_copies(self):
        graph = json.loads((EXAMPLES / "layer_norm.json").read_text())
        x, w, b = make_inputs(graph, {}, seed=3)
        for allocator in ("torch", "kiln"):
            client = kiln.Client(self.server.address)
            exe = client.cuda_executable(graph, target=self.arch,
                                         allocator=allocator)
            exe(x, w, b)  # warm up either cache
            torch.cuda.synchronize()
            before = torch.cuda.memory_allocated()
            outs = exe(x, w, b)
            torch.cuda.synchronize()
            during = torch.cuda.memory_allocated()
            out_bytes = sum(o.numel() * o.element_size() for o in outs)
            if allocator == "torch":
                self.assertGreaterEqual(during - before, out_bytes)
            else:
                self.assertEqual(during, before)
            # Zero copy: writing through the tensor is seen by a view of the
            # same memory, and the memory is given back when it dies.
            y = outs[0]
            alias = y.view(-1)
            y.fill_(2.0)
            self.assertEqual(alias[0].item(), 2.0)
            del outs, y, alias
            gc.collect()
            torch.cuda.synchronize()
            self.assertEqual(torch.cuda.memory_allocated(), before, allocator)
            client.close()

    def test_side_stream(self):
        client = kiln.Client(self.server.address)
        graph = json.loads((EXAMPLES / "softmax.json").read_text())
        for allocator in ("torch", "kiln"):
            exe = client.cuda_executable(graph, target=self.arch,
                                         allocator=allocator)
            side = torch.cuda.Stream()
            # Explicit stream= ...
            self.check(exe, graph, "softmax on a side stream", {}, seed=11,
                       stream=side)
            # ... and the current stream inside `with torch.cuda.stream`.
            x = make_inputs(graph, {}, seed=12)[0]
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                (y,) = exe(x)
                z = y * 2  # ordered after the kernel on the same stream
            torch.cuda.current_stream().wait_stream(side)
            torch.testing.assert_close(z, torch.softmax(x, -1) * 2,
                                       rtol=1e-4, atol=2e-5)

    def test_lookup_from_a_second_client_and_guard_errors(self):
        graph = json.loads((EXAMPLES / "dynamic_batch.json").read_text())
        first = kiln.Client(self.server.address)
        first.cuda_executable(graph, target=self.arch)
        second = kiln.Client(self.server.address)
        exe = second.cuda_executable(graph, target=self.arch)
        self.assertEqual(second.counters()["compiles"], 0)
        self.assertEqual(second.counters()["lookup_hits"], 1)
        x = torch.randn(5, 17, device="cuda")  # dim 1 must be 16
        scale = torch.randn(16, device="cuda")
        with self.assertRaises(kiln.KilnError) as cm:
            exe(x, scale)
        self.assertEqual(cm.exception.code_name, "INVALID_ARGUMENT")
        with self.assertRaises(kiln.KilnError):
            exe(x.cpu(), scale)


if __name__ == "__main__":
    unittest.main(verbosity=2)
