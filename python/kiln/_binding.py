"""The ctypes binding over libkiln_c.so (client/kiln_c.h): kilnd's CPU and
CUDA executables on PyTorch tensors. It imports without PyTorch; only
running on torch tensors and allocator="torch" need it.

    import kiln, torch
    client = kiln.Client()                      # $KILN_SERVER or 127.0.0.1:7733
    exe = client.cuda_executable(open("softmax.json").read(), target="sm_90")
    (y,) = exe(torch.randn(64, 1024, device="cuda"))
    cpu = client.cpu_executable(open("softmax.json").read())
    (y,) = cpu(torch.randn(64, 1024))           # zero-copy in and out

The library is found as $KILN_LIB (the file, or a directory holding
libkiln_c.so), else in a wheel's kiln/_native/lib, else in the relocatable
bundle's kiln/lib next to this package (kiln/python/kiln), else in a source
tree's build/client, else by the dynamic loader.

Memory (allocator=):
  "torch"  outputs and intermediates come from PyTorch's caching allocator
           (torch.cuda.caching_allocator_alloc / caching_allocator_delete),
           so they show in torch.cuda.memory_allocated() and share its cache.
  "kiln"   Kiln's own CachingDeviceAllocator, one per device and Client.
Outputs are torch tensors over that memory without a copy: each Kiln output
is handed to PyTorch as a DLPack capsule (torch.utils.dlpack.from_dlpack;
no NumPy needed), whose deleter frees the Kiln output when the tensor's
storage dies. (run_raw returns CudaOutput objects instead, which also offer
__cuda_array_interface__ for CuPy or Numba.)

Streams: a call enqueues its kernels on `stream` (default: PyTorch's current
stream of the executable's device) and returns without synchronising, as an
eager PyTorch op does. Outputs are ready in that stream's order, so work
enqueued later on the same stream sees them. To use an output on another
stream, make it wait first (other.wait_stream(run_stream)) and keep the
tensor alive until that work has finished (record_stream does not reach
memory PyTorch did not allocate as a tensor); an output's memory is given
back in the run stream's order when its last tensor dies (with
allocator="torch", a block goes back to the pool of the stream it was
allocated for). Inputs are read by the enqueued work: when `stream` is not
the current stream, the call records it on each input (Tensor.record_stream)
so the caching allocator does not hand their memory out too early.

Errors are KilnError (a RuntimeError) with the status code name and Kiln's
message ("node 0 (aten.add.Tensor): ...", "CUDA driver not available: ...").

Thread-safety: a Client and a CudaExecutable may be used from several
threads at once. Only one Kiln library may be loaded per process (see
kiln_c.h).

Fast call path: where the CPython extension _kiln_call (python/ext, built
with the library when python3-dev is installed) sits next to libkiln_c.so,
or can be built on first use for this Python (kiln/_ext_build.py),
CPU executables are called through it (CpuExecutable.call_path, what the
Dynamo backend uses): a few hundred nanoseconds of Python work per tensor
instead of ctypes' microseconds. KILN_NO_EXTENSION=1, or no extension, keeps
the ctypes path; both give the same results and the same errors.
"""

import ctypes
import ctypes.util
import importlib.machinery
import importlib.util
import json
import os
import pathlib
import threading

__all__ = ["Client", "CpuExecutable", "CudaExecutable", "CudaOutput",
           "KilnError", "extension", "load_library", "supported_ops"]

C_API_VERSION = 7  # kiln_c.h's KILN_C_API_VERSION this binding speaks

# kiln_c.h's KILN_OPTION_* flags: CompileOptions fields, or-ed into the
# `options` of the executable calls.
OPTION_FAST_MATH = 1
OPTION_ALLOW_TF32 = 2
OPTION_STRICT_FP16_REDUCTION = 4
OPTION_STRICT_BF16_REDUCTION = 8
OPTION_UNFUSED_GEMM_EPILOGUES = 16
OPTION_ALLOW_TF32_CONVOLUTION = 32
OPTION_DETERMINISTIC_CONVOLUTIONS = 64
OPTION_DETERMINISTIC_ALGORITHMS = 128
OPTION_CUDNN_BENCHMARK = 256

_CODES = [
    "OK", "CANCELLED", "UNKNOWN", "INVALID_ARGUMENT", "DEADLINE_EXCEEDED",
    "NOT_FOUND", "ALREADY_EXISTS", "PERMISSION_DENIED", "RESOURCE_EXHAUSTED",
    "FAILED_PRECONDITION", "ABORTED", "OUT_OF_RANGE", "UNIMPLEMENTED",
    "INTERNAL", "UNAVAILABLE", "DATA_LOSS", "UNAUTHENTICATED",
]

# kiln_c.h's KILN_FLOAT32 ...: name, element size, __cuda_array_interface__
# typestr (bfloat16 travels as int16 and is viewed back).
_DTYPES = {
    1: ("float32", 4, "<f4"),
    2: ("float16", 2, "<f2"),
    3: ("bfloat16", 2, "<i2"),
    4: ("int32", 4, "<i4"),
    5: ("int64", 8, "<i8"),
    6: ("bool", 1, "|b1"),
}
_DTYPE_CODES = {name: code for code, (name, _, _) in _DTYPES.items()}


class KilnError(RuntimeError):
    """A Kiln status: .code (int), .code_name ("INVALID_ARGUMENT"), .message.

    KilnError(11, ...) (OUT_OF_RANGE: a graph read an index out of range)
    is a KilnIndexError, also an IndexError as PyTorch raises, wherever it
    is made (here or in the _kiln_call extension)."""

    def __new__(cls, code, message):
        if cls is KilnError and code == _OUT_OF_RANGE:
            cls = KilnIndexError
        return super().__new__(cls, code, message)

    def __init__(self, code, message):
        self.code = code
        self.code_name = _CODES[code] if 0 <= code < len(_CODES) else str(code)
        self.message = message
        super().__init__(f"{self.code_name}: {message}")


