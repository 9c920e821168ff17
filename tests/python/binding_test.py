"""The Python binding (python/kiln) without a GPU or PyTorch, against a real
kilnd: the package imports without torch, loads libkiln_c.so, and reports
errors as KilnError with Kiln's code and message: JSON that is not a graph,
a bad target, a malformed graph, an unknown server; a CUDA request compiles
on the daemon (a cubin; no GPU needed), a second client gets it by Lookup,
and loading it without a CUDA driver is FAILED_PRECONDITION. Where this
machine has a GPU (and torch), the load may succeed instead.

ctest runs it (tests/CMakeLists.txt) with KILN_LIB (libkiln_c.so),
KILN_KILND, KILN_EXAMPLES_DIR and KILN_PYTHON_DIR (the package's parent) set:

    ctest --test-dir build -R python_binding_test --output-on-failure
"""

import json
import os
import pathlib
import subprocess
import sys
import tempfile
import time
import unittest

sys.path.insert(0, os.environ.get(
    "KILN_PYTHON_DIR",
    str(pathlib.Path(__file__).resolve().parents[2] / "python")))

import kiln  # noqa: E402

EXAMPLES = pathlib.Path(os.environ.get(
    "KILN_EXAMPLES_DIR",
    pathlib.Path(__file__).resolve().parents[2] / "examples" / "graphs"))


def have_torch():
    try:
        import torch  # noqa: F401
        return True
    except ImportError:
        return False


class Daemon:
    """kilnd on 127.0.0.1:0 with its own data dir."""

    def __init__(self, extra_args=(), tokens=None):
        self.dir = tempfile.TemporaryDirectory(prefix="kiln_py_test_")
        if tokens is not None:  # a token file's text: --auth_tokens
            tokens_file = pathlib.Path(self.dir.name) / "tokens"
            tokens_file.write_text(tokens)
            extra_args = [*extra_args, f"--auth_tokens={tokens_file}"]
        port_file = pathlib.Path(self.dir.name) / "port"
        # Its output goes to a file: a daemon left behind must not hold
        # ctest's pipe open.
        self.log = open(pathlib.Path(self.dir.name) / "kilnd.log", "wb")
        self.proc = subprocess.Popen([
            os.environ["KILN_KILND"], "--listen=127.0.0.1:0",
            "--metrics_listen=127.0.0.1:0", "--compile_threads=2",
            f"--data_dir={self.dir.name}/data", f"--port_file={port_file}",
            *extra_args],
            stdout=self.log, stderr=subprocess.STDOUT)
        self.port = 0
        try:
            deadline = time.time() + 30
            while time.time() < deadline and not self.port:
                lines = port_file.read_text().split() \
                    if port_file.exists() else []
                if lines:  # the gRPC port, then the metrics port
                    self.port = int(lines[0])
                else:
                    time.sleep(0.02)
            if not self.port:
                raise RuntimeError("kilnd did not start")
        except BaseException:
            self.stop()
            raise
        self.address = f"127.0.0.1:{self.port}"

    def stop(self):
        self.proc.kill()
        self.proc.wait()
        self.log.close()
        self.dir.cleanup()


class WithoutDaemon(unittest.TestCase):
    def test_imports_without_torch_and_loads_the_library(self):
        if not have_torch():
            self.assertNotIn("torch", sys.modules)
        lib = kiln.load_library()
        self.assertEqual(lib.kiln_c_api_version(), kiln.C_API_VERSION)

    def test_prepare_cpu_runtime(self):
        # The BLAS CI installs loads (twice: idempotent); a bad KILN_BLAS
        # names the library it tried, in a process of its own (the
        # library is loaded once per process).
        kiln._binding.prepare_cpu_runtime()
        kiln._binding.prepare_cpu_runtime()
        code = ("import kiln\ntry:\n kiln._binding.prepare_cpu_runtime()\n"
                "except kiln.KilnError as e:\n print(e.code_name, e)")
        out = subprocess.run(
            [sys.executable, "-c", code], capture_output=True, text=True,
            env=dict(os.environ, KILN_BLAS="/nonexistent/libblas.so",
                     PYTHONPATH=os.pathsep.join(sys.path)), timeout=60)
        self.assertIn("FAILED_PRECONDITION", out.stdout + out.stderr)
        self.assertIn("/nonexistent/libblas.so", out.stdout + out.stderr)

    def test_unreachable_server_is_unavailable(self):
        client = kiln.Client("127.0.0.1:1", rpc_deadline_seconds=2,
                             max_retries=1)
        graph = (EXAMPLES / "chain10.json").read_text()
        with self.assertRaises(kiln.KilnError) as cm:
            client.cuda_executable(graph, allocator="kiln")
        self.assertEqual(cm.exception.code_name, "UNAVAILABLE")
        self.assertTrue(str(cm.exception).startswith("UNAVAILABLE: "))

    def test_bad_allocator_name(self):
        client = kiln.Client("127.0.0.1:1")
        with self.assertRaises(kiln.KilnError) as cm:
            client.cuda_executable("{}", allocator="cupy")
        self.assertEqual(cm.exception.code_name, "INVALID_ARGUMENT")

    @unittest.skipIf(have_torch(), "torch is installed here")
    def test_torch_allocator_needs_torch(self):
        client = kiln.Client("127.0.0.1:1")
        with self.assertRaises(kiln.KilnError) as cm:
            client.cuda_executable("{}", allocator="torch", device=0)
        self.assertEqual(cm.exception.code_name, "FAILED_PRECONDITION")
        self.assertIn("PyTorch", cm.exception.message)