_OUT_OF_RANGE = 11


class KilnIndexError(KilnError, IndexError):
    """OUT_OF_RANGE: an index (embedding, gather, index_select, index,
    index_put, scatter, nll_loss target) outside its dim, e.g. "node 7
    (aten.embedding.default): index 50300 is out of range for dimension 0
    of size 50257". An IndexError, as PyTorch raises for the same call."""


class _TensorView(ctypes.Structure):
    _fields_ = [
        ("data", ctypes.c_uint64),
        ("dtype", ctypes.c_int32),
        ("rank", ctypes.c_int32),
        ("sizes", ctypes.POINTER(ctypes.c_int64)),
        ("strides", ctypes.POINTER(ctypes.c_int64)),
    ]


_ALLOC_FN = ctypes.CFUNCTYPE(ctypes.c_uint64, ctypes.c_size_t, ctypes.c_void_p,
                             ctypes.c_void_p)
_FREE_FN = ctypes.CFUNCTYPE(None, ctypes.c_uint64, ctypes.c_size_t,
                            ctypes.c_void_p, ctypes.c_void_p)

_lib = None
_lib_path = None  # the file load_library loaded, when it is a path
_lib_lock = threading.Lock()
_ext = None  # the _kiln_call module once loaded; False: none
_ext_ready = 0  # 1: _kiln_call.init done (needs torch), 2: init_cuda too

_capsule_new = ctypes.pythonapi.PyCapsule_New
_capsule_new.restype = ctypes.py_object
_capsule_new.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p]
_capsule_is_valid = ctypes.pythonapi.PyCapsule_IsValid
_capsule_is_valid.restype = ctypes.c_int
_capsule_is_valid.argtypes = [ctypes.py_object, ctypes.c_char_p]


def _candidates():
    env = os.environ.get("KILN_LIB")
    if env:
        p = pathlib.Path(env)
        yield p / "libkiln_c.so" if p.is_dir() else p
        return
    here = pathlib.Path(__file__).resolve().parent
    yield here / "_native" / "lib" / "libkiln_c.so.1"  # wheel (make wheel)
    yield here.parent.parent / "lib" / "libkiln_c.so"  # bundle: kiln/python/kiln
    yield here.parent.parent / "build" / "client" / "libkiln_c.so"  # source tree
    found = ctypes.util.find_library("kiln_c")
    yield pathlib.Path(found or "libkiln_c.so.1")


def load_library():
    """Loads libkiln_c.so once (see the module docstring) and returns it."""
    global _lib, _lib_path
    with _lib_lock:
        if _lib is not None:
            return _lib
        errors = []
        for path in _candidates():
            if path.is_absolute() and not path.exists():
                errors.append(f"{path}: not found")
                continue
            try:
                lib = ctypes.CDLL(str(path))
                break
            except OSError as e:
                errors.append(f"{path}: {e}")
        else:
            raise OSError("libkiln_c.so not found (set KILN_LIB): " +
                          "; ".join(errors))
        _declare(lib)
        if lib.kiln_c_api_version() != C_API_VERSION:
            raise OSError(f"{path}: C API version {lib.kiln_c_api_version()},"
                          f" this binding speaks {C_API_VERSION}")
        _lib = lib
        if os.sep in str(path):
            _lib_path = pathlib.Path(path)
        return lib


def extension():
    """The CPython extension _kiln_call (python/ext/kiln_call.c), loaded
    from the directory of the loaded libkiln_c.so, or None: not built there,
    KILN_NO_EXTENSION=1, or it failed to load (the ctypes path is used)."""
    global _ext
    if _ext is None:
        load_library()  # first: the extension's libkiln_c.so.1 is this one
        with _lib_lock:
            if _ext is None:
                _ext = _load_extension() or False
    return _ext or None


def _load_extension():
    if os.environ.get("KILN_NO_EXTENSION", "") not in ("", "0"):
        return None
    if _lib_path is None:
        return None
    for suffix in importlib.machinery.EXTENSION_SUFFIXES:
        path = _lib_path.parent / f"_kiln_call{suffix}"
        if not path.exists():
            continue
        try:
            spec = importlib.util.spec_from_file_location("kiln._kiln_call",
                                                          path)
            module = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(module)
            return module
        except ImportError:
            return None
    # Not built for this Python: build it now (kiln/_ext_build.py).
    from . import _ext_build  # noqa: PLC0415

    path = _ext_build.build(_lib_path)
    if path is None:
        return None
    try:
        spec = importlib.util.spec_from_file_location("kiln._kiln_call", path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return module
    except ImportError:
        return None


def _dtype_error(what, index, dtype):
    """The KilnError of a tensor whose dtype Kiln does not run (the same
    from the ctypes path and the extension)."""
    return KilnError(3, f"{what} {index}: dtype {dtype} is not one Kiln runs "
                     f"({sorted(_DTYPE_CODES)})")


def _ready_extension(cuda=False):
    """extension(), initialised with torch's objects (and its CUDA ones);
    None without it."""
    global _ext_ready
    ext = extension()
    if ext is None:
        return None
    if not _ext_ready:
        torch = _torch_dtypes()
        ext.init(KilnError, dict(_TORCH_DTYPE_CODES), torch.empty,
                 torch.Tensor, _dtype_error)
        _ext_ready = 1
    if cuda and _ext_ready != 2:
        torch = _torch()
        stream = getattr(torch._C, "_cuda_getCurrentRawStream", None)
        if stream is None:
            return None
        from_dlpack = getattr(torch._C, "_from_dlpack",
                              torch.utils.dlpack.from_dlpack)
        ext.init_cuda(stream, from_dlpack)
        _ext_ready = 2
    return ext


def _declare(lib):
    p, vp = ctypes.POINTER, ctypes.c_void_p
    status = vp  # kiln_status*, freed here
    # Checked first, so that an older library gives a clear version error.
    lib.kiln_c_api_version.restype = ctypes.c_int
    lib.kiln_c_api_version.argtypes = []
    if lib.kiln_c_api_version() != C_API_VERSION:
        return
    sigs = {
        "kiln_c_api_version": (ctypes.c_int, []),
        "kiln_status_code": (ctypes.c_int, [vp]),
        "kiln_status_message": (ctypes.c_char_p, [vp]),
        "kiln_status_free": (None, [vp]),
        "kiln_client_create": (status, [ctypes.c_char_p, ctypes.c_double,
                                        ctypes.c_int, p(vp)]),
        "kiln_client_create_with_auth": (
            status, [ctypes.c_char_p, ctypes.c_double, ctypes.c_int]
            + [ctypes.c_char_p] * 6 + [p(vp)]),
        "kiln_client_create_with_trust": (
            status, [ctypes.c_char_p, ctypes.c_double, ctypes.c_int]
            + [ctypes.c_char_p] * 7 + [p(vp)]),
        "kiln_client_destroy": (None, [vp]),
        "kiln_client_counters": (None, [vp, p(ctypes.c_uint64),
                                        p(ctypes.c_uint64),
                                        p(ctypes.c_uint64)]),
        "kiln_allocator_create": (status, [_ALLOC_FN, _FREE_FN, vp, p(vp)]),
        "kiln_allocator_create_caching": (status, [ctypes.c_int, p(vp)]),
        "kiln_allocator_destroy": (None, [vp]),
        "kiln_client_get_cuda_executable": (
            status, [vp, ctypes.c_char_p, ctypes.c_size_t, ctypes.c_char_p,
                     ctypes.c_int, ctypes.c_int, vp, p(vp)]),
        "kiln_cuda_executable_destroy": (None, [vp]),
        "kiln_cuda_executable_num_inputs": (ctypes.c_size_t, [vp]),
        "kiln_cuda_executable_num_outputs": (ctypes.c_size_t, [vp]),
        "kiln_cuda_executable_output_dtype": (ctypes.c_int,
                                              [vp, ctypes.c_size_t]),
        "kiln_cuda_executable_output_rank": (ctypes.c_int,
                                             [vp, ctypes.c_size_t]),
        "kiln_cuda_executable_guard_key": (None, [vp, ctypes.c_char_p]),
        "kiln_cuda_executable_num_input_writes": (ctypes.c_size_t, [vp]),
        "kiln_cuda_executable_input_write": (
            ctypes.c_int, [vp, ctypes.c_size_t, p(ctypes.c_int),
                           p(ctypes.c_int)]),
        "kiln_cuda_executable_device_ordinal": (ctypes.c_int, [vp]),
        "kiln_cuda_executable_run": (status, [vp, p(_TensorView),
                                              ctypes.c_size_t, vp, p(vp),
                                              ctypes.c_size_t]),
        "kiln_cuda_executable_run_into": (status, [vp, p(_TensorView),
                                                   ctypes.c_size_t, vp,
                                                   p(_TensorView),
                                                   ctypes.c_size_t]),
        "kiln_cuda_executable_check_index_errors": (status,
                                                    [vp, vp, ctypes.c_int]),
        "kiln_cuda_tensor_data": (ctypes.c_uint64, [vp]),
        "kiln_cuda_tensor_dtype": (ctypes.c_int, [vp]),
        "kiln_cuda_tensor_rank": (ctypes.c_int, [vp]),
        "kiln_cuda_tensor_sizes": (p(ctypes.c_int64), [vp]),
        "kiln_cuda_tensor_strides": (p(ctypes.c_int64), [vp]),
        "kiln_cuda_tensor_nbytes": (ctypes.c_size_t, [vp]),
        "kiln_cuda_tensor_set_last_use_stream": (None, [vp, vp]),
        "kiln_cuda_tensor_destroy": (None, [vp]),
        "kiln_cuda_tensor_to_dlpack": (vp, [vp, ctypes.c_int]),
        "kiln_dlpack_delete": (None, [vp]),
        "kiln_client_get_cpu_executable": (
            status, [vp, ctypes.c_char_p, ctypes.c_size_t, ctypes.c_char_p,
                     ctypes.c_int, p(vp)]),
        "kiln_cpu_executable_destroy": (None, [vp]),
        "kiln_cpu_executable_num_inputs": (ctypes.c_size_t, [vp]),
        "kiln_cpu_executable_num_outputs": (ctypes.c_size_t, [vp]),
        "kiln_cpu_executable_output_dtype": (ctypes.c_int,
                                             [vp, ctypes.c_size_t]),
        "kiln_cpu_executable_output_rank": (ctypes.c_int,
                                            [vp, ctypes.c_size_t]),
        "kiln_cpu_executable_guard_key": (None, [vp, ctypes.c_char_p]),
        "kiln_cpu_executable_num_input_writes": (ctypes.c_size_t, [vp]),
        "kiln_cpu_executable_input_write": (
            ctypes.c_int, [vp, ctypes.c_size_t, p(ctypes.c_int),
                           p(ctypes.c_int)]),
        "kiln_cpu_executable_output_sizes": (
            status, [vp, p(_TensorView), ctypes.c_size_t, p(ctypes.c_int64),
                     ctypes.c_size_t]),
        "kiln_cpu_executable_run": (status, [vp, p(_TensorView),
                                             ctypes.c_size_t, p(_TensorView),
                                             ctypes.c_size_t]),
        "kiln_supported_ops": (ctypes.c_char_p, []),
        "kiln_cpu_runtime_prepare": (ctypes.c_void_p, []),
    }
    for name, (restype, argtypes) in sigs.items():
        fn = getattr(lib, name)
        fn.restype = restype
        fn.argtypes = argtypes


def _check(lib, status):
    """Raises KilnError for a non-NULL kiln_status* (and frees it)."""
    if not status:
        return
    try:
        code = lib.kiln_status_code(status)
        message = lib.kiln_status_message(status).decode("utf-8", "replace")
    finally:
        lib.kiln_status_free(status)
    raise KilnError(code, message)


def _torch():
    try:
        import torch  # noqa: PLC0415 (optional dependency)
    except ImportError as e:
        raise KilnError(9, "this needs PyTorch (import torch failed: "
                        f"{e})") from e
    return torch


def _stream_handle(stream, device):
    """A CUstream as int from None (torch's current stream), a
    torch.cuda.Stream, or an int."""
    if stream is None:
        return _torch().cuda.current_stream(device).cuda_stream
    if isinstance(stream, int):
        return stream
    return stream.cuda_stream


class _Allocator:
    """A kiln_allocator handle (and, for callbacks, what keeps them alive)."""

    def __init__(self, lib, handle, keep=None):
        self._lib = lib
        self.handle = handle
        self._keep = keep

    def __del__(self):
        if self.handle and self._lib is not None:
            self._lib.kiln_allocator_destroy(self.handle)
            self.handle = None


class _TorchAllocator:
    """The PyTorch allocator adapter: kiln_allocator_create over
    torch.cuda.caching_allocator_alloc / caching_allocator_delete for one
    device. A block freed with a last-use stream other than the one it was
    allocated for is ordered after that stream's work (the allocation stream
    waits for an event recorded there) before PyTorch may hand it out again
    on its allocation stream."""

    def __init__(self, lib, device, ext=None):
        self.device = device
        self.last_error = None
        self._streams = {}  # ptr -> the stream it was allocated for
        self._lock = threading.Lock()
        handle = self._c_callbacks(ext)
        if handle is None:
            self._alloc_cb = _ALLOC_FN(self._alloc)
            self._free_cb = _FREE_FN(self._free)
            handle = ctypes.c_void_p()
            _check(lib, lib.kiln_allocator_create(self._alloc_cb,
                                                  self._free_cb, None,
                                                  ctypes.byref(handle)))
        # The callbacks live as long as this object, which the executables'
        # Python objects and every output keep alive, and the module keeps
        # (_TORCH_ALLOCATORS) for the Client caches that hold the handle.
        self.allocator = _Allocator(lib, handle, keep=self)

    def _c_callbacks(self, ext):
        """The allocator with the extension `ext`'s C callbacks over
        torch._C's raw allocator builtins (_kiln_call.torch_allocator: a few
        microseconds less per block than these methods through ctypes),
        or None without the extension or those builtins (torch changed
        them): then the ctypes callbacks below. Cross-stream frees and
        errors still come here (_free, _record_error)."""
        torch = _torch()
        names = ("_cuda_cudaCachingAllocator_raw_alloc",
                 "_cuda_cudaCachingAllocator_raw_delete",
                 "_cuda_exchangeDevice", "_cuda_maybeExchangeDevice")
        if ext is None or not hasattr(ext, "torch_allocator") or \
                not all(hasattr(torch._C, n) for n in names):
            return None
        handle, self._c_state = ext.torch_allocator(
            *(getattr(torch._C, n) for n in names), self._free,
            self._record_error, self._streams, self.device)
        return ctypes.c_void_p(handle)

    def _record_error(self, e):
        self.last_error = e

    def _stream(self, torch, handle):
        if not handle:
            return torch.cuda.default_stream(self.device)
        return torch.cuda.ExternalStream(handle, device=self.device)

    def _alloc(self, nbytes, stream, user):
        try:
            torch = _torch()
            ptr = torch.cuda.caching_allocator_alloc(nbytes, self.device,
                                                     stream or 0)
            with self._lock:
                self._streams[ptr] = stream or 0
            return ptr
        except BaseException as e:  # noqa: BLE001 (must not unwind into C)
            self.last_error = e
            return 0

    def _free(self, ptr, nbytes, last_use_stream, user):
        try:
            torch = _torch()
            last_use = last_use_stream or 0
            with self._lock:
                alloc_stream = self._streams.pop(ptr, last_use)
            if last_use != alloc_stream:
                event = torch.cuda.Event()
                event.record(self._stream(torch, last_use))
                self._stream(torch, alloc_stream).wait_event(event)
            torch.cuda.caching_allocator_delete(ptr)
        except BaseException as e:  # noqa: BLE001
            self.last_error = e


_TORCH_ALLOCATORS = {}  # device -> _TorchAllocator, for the process


def _torch_allocator(lib, device):
    ext = extension()  # before _lib_lock, which loading it takes
    with _lib_lock:
        a = _TORCH_ALLOCATORS.get(device)
        if a is None:
            a = _TORCH_ALLOCATORS[device] = _TorchAllocator(lib, device, ext)
        return a


class CudaOutput:
    """One output of a run: owns the Kiln output (kiln_cuda_tensor) and
    frees it when released or collected. Exposes __cuda_array_interface__,
    so torch.as_tensor / CuPy / Numba view it without a copy (and keep this
    object alive)."""

    def __init__(self, lib, handle, device, keep):
        self._lib = lib
        self._handle = handle
        self._keep = keep  # the allocator adapter, for its callbacks
        self.device = device
        self.data_ptr = lib.kiln_cuda_tensor_data(handle)
        code = lib.kiln_cuda_tensor_dtype(handle)
        self.dtype, _, self._typestr = _DTYPES[code]
        rank = lib.kiln_cuda_tensor_rank(handle)
        sizes = lib.kiln_cuda_tensor_sizes(handle)
        strides = lib.kiln_cuda_tensor_strides(handle)
        self.shape = tuple(sizes[i] for i in range(rank))
        self.strides = tuple(strides[i] for i in range(rank))  # elements
        self.nbytes = lib.kiln_cuda_tensor_nbytes(handle)

    @property
    def __cuda_array_interface__(self):
        itemsize = _DTYPES[_DTYPE_CODES[self.dtype]][1]
        return {
            "shape": self.shape,
            "typestr": self._typestr,
            "data": (self.data_ptr, False),
            "strides": tuple(s * itemsize for s in self.strides),
            "version": 3,
        }

    def set_last_use_stream(self, stream):
        """Names the stream whose work uses the memory last (one stream)."""
        if self._handle:
            self._lib.kiln_cuda_tensor_set_last_use_stream(
                self._handle, ctypes.c_void_p(_stream_handle(stream,
                                                             self.device)))

    def release(self):
        """Gives the memory back now (stream-ordered)."""
        handle, self._handle = self._handle, None
        if handle and self._lib is not None:
            self._lib.kiln_cuda_tensor_destroy(handle)

    def __del__(self):
        self.release()

    def to_torch(self):
        """A torch tensor over this memory, without a copy: the output is
        handed to PyTorch through DLPack (a "dltensor" capsule, which needs
        no NumPy, unlike __cuda_array_interface__), and PyTorch frees it
        through the capsule's deleter when the tensor's storage dies. This
        object is empty afterwards."""
        torch = _torch()
        if self._handle is None:
            raise KilnError(9, "this output was released")
        if self.nbytes == 0:
            self.release()
            return torch.empty(self.shape, dtype=getattr(torch, self.dtype),
                               device=torch.device("cuda", self.device))
        handle, self._handle = self._handle, None
        managed = self._lib.kiln_cuda_tensor_to_dlpack(handle, self.device)
        capsule = None
        try:
            capsule = _capsule_new(managed, b"dltensor", None)
            return torch.from_dlpack(capsule)
        except BaseException:
            # Not taken by PyTorch (it renames the capsule when it does).
            if capsule is None or not _capsule_is_valid(capsule,
                                                        b"used_dltensor"):
                self._lib.kiln_dlpack_delete(managed)
            raise


def _describe(exe, lib, prefix: str, handle) -> None:
    """Sets exe's num_inputs, num_outputs, output_dtypes, output_ranks,
    input_writes and guard_key from the C API's `<prefix>_*` accessors (the
    CPU and CUDA executables have the same ones). input_writes: {graph
    output: input} for the graph's input writes a run stores into the
    input's memory; those graph outputs are not among the num_outputs
    outputs, which are the others in order."""
    def fn(name):
        return getattr(lib, f"{prefix}_{name}")
    exe.num_inputs = fn("num_inputs")(handle)
    exe.num_outputs = fn("num_outputs")(handle)
    exe.output_dtypes = [_DTYPES[fn("output_dtype")(handle, i)][0]
                         for i in range(exe.num_outputs)]
    exe.output_ranks = [fn("output_rank")(handle, i)
                        for i in range(exe.num_outputs)]
    exe.input_writes = {}
    for k in range(fn("num_input_writes")(handle)):
        output, inp = ctypes.c_int(), ctypes.c_int()
        if fn("input_write")(handle, k, ctypes.byref(output),
                             ctypes.byref(inp)) == 0:
            exe.input_writes[output.value] = inp.value
    key = ctypes.create_string_buffer(65)
    fn("guard_key")(handle, key)
    exe.guard_key = key.value.decode()


class CudaExecutable:
    """A loaded CUDA executable (kiln::CudaExecutable). Call it with torch
    tensors; run_raw takes device pointers."""

    def __init__(self, lib, handle, allocator_keep):
        self._lib = lib
        self._handle = handle
        self._allocator_keep = allocator_keep
        self.device = lib.kiln_cuda_executable_device_ordinal(handle)
        _describe(self, lib, "kiln_cuda_executable", handle)
        self._call = None  # the extension's CudaCall for __call__, or False

    def __del__(self):
        handle, self._handle = self._handle, None
        if handle and self._lib is not None:
            self._lib.kiln_cuda_executable_destroy(handle)

    def run_raw(self, inputs, stream=0):
        """Runs on raw device memory: inputs are (data_ptr, dtype name,
        sizes, strides in elements); stream a CUstream as int (0: the legacy
        default stream). Returns CudaOutputs."""
        n = len(inputs)
        views = (_TensorView * max(n, 1))()
        keep = []
        for i, (ptr, dtype, sizes, strides) in enumerate(inputs):
            if dtype not in _DTYPE_CODES:
                raise KilnError(3, f"input {i}: dtype {dtype!r} is not one of "
                                f"{sorted(_DTYPE_CODES)}")
            if len(sizes) != len(strides):
                raise KilnError(3, f"input {i}: {len(sizes)} sizes but "
                                f"{len(strides)} strides")
            s = (ctypes.c_int64 * max(len(sizes), 1))(*sizes)
            st = (ctypes.c_int64 * max(len(strides), 1))(*strides)
            keep += [s, st]
            views[i] = _TensorView(ptr, _DTYPE_CODES[dtype], len(sizes), s, st)
        outs = (ctypes.c_void_p * max(self.num_outputs, 1))()
        _check(self._lib, self._lib.kiln_cuda_executable_run(
            self._handle, views, n, ctypes.c_void_p(stream), outs,
            self.num_outputs))
        return [CudaOutput(self._lib, outs[i], self.device,
                           self._allocator_keep)
                for i in range(self.num_outputs)]

    def run_into(self, inputs, outputs):
        """Runs on torch CUDA tensors of this executable's device, writing
        output o into outputs[o] (contiguous torch tensors of the output's
        dtype and sizes, e.g. torch.empty: memory PyTorch owns, as CUDA
        graph trees require), enqueued on torch's current stream. Errors:
        KilnError as kiln_cuda_executable_run_into (FAILED_PRECONDITION:
        the program needs more memory for an output; use __call__)."""
        torch = _torch_dtypes()
        in_views, keep_in = _views(inputs, "input")
        out_views, keep_out = _views(outputs, "output")
        stream = torch.cuda.current_stream(self.device).cuda_stream
        _check(self._lib, self._lib.kiln_cuda_executable_run_into(
            self._handle, in_views, len(inputs), ctypes.c_void_p(stream),
            out_views, len(outputs)))
        del keep_in, keep_out

    def check_index_errors(self, stream=None, wait=True):
        """Raises KilnIndexError (an IndexError) when a run read an index
        out of range (PyTorch's device-side assert; otherwise the next run
        raises it), clearing it; with wait, first synchronises `stream` (a
        CUstream as int; default: torch's current stream of the device)."""
        if stream is None:
            torch = _torch()
            stream = torch.cuda.current_stream(self.device).cuda_stream
        _check(self._lib, self._lib.kiln_cuda_executable_check_index_errors(
            self._handle, ctypes.c_void_p(stream), 1 if wait else 0))

    def call_path(self, input_indices, outputs, tuple_output=True,
                  _keep_alive=True):
        """The extension's callable f(*args) for this executable, or None
        without the extension: as CpuExecutable.call_path, on CUDA tensors
        of the executable's device, enqueued on torch's current stream of
        that device (no sync); new outputs are torch tensors over the Kiln
        outputs (DLPack, as __call__ returns them)."""
        ext = _ready_extension(cuda=True)
        if ext is None:
            return None
        torch = _torch()
        dtypes = tuple(getattr(torch, d) for d in self.output_dtypes)
        return ext.CudaCall(
            self._handle.value, self if _keep_alive else None, self.device,
            torch.device("cuda", self.device), tuple(input_indices),
            _result_entries(outputs), dtypes,
            bool(tuple_output))

    def __call__(self, *tensors, stream=None):
        """Runs on torch CUDA tensors of this executable's device (strided
        views allowed, as the guards permit) and returns new contiguous
        torch tensors, enqueued on `stream` (default: the current stream).
        See the module docstring for the stream rules."""
        if stream is None and len(tensors) == self.num_inputs:
            call = self._call
            if call is None:
                call = self._call = self.call_path(
                    range(self.num_inputs),
                    [("kiln", j) for j in range(self.num_outputs)],
                    _keep_alive=False) or False
            if call:
                try:
                    return list(call(*tensors))
                except KilnError as e:
                    cause = getattr(self._allocator_keep, "last_error", None)
                    if e.code == 8 and cause is not None:
                        raise KilnError(e.code, f"{e.message} ({cause!r})") \
                            from cause
                    raise
        torch = _torch()
        handle = _stream_handle(stream, self.device)
        current = torch.cuda.current_stream(self.device).cuda_stream
        inputs = []
        for i, t in enumerate(tensors):
            if not isinstance(t, torch.Tensor):
                raise KilnError(3, f"input {i} is a {type(t).__name__}, not a "
                                "torch.Tensor")
            if t.device.type != "cuda" or t.device.index != self.device:
                raise KilnError(3, f"input {i} is on {t.device}, the "
                                f"executable on cuda:{self.device}")
            dtype = str(t.dtype).replace("torch.", "")
            inputs.append((t.data_ptr(), dtype, tuple(t.shape), t.stride()))
        if handle != current:
            s = torch.cuda.ExternalStream(handle, device=self.device)
            for t in tensors:
                t.record_stream(s)
        try:
            outputs = self.run_raw(inputs, handle)
        except KilnError as e:
            cause = getattr(self._allocator_keep, "last_error", None)
            if e.code == 8 and cause is not None:  # RESOURCE_EXHAUSTED
                raise KilnError(e.code, f"{e.message} ({cause!r})") from cause
            raise
        return [o.to_torch() for o in outputs]


def _views(tensors, what):
    """A ctypes array of kiln_tensor_views over torch tensors (and what
    keeps its sizes/strides arrays alive)."""
    n = len(tensors)
    views = (_TensorView * max(n, 1))()
    keep = []
    for i, t in enumerate(tensors):
        code = _TORCH_DTYPE_CODES.get(t.dtype)
        if code is None:
            raise _dtype_error(what, i, t.dtype)
        rank = t.dim()
        s = (ctypes.c_int64 * max(rank, 1))(*t.shape)
        st = (ctypes.c_int64 * max(rank, 1))(*t.stride())
        keep += [s, st]
        views[i] = _TensorView(t.data_ptr(), code, rank, s, st)
    return views, keep


_TORCH_DTYPE_CODES = {}  # torch.dtype -> KILN_*, filled on first use


def _torch_dtypes():
    torch = _torch()
    if not _TORCH_DTYPE_CODES:
        for code, (name, _, _) in _DTYPES.items():
            _TORCH_DTYPE_CODES[getattr(torch, name)] = code
    return torch


class CpuExecutable:
    """A loaded CPU executable (kiln_cpu_executable): runs over torch CPU
    tensors without copies. Inputs may be strided views with storage
    offsets, as the graph declared them (the guards check); outputs are
    written into tensors the caller allocates (run_into) or new contiguous
    tensors (__call__). Thread-safe."""

    def __init__(self, lib, handle):
        self._lib = lib
        self._handle = handle
        _describe(self, lib, "kiln_cpu_executable", handle)
        self._local = threading.local()  # .prepared: layout -> views
        self._call = None  # the extension's CpuCall for __call__, or False

    def __del__(self):
        handle, self._handle = self._handle, None
        if handle and self._lib is not None:
            self._lib.kiln_cpu_executable_destroy(handle)

    def output_sizes(self, inputs):
        """The outputs' sizes for these torch CPU tensors (guards checked):
        a list of tuples."""
        _torch_dtypes()
        views, _keep = _views(inputs, "input")
        total = sum(self.output_ranks)
        sizes = (ctypes.c_int64 * max(total, 1))()
        _check(self._lib, self._lib.kiln_cpu_executable_output_sizes(
            self._handle, views, len(inputs), sizes, total))
        out, at = [], 0
        for rank in self.output_ranks:
            out.append(tuple(sizes[at:at + rank]))
            at += rank
        return out

    def run_into(self, inputs, outputs):
        """Runs on torch CPU tensors `inputs`, writing each output into the
        matching contiguous tensor of `outputs` (dtype and sizes as the
        program writes them). Returns when they are written."""
        # The views' sizes/strides arrays are kept per layout (a few per
        # executable and thread): a call with a known layout only sets the
        # pointers.
        cache = getattr(self._local, "prepared", None)
        if cache is None:
            cache = self._local.prepared = {}
        key = tuple((t.dtype, t.shape, t.stride()) for t in inputs) + \
            tuple((t.dtype, t.shape, t.stride()) for t in outputs)
        prepared = cache.get(key)
        if prepared is None:
            _torch_dtypes()
            prepared = (_views(inputs, "input"), _views(outputs, "output"))
            if len(cache) >= 16:
                cache.pop(next(iter(cache)))
            cache[key] = prepared
        (in_views, _), (out_views, _) = prepared
        for i, t in enumerate(inputs):
            in_views[i].data = t.data_ptr()
        for i, t in enumerate(outputs):
            out_views[i].data = t.data_ptr()
        _check(self._lib, self._lib.kiln_cpu_executable_run(
            self._handle, in_views, len(inputs), out_views, len(outputs)))

    def call_path(self, input_indices, outputs, tuple_output=True,
                  static_sizes=None, _keep_alive=True):
        """The extension's callable f(*args) for this executable, or None
        without the extension (module docstring). Kiln input k is
        args[input_indices[k]]; f returns, for each entry of `outputs`,
        ("kiln", j): Kiln output j as a new contiguous tensor,
        ("input", i): args[i] itself, or a view ("view_input", i, sizes,
        strides, offset): args[i].as_strided(sizes, strides,
        args[i].storage_offset() + offset), ("view_kiln", j, sizes, strides,
        offset): Kiln output j's as_strided(sizes, strides, offset); as a
        tuple, or its only entry when not tuple_output. static_sizes: the outputs' sizes when they do not
        depend on the inputs' (no symbols), else None (asked per call).
        Guards and errors as for run_into (KilnError)."""
        ext = _ready_extension()
        if ext is None:
            return None
        torch = _torch()
        dtypes = tuple(getattr(torch, d) for d in self.output_dtypes)
        # The callable keeps this executable alive, except the one that
        # __call__ caches on it (no cycle: the extension's objects are not
        # tracked by the garbage collector).
        return ext.CpuCall(
            self._handle.value, self if _keep_alive else None,
            tuple(input_indices),
            _result_entries(outputs), dtypes,
            tuple(self.output_ranks),
            None if static_sizes is None else
            tuple(tuple(int(d) for d in s) for s in static_sizes),
            bool(tuple_output))

    def __call__(self, *tensors):
        """Runs on torch CPU tensors and returns new contiguous tensors."""
        if self._call is None:
            self._call = self.call_path(
                range(self.num_inputs),
                [("kiln", j) for j in range(self.num_outputs)],
                _keep_alive=False) or False
        if self._call and len(tensors) == self.num_inputs:
            return list(self._call(*tensors))
        torch = _torch_dtypes()
        for i, t in enumerate(tensors):
            if not isinstance(t, torch.Tensor) or t.device.type != "cpu":
                raise KilnError(3, f"input {i} is not a CPU torch.Tensor")
        outputs = [torch.empty(sizes, dtype=getattr(torch, dtype))
                   for sizes, dtype in zip(self.output_sizes(tensors),
                                           self.output_dtypes)]
        self.run_into(tensors, outputs)
        return outputs


_RESULT_KINDS = {"kiln": 0, "input": 1, "view_input": 2, "view_kiln": 3}


def _result_entries(outputs):
    """call_path's `outputs` in the extension's form (kiln_call.c)."""
    entries = []
    for kind, i, *view in outputs:
        entry = (_RESULT_KINDS[kind], int(i))
        if view:
            sizes, strides, offset = view
            entry += (tuple(int(v) for v in sizes),
                      tuple(int(v) for v in strides), int(offset))
        entries.append(entry)
    return tuple(entries)


def supported_ops():
    """The Core ATen overloads Kiln compiles ("aten.add.Tensor", ...), from
    the client library's op registry (kiln_supported_ops), as a frozenset."""
    lib = load_library()
    text = lib.kiln_supported_ops().decode()
    return frozenset(line for line in text.split("\n") if line)


def prepare_cpu_runtime() -> None:
    """Loads the CPU runtime's BLAS and runs one small product
    (kiln_cpu_runtime_prepare), paying the library's one-time start-up
    (about 70 ms for oneDNN on the 2-core machine) now rather than in the
    first run of a CPU executable. The GIL is released meanwhile: the
    backend calls it on a thread of its own while Dynamo traces. Raises
    KilnError when no BLAS loads."""
    lib = load_library()
    _check(lib, lib.kiln_cpu_runtime_prepare())


class Client:
    """kiln::Client for CPU and CUDA executables (kiln_c.h). `server`: "HOST:PORT"
    or "unix:PATH", or a fleet's replicas as "HOST:PORT,HOST:PORT,..." (keys
    spread over them, failover); None: $KILN_SERVER, else 127.0.0.1:7733.

    kilnd with tokens and TLS (README.md, "Running kilnd for a team"):
    `token` (else $KILN_TOKEN), `token_file` (its first line; else
    $KILN_TOKEN_FILE), `tls_ca` (PEM CA bundle, TLS; else $KILN_TLS_CA),
    `tls_cert`/`tls_key` (mTLS; else $KILN_TLS_CERT/$KILN_TLS_KEY),
    `tls_server_name` (else $KILN_TLS_SERVER_NAME).

    `trusted_keys`: kilnd public keys (64 hex digits each; a list or a
    comma-separated string; else $KILN_TRUSTED_KEYS): artifacts not signed
    by one of them are refused (KilnError PERMISSION_DENIED) before any of
    their code is loaded. Raises KilnError (INVALID_ARGUMENT for a malformed
    key, NOT_FOUND for a file that cannot be read)."""

    def __init__(self, server=None, rpc_deadline_seconds=0.0, max_retries=-1,
                 token=None, token_file=None, tls_ca=None, tls_cert=None,
                 tls_key=None, tls_server_name=None, trusted_keys=None):
        self._lib = load_library()
        self._handle = None
        self._kiln_allocators = {}  # device -> _Allocator (allocator="kiln")
        handle = ctypes.c_void_p()

        def c_str(value):
            return os.fsencode(value) if value else None

        if trusted_keys is not None and not isinstance(trusted_keys, str):
            trusted_keys = ",".join(trusted_keys)
        _check(self._lib, self._lib.kiln_client_create_with_trust(
            server.encode() if server else None, float(rpc_deadline_seconds),
            int(max_retries), c_str(token), c_str(token_file), c_str(tls_ca),
            c_str(tls_cert), c_str(tls_key), c_str(tls_server_name),
            c_str(trusted_keys), ctypes.byref(handle)))
        self._handle = handle

    def close(self):
        handle, self._handle = self._handle, None
        if handle:
            self._lib.kiln_client_destroy(handle)
        self._kiln_allocators.clear()

    def __del__(self):
        self.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def counters(self):
        """{"local_hits", "lookup_hits", "compiles"} so far."""
        values = [ctypes.c_uint64() for _ in range(3)]
        self._lib.kiln_client_counters(self._handle,
                                       *[ctypes.byref(v) for v in values])
        return dict(zip(("local_hits", "lookup_hits", "compiles"),
                        (v.value for v in values)))

    def cpu_executable(self, graph_json, target="cpu", fast_math=False,
                       options=0):
        """The executable for a kiln.v1.Graph (JSON text, bytes, or a dict in
        the protobuf JSON mapping) compiled by kilnd for this host's CPU
        ("cpu") and loaded here. options: OPTION_* flags (fast_math adds
        OPTION_FAST_MATH). Raises KilnError."""
        if self._handle is None:
            raise KilnError(9, "the client is closed")
        if isinstance(graph_json, dict):
            graph_json = json.dumps(graph_json)
        if isinstance(graph_json, str):
            graph_json = graph_json.encode()
        out = ctypes.c_void_p()
        _check(self._lib, self._lib.kiln_client_get_cpu_executable(
            self._handle, graph_json, len(graph_json), target.encode(),
            int(options) | (OPTION_FAST_MATH if fast_math else 0),
            ctypes.byref(out)))
        return CpuExecutable(self._lib, out)

    def cuda_executable(self, graph_json, target="sm_90", fast_math=False,
                        allocator="torch", device=None, options=0):
        """The executable for a kiln.v1.Graph (JSON text, bytes, or a dict
        in the protobuf JSON mapping, as examples/graphs/*.json) compiled by
        kilnd for `target`, loaded on CUDA device `device` (default: torch's
        current device, else 0). allocator: "torch" or "kiln" (module
        docstring). options: OPTION_* flags (fast_math adds
        OPTION_FAST_MATH). Raises KilnError (FAILED_PRECONDITION without a
        CUDA driver or device)."""
        if self._handle is None:
            raise KilnError(9, "the client is closed")
        if isinstance(graph_json, dict):
            graph_json = json.dumps(graph_json)
        if isinstance(graph_json, str):
            graph_json = graph_json.encode()
        if device is None:
            device = _torch().cuda.current_device() if allocator == "torch" \
                else 0
        if allocator == "torch":
            _torch()  # fails early, with the reason, without PyTorch
            keep = _torch_allocator(self._lib, int(device))
            alloc = keep.allocator
        elif allocator == "kiln":
            alloc = self._kiln_allocators.get(device)
            if alloc is None:
                handle = ctypes.c_void_p()
                status = self._lib.kiln_allocator_create_caching(
                    int(device), ctypes.byref(handle))
                if status:
                    # No driver or device: let the executable request say so
                    # (after the daemon compiled it), with its own allocator.
                    self._lib.kiln_status_free(status)
                else:
                    alloc = _Allocator(self._lib, handle)
                    self._kiln_allocators[device] = alloc
            keep = alloc
        else:
            raise KilnError(3, f"allocator={allocator!r}: expected 'torch' or "
                            "'kiln'")
        out = ctypes.c_void_p()
        _check(self._lib, self._lib.kiln_client_get_cuda_executable(
            self._handle, graph_json, len(graph_json), target.encode(),
            int(options) | (OPTION_FAST_MATH if fast_math else 0), int(device),
            alloc.handle if alloc is not None else None, ctypes.byref(out)))
        return CudaExecutable(self._lib, out, keep)