class WithTokens(unittest.TestCase):
    """kilnd with --auth_tokens: kiln.Client(token=...) or $KILN_TOKEN."""

    TOKEN = "python-test-token"

    @classmethod
    def setUpClass(cls):
        import hashlib
        digest = hashlib.sha256(cls.TOKEN.encode()).hexdigest()
        cls.daemon = Daemon(tokens=f"{digest} compile py\n")

    @classmethod
    def tearDownClass(cls):
        cls.daemon.stop()

    def test_token_from_argument_environment_or_file(self):
        graph = (EXAMPLES / "chain10.json").read_text()
        with self.assertRaises(kiln.KilnError) as cm:
            kiln.Client(self.daemon.address, max_retries=0).cpu_executable(
                graph)
        self.assertEqual(cm.exception.code_name, "UNAUTHENTICATED")
        self.assertIn("needs a token", cm.exception.message)
        with self.assertRaises(kiln.KilnError) as cm:
            kiln.Client(self.daemon.address, max_retries=0,
                        token="wrong").cpu_executable(graph)
        self.assertEqual(cm.exception.code_name, "UNAUTHENTICATED")
        kiln.Client(self.daemon.address, token=self.TOKEN).cpu_executable(
            graph)
        os.environ["KILN_TOKEN"] = self.TOKEN
        try:
            kiln.Client(self.daemon.address).cpu_executable(graph)
        finally:
            del os.environ["KILN_TOKEN"]
        token_file = pathlib.Path(self.daemon.dir.name) / "my-token"
        token_file.write_text(self.TOKEN + "\n")
        kiln.Client(self.daemon.address,
                    token_file=str(token_file)).cpu_executable(graph)
        with self.assertRaises(kiln.KilnError) as cm:
            kiln.Client(self.daemon.address, tls_ca="/no/such/ca.pem")
        self.assertEqual(cm.exception.code_name, "NOT_FOUND")


class WithDaemon(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.daemon = Daemon()

    @classmethod
    def tearDownClass(cls):
        cls.daemon.stop()

    def client(self):
        return kiln.Client(self.daemon.address, rpc_deadline_seconds=60,
                           max_retries=2)

    def test_bad_requests_name_the_problem(self):
        client = self.client()
        with self.assertRaises(kiln.KilnError) as cm:
            client.cuda_executable("{ not json", allocator="kiln")
        self.assertEqual(cm.exception.code_name, "INVALID_ARGUMENT")
        self.assertIn("not a kiln.v1.Graph", cm.exception.message)

        graph = json.loads((EXAMPLES / "chain10.json").read_text())
        with self.assertRaises(kiln.KilnError) as cm:
            client.cuda_executable(graph, target="sm_x", allocator="kiln")
        self.assertEqual(cm.exception.code_name, "INVALID_ARGUMENT")
        self.assertIn("sm_x", cm.exception.message)

        graph["nodes"][0]["args"][0]["ref"] = "nope"
        with self.assertRaises(kiln.KilnError) as cm:
            client.cuda_executable(graph, allocator="kiln")
        self.assertEqual(cm.exception.code_name, "INVALID_ARGUMENT")
        self.assertIn("nope", cm.exception.message)

        graph = json.loads((EXAMPLES / "chain10.json").read_text())
        graph["nodes"][1]["op"] = "aten.frobnicate.default"
        with self.assertRaises(kiln.KilnError) as cm:
            client.cuda_executable(graph, allocator="kiln")
        self.assertEqual(cm.exception.code_name, "UNIMPLEMENTED")
        self.assertIn("aten.frobnicate", cm.exception.message)
        self.assertEqual(client.counters(),
                         {"local_hits": 0, "lookup_hits": 0, "compiles": 0})

    def test_cuda_request_compiles_then_looks_up(self):
        graph = (EXAMPLES / "layer_norm.json").read_text()
        for round_, want in enumerate(
                [{"local_hits": 0, "lookup_hits": 0, "compiles": 1},
                 {"local_hits": 0, "lookup_hits": 1, "compiles": 0}]):
            client = self.client()
            try:
                exe = client.cuda_executable(graph, target="sm_90",
                                             allocator="kiln", device=0)
            except kiln.KilnError as e:
                self.assertEqual(e.code_name, "FAILED_PRECONDITION", str(e))
                self.assertTrue("CUDA driver not available" in e.message or
                                "cuInit" in e.message or "sm_" in e.message,
                                e.message)
            else:  # a machine with a GPU that runs sm_90
                self.assertEqual(exe.num_inputs, 3)
                self.assertEqual(exe.output_dtypes, ["float32"] * 3)
                self.assertEqual(exe.output_ranks, [2, 2, 2])
                self.assertEqual(len(exe.guard_key), 64)
            self.assertEqual(client.counters(), want, f"round {round_}")
            client.close()


if __name__ == "__main__":
    unittest.main(verbosity=2)
