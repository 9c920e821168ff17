/* _kiln_call: the fast call path of python/kiln (issue 15 item 6). A
 * CPython extension over the C API (client/kiln_c.h, libkiln_c.so) and
 * nothing else: no torch C++ headers, no compiler. It runs a loaded CPU
 * executable on torch tensors with as little Python work as a call allows:
 * per input one attribute read (dtype, shape, is_cpu) and two method calls
 * (data_ptr(), stride()), per output one torch.empty and one data_ptr(),
 * the program with the GIL released, and the result tuple built here.
 *
 * python/kiln/_binding.py loads it (after libkiln_c.so, whose soname this
 * module's NEEDED entry then matches, so one Kiln library stays loaded) and
 * falls back to ctypes when it is absent or KILN_NO_EXTENSION=1.
 *
 *   _kiln_call.init(KilnError, dtype_codes, empty, tensor_type, dtype_error)
 *   call = _kiln_call.CpuCall(exe_handle, input_indices, outputs,
 *                             out_dtypes, out_ranks, static_sizes,
 *                             tuple_output)
 *   result = call(*args)
 *
 * input_indices: for each Kiln input, the index in args of its tensor.
 * outputs: for each result entry, (0, j) for Kiln output j (a new tensor)
 * or (1, i) for args[i] itself (the same object, never a copy), or a view:
 * (2, i, sizes, strides, offset) for
 * args[i].as_strided(sizes, strides, args[i].storage_offset() + offset),
 * (3, j, sizes, strides, offset) for Kiln output j's
 * as_strided(sizes, strides, offset) (sizes and strides tuples of ints).
 * static_sizes: a tuple of size tuples per Kiln output, or None: then the
 * sizes come from kiln_cpu_executable_output_sizes per call (symbols).
 * tuple_output: a tuple result, else its only entry.
 *
 * CUDA executables the same way (CudaCall): inputs must be CUDA tensors of
 * the executable's device; the program is enqueued on torch's current
 * stream of that device (init_cuda's current_raw_stream) without a sync;
 * each output, allocated by the executable's allocator, is handed to torch
 * as a DLPack capsule (init_cuda's from_dlpack), whose deleter frees it.
 *
 *   _kiln_call.init_cuda(torch._C._cuda_getCurrentRawStream,
 *                        torch._C._from_dlpack)
 *   call = _kiln_call.CudaCall(exe_handle, owner, device, torch_device,
 *                              input_indices, outputs, out_dtypes,
 *                              tuple_output)
 *
 * Errors: the C API's status as KilnError(code, message), the message
 * unchanged; an input that is not a CPU torch.Tensor or has a dtype Kiln
 * does not run is INVALID_ARGUMENT (the dtype one from dtype_error, the
 * ctypes path's message). Every guard the runtime checks stays: the
 * program runs through kiln_cpu_executable_run.
 *
 * Thread-safety: a CpuCall keeps no per-call state; calls may run from
 * several threads (the GIL is released around a CPU program; a CUDA
 * program, which only enqueues work, keeps it).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

#include "client/kiln_c.h"

/* ---- module state (set once by init) ---------------------------------- */

static PyObject* g_error_type;  /* kiln.KilnError */
static PyObject* g_dtype_codes; /* {torch.dtype: KILN_*} */
static PyObject* g_empty;       /* torch.empty */
static PyObject* g_tensor_type; /* torch.Tensor */
static PyObject* g_dtype_error; /* (what, index, dtype) -> KilnError */
static PyObject* g_str_shape;
static PyObject* g_str_stride;
static PyObject* g_str_data_ptr;
static PyObject* g_str_dtype;
static PyObject* g_str_is_cpu;
static PyObject* g_str_get_device;
static PyObject* g_str_as_strided;
static PyObject* g_str_storage_offset;
static PyObject* g_current_stream; /* device -> CUstream as int, or NULL */
static PyObject* g_from_dlpack;    /* capsule -> torch.Tensor, or NULL */
static PyObject* g_kwnames_dtype; /* ("dtype",) */

static void SetKilnError(int code, const char* message) {
  PyObject* err = PyObject_CallFunction(g_error_type, "is", code, message);
  if (err != NULL) {
    PyErr_SetObject((PyObject*)Py_TYPE(err), err);
    Py_DECREF(err);
  }
}

/* Raises the status as KilnError and frees it. */
static void RaiseStatus(kiln_status* status) {
  SetKilnError(kiln_status_code(status), kiln_status_message(status));
  kiln_status_free(status);
}

static PyObject* Init(PyObject* self, PyObject* args) {
  PyObject *error, *codes, *empty, *tensor, *dtype_error;
  if (!PyArg_ParseTuple(args, "OO!OOO:init", &error, &PyDict_Type, &codes,
                        &empty, &tensor, &dtype_error)) {
    return NULL;
  }
  if (!PyType_Check(tensor)) {
    PyErr_SetString(PyExc_TypeError, "init: tensor_type must be a type");
    return NULL;
  }
  Py_XSETREF(g_error_type, Py_NewRef(error));
  Py_XSETREF(g_dtype_codes, Py_NewRef(codes));
  Py_XSETREF(g_empty, Py_NewRef(empty));
  Py_XSETREF(g_tensor_type, Py_NewRef(tensor));
  Py_XSETREF(g_dtype_error, Py_NewRef(dtype_error));
  Py_RETURN_NONE;
}

/* ---- reading a tensor -------------------------------------------------- */

/* One input's shape and stride tuples (new references), held while its
 * view's dims are copied out of them. */
typedef struct {
  PyObject* shape;
  PyObject* stride;
} TensorRefs;

static void ReleaseRefs(TensorRefs* refs, Py_ssize_t n) {
  for (Py_ssize_t i = 0; i < n; ++i) {
    Py_CLEAR(refs[i].shape);
    Py_CLEAR(refs[i].stride);
  }
}

static int InvalidInput(Py_ssize_t i, const char* why) {
  char message[160];
  snprintf(message, sizeof message, "input %zd %s", i, why);
  SetKilnError(KILN_INVALID_ARGUMENT, message);
  return -1;
}

static int AsUint64(PyObject* value, uint64_t* out) {
  if (value == NULL) return -1;
  *out = PyLong_AsUnsignedLongLong(value);
  Py_DECREF(value);
  return (*out == (uint64_t)-1 && PyErr_Occurred()) ? -1 : 0;
}

/* Reads input `i`: dtype code, data pointer, shape and stride tuples into
 * view/refs (sizes/strides pointers are set later, once the buffer's size
 * is known). */
static int ReadInput(PyObject* t, Py_ssize_t i, int cuda_device,
                     kiln_tensor_view* view, TensorRefs* refs) {
  if (cuda_device < 0) {
    if (!PyObject_TypeCheck(t, (PyTypeObject*)g_tensor_type)) {
      return InvalidInput(i, "is not a CPU torch.Tensor");
    }
    PyObject* is_cpu = PyObject_GetAttr(t, g_str_is_cpu);
    if (is_cpu == NULL) return -1;
    Py_DECREF(is_cpu);
    if (is_cpu != Py_True) return InvalidInput(i, "is not a CPU torch.Tensor");
  } else {
    if (!PyObject_TypeCheck(t, (PyTypeObject*)g_tensor_type)) {
      return InvalidInput(i, "is not a CUDA torch.Tensor");
    }
    PyObject* device = PyObject_CallMethodNoArgs(t, g_str_get_device);
    if (device == NULL) return -1;
    long index = PyLong_AsLong(device);
    Py_DECREF(device);
    if (index == -1 && PyErr_Occurred()) return -1;
    if (index != cuda_device) {
      char why[96];
      snprintf(why, sizeof why,
               "is not a CUDA tensor of device %d (the executable's)",
               cuda_device);
      return InvalidInput(i, why);
    }
  }
  PyObject* dtype = PyObject_GetAttr(t, g_str_dtype);
  if (dtype == NULL) return -1;
  PyObject* code = PyDict_GetItemWithError(g_dtype_codes, dtype); /* borrowed */
  if (code == NULL) {
    if (!PyErr_Occurred()) {
      PyObject* err =
          PyObject_CallFunction(g_dtype_error, "snO", "input", i, dtype);
      if (err != NULL) {
        PyErr_SetObject((PyObject*)Py_TYPE(err), err);
        Py_DECREF(err);
      }
    }
    Py_DECREF(dtype);
    return -1;
  }
  Py_DECREF(dtype);
  view->dtype = (int32_t)PyLong_AsLong(code);
  if (AsUint64(PyObject_CallMethodNoArgs(t, g_str_data_ptr), &view->data)) {
    return -1;
  }
  refs->shape = PyObject_GetAttr(t, g_str_shape);
  if (refs->shape == NULL) return -1;
  refs->stride = PyObject_CallMethodNoArgs(t, g_str_stride);
  if (refs->stride == NULL) return -1;
  if (!PyTuple_Check(refs->shape) || !PyTuple_Check(refs->stride) ||
      PyTuple_GET_SIZE(refs->shape) != PyTuple_GET_SIZE(refs->stride)) {
    return InvalidInput(i, "has a shape or stride that is not a tuple");
  }
  view->rank = (int32_t)PyTuple_GET_SIZE(refs->shape);
  return 0;
}

/* Copies a tuple of ints into dims. */
static int TupleToInt64(PyObject* tuple, int64_t* dims) {
  Py_ssize_t n = PyTuple_GET_SIZE(tuple);
  for (Py_ssize_t d = 0; d < n; ++d) {
    dims[d] = PyLong_AsLongLong(PyTuple_GET_ITEM(tuple, d));
    if (dims[d] == -1 && PyErr_Occurred()) return -1;
  }
  return 0;
}

/* ---- CpuCall ------------------------------------------------------------ */

typedef struct {
  PyObject_HEAD
  vectorcallfunc vectorcall;
  const kiln_cpu_executable* exe; /* owned by the Python CpuExecutable */
  const kiln_cuda_executable* cuda_exe; /* CudaCall: instead of exe */
  int cuda_device;                      /* CudaCall: its device, else -1 */
  PyObject* device_obj;                 /* CudaCall: torch.device */
  PyObject* owner; /* keeps the executable (and its allocator) alive */
  Py_ssize_t num_inputs;
  Py_ssize_t* input_indices;
  Py_ssize_t num_outputs; /* Kiln outputs */
  PyObject* out_dtypes;   /* tuple of torch.dtype */
  int32_t* out_codes;
  int32_t* out_ranks;
  Py_ssize_t total_out_rank;
  PyObject* static_sizes; /* tuple of size tuples, or NULL */
  int64_t* static_dims;   /* total_out_rank entries, when static */
  Py_ssize_t num_results;
  int* result_kind; /* 0 Kiln output, 1 input, 2/3 a view of one */
  Py_ssize_t* result_index;
  PyObject** result_view; /* kinds 2, 3: (sizes, strides, offset) */
  int tuple_output;
} CpuCall;

/* A call's buffers: small calls use the stack, larger ones one PyMem
 * block. */
enum { kStackTensors = 16, kStackDims = 128 };

typedef struct {
  kiln_tensor_view views_stack[2 * kStackTensors];
  PyObject* outs_stack[kStackTensors];
  int64_t dims_stack[kStackDims];
  kiln_tensor_view* views; /* inputs, then outputs */
  PyObject** outs;         /* the new Kiln outputs */
  int64_t* dims;           /* inputs' sizes and strides, outputs' sizes */
  void* heap;
} Scratch;

/* For `tensors` (inputs + outputs) views and `dims` int64s. */
static int ScratchInit(Scratch* s, Py_ssize_t tensors, Py_ssize_t dims) {
  s->heap = NULL;
  if (tensors <= kStackTensors && dims <= kStackDims) {
    s->views = s->views_stack;
    s->outs = s->outs_stack;
    s->dims = s->dims_stack;
  } else {
    size_t bytes =
        (size_t)tensors * (sizeof(kiln_tensor_view) + sizeof(PyObject*)) +
        (size_t)dims * sizeof(int64_t);
    char* p = PyMem_Malloc(bytes ? bytes : 1);
    if (p == NULL) {
      PyErr_NoMemory();
      return -1;
    }
    s->heap = p;
    s->views = (kiln_tensor_view*)p;
    p += (size_t)tensors * sizeof(kiln_tensor_view);
    s->outs = (PyObject**)p;
    p += (size_t)tensors * sizeof(PyObject*);
    s->dims = (int64_t*)p;
  }
  memset(s->outs, 0, (size_t)tensors * sizeof(PyObject*));
  return 0;
}

/* A new tensor of `sizes` (a tuple) and output o's dtype: torch.empty. */
static PyObject* NewOutput(CpuCall* self, Py_ssize_t o, PyObject* sizes) {
  PyObject* argv[2] = {sizes, PyTuple_GET_ITEM(self->out_dtypes, o)};
  return PyObject_Vectorcall(g_empty, argv, 1, g_kwnames_dtype);
}

static PyObject* SizesTuple(const int64_t* dims, int32_t rank) {
  PyObject* t = PyTuple_New(rank);
  if (t == NULL) return NULL;
  for (int32_t d = 0; d < rank; ++d) {
    PyObject* v = PyLong_FromLongLong(dims[d]);
    if (v == NULL) {
      Py_DECREF(t);
      return NULL;
    }
    PyTuple_SET_ITEM(t, d, v);
  }
  return t;
}

/* Runs the program on args; on success outs[0 .. num_outputs) hold the new
 * Kiln outputs (new references). */
/* Copies the inputs' shape/stride tuples into s->dims and points the
 * views (s->views[0 .. n)) at them; returns the dims that follow. */
static int64_t* FillInputDims(Scratch* s, const kiln_tensor_view* in_views,
                              const TensorRefs* refs, Py_ssize_t n) {
  memcpy(s->views, in_views, (size_t)n * sizeof(kiln_tensor_view));
  int64_t* dims = s->dims;
  for (Py_ssize_t i = 0; i < n; ++i) {
    int32_t rank = s->views[i].rank;
    if (TupleToInt64(refs[i].shape, dims) ||
        TupleToInt64(refs[i].stride, dims + rank)) {
      return NULL;
    }
    s->views[i].sizes = dims;
    s->views[i].strides = dims + rank;
    dims += 2 * rank;
  }
  return dims;
}

/* A "dltensor" capsule's destructor: frees a DLManagedTensor no consumer
 * took (one that torch took is renamed "used_dltensor"). */
static void DlpackCapsuleDestructor(PyObject* capsule) {
  if (PyCapsule_IsValid(capsule, "dltensor")) {
    kiln_dlpack_delete(PyCapsule_GetPointer(capsule, "dltensor"));
  } else {
    PyErr_Clear();
  }
}

/* A torch tensor over Kiln output `handle` (taken over), through DLPack. */
static PyObject* CudaOutputTensor(CpuCall* self, Py_ssize_t o,
                                  kiln_cuda_tensor* handle) {
  if (kiln_cuda_tensor_nbytes(handle) == 0) {
    /* Nothing to hand over: an empty tensor of the sizes on the device. */
    int rank = kiln_cuda_tensor_rank(handle);
    PyObject* sizes = SizesTuple(kiln_cuda_tensor_sizes(handle), rank);
    kiln_cuda_tensor_destroy(handle);
    if (sizes == NULL) return NULL;
    PyObject* kwargs = Py_BuildValue(
        "{sOsO}", "dtype", PyTuple_GET_ITEM(self->out_dtypes, o), "device",
        self->device_obj);
    PyObject* args = kwargs ? PyTuple_Pack(1, sizes) : NULL;
    PyObject* t = args ? PyObject_Call(g_empty, args, kwargs) : NULL;
    Py_XDECREF(args);
    Py_XDECREF(kwargs);
    Py_DECREF(sizes);
    return t;
  }
  void* managed = kiln_cuda_tensor_to_dlpack(handle, self->cuda_device);
  PyObject* capsule =
      PyCapsule_New(managed, "dltensor", DlpackCapsuleDestructor);
  if (capsule == NULL) {
    kiln_dlpack_delete(managed);
    return NULL;
  }
  PyObject* t = PyObject_CallOneArg(g_from_dlpack, capsule);
  Py_DECREF(capsule); /* frees it unless torch took it */
  return t;
}

/* The CUDA run: enqueued on the current stream of the executable's device
 * (torch's), outputs from the executable's allocator handed to torch. */
static int RunCuda(CpuCall* self, const kiln_tensor_view* in_views,
                   const TensorRefs* refs, Scratch* s) {
  Py_ssize_t n_in = self->num_inputs, n_out = self->num_outputs;
  if (FillInputDims(s, in_views, refs, n_in) == NULL) return -1;
  PyObject* stream_obj =
      PyObject_CallFunction(g_current_stream, "i", self->cuda_device);
  uint64_t stream;
  if (AsUint64(stream_obj, &stream)) return -1;
  kiln_cuda_tensor* handles_stack[kStackTensors];
  kiln_cuda_tensor** handles = handles_stack;
  if (n_out > kStackTensors) {
    handles = PyMem_Malloc((size_t)n_out * sizeof(kiln_cuda_tensor*));
    if (handles == NULL) {
      PyErr_NoMemory();
      return -1;
    }
  }
  /* With the GIL held, as PyTorch launches its kernels: the run only
   * enqueues work, and each allocation from PyTorch's allocator (the C
   * callbacks below) would otherwise take the GIL back. */
  kiln_status* st = kiln_cuda_executable_run(
      self->cuda_exe, s->views, (size_t)n_in, (void*)(uintptr_t)stream, handles,
      (size_t)n_out);
  int rc = 0;
  if (st != NULL) {
    RaiseStatus(st);
    rc = -1;
  } else {
    for (Py_ssize_t o = 0; o < n_out; ++o) {
      if (rc == 0) {
        s->outs[o] = CudaOutputTensor(self, o, handles[o]);
        if (s->outs[o] == NULL) rc = -1;
      } else {
        kiln_cuda_tensor_destroy(handles[o]);
      }
    }
  }
  if (handles != handles_stack) PyMem_Free(handles);
  return rc;
}

static int RunCore(CpuCall* self, PyObject* const* args, Py_ssize_t nargs,
                   Scratch* s) {
  Py_ssize_t n_in = self->num_inputs, n_out = self->num_outputs;
  /* The inputs' ranks are known once read: read them all first (views and
   * their shape/stride tuples), then size the scratch and copy the dims. */
  Py_ssize_t input_dims = 0;
  TensorRefs refs_small[kStackTensors];
  kiln_tensor_view in_small[kStackTensors];
  TensorRefs* refs = refs_small;
  kiln_tensor_view* in_views = in_small;
  void* heap = NULL;
  if (n_in > kStackTensors) {
    heap = PyMem_Malloc((size_t)n_in *
                        (sizeof(TensorRefs) + sizeof(kiln_tensor_view)));
    if (heap == NULL) {
      PyErr_NoMemory();
      return -1;
    }
    refs = (TensorRefs*)heap;
    in_views = (kiln_tensor_view*)(refs + n_in);
  }
  memset(refs, 0, (size_t)n_in * sizeof(TensorRefs));
  int rc = -1;
  for (Py_ssize_t i = 0; i < n_in; ++i) {
    Py_ssize_t a = self->input_indices[i];
    if (a >= nargs) {
      char message[128];
      snprintf(message, sizeof message,
               "%zd arguments, but Kiln input %zd is argument %zd", nargs, i,
               a);
      SetKilnError(KILN_INVALID_ARGUMENT, message);
      goto done;
    }
    if (ReadInput(args[a], i, self->cuda_device, &in_views[i], &refs[i])) {
      goto done;
    }
    input_dims += 2 * (Py_ssize_t)in_views[i].rank;
  }
  if (ScratchInit(s, n_in + n_out, input_dims + self->total_out_rank)) {
    goto done;
  }
  if (self->cuda_exe != NULL) {
    rc = RunCuda(self, in_views, refs, s);
    goto done;
  }
  int64_t* dims = FillInputDims(s, in_views, refs, n_in);
  if (dims == NULL) goto done;
  kiln_tensor_view* out_views = s->views + n_in;
  int64_t* out_dims = dims;
  if (self->static_sizes != NULL) {
    memcpy(out_dims, self->static_dims,
           (size_t)self->total_out_rank * sizeof(int64_t));
  } else {
    kiln_status* st = kiln_cpu_executable_output_sizes(
        self->exe, s->views, (size_t)n_in, out_dims,
        (size_t)self->total_out_rank);
    if (st != NULL) {
      RaiseStatus(st);
      goto done;
    }
  }
  for (Py_ssize_t o = 0; o < n_out; ++o) {
    int32_t rank = self->out_ranks[o];
    PyObject* sizes;
    if (self->static_sizes != NULL) {
      sizes = Py_NewRef(PyTuple_GET_ITEM(self->static_sizes, o));
    } else {
      sizes = SizesTuple(dims, rank);
      if (sizes == NULL) goto done;
    }
    s->outs[o] = NewOutput(self, o, sizes);
    Py_DECREF(sizes);
    if (s->outs[o] == NULL) goto done;
    out_views[o].dtype = self->out_codes[o];
    out_views[o].rank = rank;
    out_views[o].sizes = dims;
    out_views[o].strides = NULL;
    if (AsUint64(PyObject_CallMethodNoArgs(s->outs[o], g_str_data_ptr),
                 &out_views[o].data)) {
      goto done;
    }
    dims += rank;
  }
  kiln_status* st;
  Py_BEGIN_ALLOW_THREADS
  st = kiln_cpu_executable_run(self->exe, s->views, (size_t)n_in, out_views,
                               (size_t)n_out);
  Py_END_ALLOW_THREADS
  if (st != NULL) {
    RaiseStatus(st);
    goto done;
  }
  rc = 0;
done:
  ReleaseRefs(refs, n_in);
  PyMem_Free(heap);
  return rc;
}

static void ScratchRelease(Scratch* s, Py_ssize_t n_out) {
  if (s->outs != NULL) {
    for (Py_ssize_t o = 0; o < n_out; ++o) Py_CLEAR(s->outs[o]);
  }
  PyMem_Free(s->heap);
}

/* base.as_strided(sizes, strides, offset) for view = (sizes, strides,
 * offset), the offset counted from base's own storage offset when
 * `relative` (an input), else from 0 (a new Kiln output). */
static PyObject* ViewOf(PyObject* base, PyObject* view, int relative) {
  PyObject* offset = Py_NewRef(PyTuple_GET_ITEM(view, 2));
  if (relative) {
    PyObject* own = PyObject_CallMethodNoArgs(base, g_str_storage_offset);
    PyObject* sum = own == NULL ? NULL : PyNumber_Add(own, offset);
    Py_XDECREF(own);
    Py_DECREF(offset);
    if (sum == NULL) return NULL;
    offset = sum;
  }
  PyObject* argv[4] = {base, PyTuple_GET_ITEM(view, 0),
                       PyTuple_GET_ITEM(view, 1), offset};
  PyObject* v = PyObject_VectorcallMethod(
      g_str_as_strided, argv, 4 | PY_VECTORCALL_ARGUMENTS_OFFSET, NULL);
  Py_DECREF(offset);
  return v;
}

static PyObject* CpuCall_vectorcall(PyObject* callable, PyObject* const* args,
                                    size_t nargsf, PyObject* kwnames) {
  CpuCall* self = (CpuCall*)callable;
  Py_ssize_t nargs = PyVectorcall_NARGS(nargsf);
  if (kwnames != NULL && PyTuple_GET_SIZE(kwnames) != 0) {
    PyErr_SetString(PyExc_TypeError, "kiln partition: no keyword arguments");
    return NULL;
  }
  Scratch s;
  s.outs = NULL;
  s.heap = NULL;
  PyObject* result = NULL;
  if (RunCore(self, args, nargs, &s) == 0) {
    result = PyTuple_New(self->num_results);
    if (result != NULL) {
      for (Py_ssize_t r = 0; r < self->num_results; ++r) {
        Py_ssize_t i = self->result_index[r];
        int kind = self->result_kind[r];
        PyObject* v;
        if (kind == 1 || kind == 2) {
          if (i >= nargs) {
            PyErr_SetString(PyExc_TypeError, "kiln partition: too few args");
            Py_CLEAR(result);
            break;
          }
          v = args[i];
        } else {
          v = s.outs[i];
        }
        v = kind >= 2 ? ViewOf(v, self->result_view[r], kind == 2)
                      : Py_NewRef(v);
        if (v == NULL) {
          Py_CLEAR(result);
          break;
        }
        PyTuple_SET_ITEM(result, r, v);
      }
    }
  }
  ScratchRelease(&s, self->num_outputs);
  if (result != NULL && !self->tuple_output) {
    PyObject* only = Py_NewRef(PyTuple_GET_ITEM(result, 0));
    Py_DECREF(result);
    return only;
  }
  return result;
}

static void CpuCall_dealloc(CpuCall* self) {
  Py_XDECREF(self->owner);
  Py_XDECREF(self->device_obj);
  Py_XDECREF(self->out_dtypes);
  Py_XDECREF(self->static_sizes);
  PyMem_Free(self->input_indices);
  PyMem_Free(self->out_codes);
  PyMem_Free(self->out_ranks);
  PyMem_Free(self->static_dims);
  if (self->result_view != NULL) {
    for (Py_ssize_t r = 0; r < self->num_results; ++r) {
      Py_XDECREF(self->result_view[r]);
    }
  }
  PyMem_Free(self->result_kind);
  PyMem_Free(self->result_index);
  PyMem_Free(self->result_view);
  Py_TYPE(self)->tp_free((PyObject*)self);
}

static Py_ssize_t* IndexArray(PyObject* seq, Py_ssize_t* n) {
  PyObject* fast = PySequence_Fast(seq, "expected a sequence of ints");
  if (fast == NULL) return NULL;
  *n = PySequence_Fast_GET_SIZE(fast);
  Py_ssize_t* out = PyMem_Malloc((size_t)(*n ? *n : 1) * sizeof(Py_ssize_t));
  for (Py_ssize_t i = 0; out != NULL && i < *n; ++i) {
    out[i] = PyLong_AsSsize_t(PySequence_Fast_GET_ITEM(fast, i));
    if (out[i] < 0) {
      if (!PyErr_Occurred()) {
        PyErr_SetString(PyExc_ValueError, "negative index");
      }
      PyMem_Free(out);
      out = NULL;
    }
  }
  if (out == NULL && !PyErr_Occurred()) PyErr_NoMemory();
  Py_DECREF(fast);
  return out;
}

static size_t ExeNumInputs(const CpuCall* self) {
  return self->cuda_exe ? kiln_cuda_executable_num_inputs(self->cuda_exe)
                        : kiln_cpu_executable_num_inputs(self->exe);
}
static size_t ExeNumOutputs(const CpuCall* self) {
  return self->cuda_exe ? kiln_cuda_executable_num_outputs(self->cuda_exe)
                        : kiln_cpu_executable_num_outputs(self->exe);
}
static int ExeOutputDtype(const CpuCall* self, size_t o) {
  return self->cuda_exe ? kiln_cuda_executable_output_dtype(self->cuda_exe, o)
                        : kiln_cpu_executable_output_dtype(self->exe, o);
}
static int ExeOutputRank(const CpuCall* self, size_t o) {
  return self->cuda_exe ? kiln_cuda_executable_output_rank(self->cuda_exe, o)
                        : kiln_cpu_executable_output_rank(self->exe, o);
}

static PyObject* CallInit(CpuCall* self, PyObject* inputs, PyObject* outputs,
                          PyObject* dtypes, PyObject* static_sizes,
                          int tuple_output);

static PyObject* CpuCall_new(PyTypeObject* type, PyObject* args,
                             PyObject* kwargs) {
  unsigned long long handle;
  PyObject *owner, *inputs, *outputs, *dtypes, *ranks, *static_sizes;
  int tuple_output;
  static char* kwlist[] = {"handle", "owner", "input_indices", "outputs",
                           "out_dtypes", "out_ranks", "static_sizes",
                           "tuple_output", NULL};
  if (!PyArg_ParseTupleAndKeywords(args, kwargs, "KOOOO!OOp:CpuCall", kwlist,
                                   &handle, &owner, &inputs, &outputs,
                                   &PyTuple_Type, &dtypes, &ranks,
                                   &static_sizes, &tuple_output)) {
    return NULL;
  }
  if (g_dtype_codes == NULL) {
    PyErr_SetString(PyExc_RuntimeError, "_kiln_call.init was not called");
    return NULL;
  }
  (void)ranks; /* the executable's own ranks are authoritative */
  CpuCall* self = (CpuCall*)type->tp_alloc(type, 0);
  if (self == NULL) return NULL;
  self->vectorcall = CpuCall_vectorcall;
  self->exe = (const kiln_cpu_executable*)(uintptr_t)handle;
  self->cuda_device = -1;
  self->owner = Py_NewRef(owner);
  return CallInit(self, inputs, outputs, dtypes, static_sizes, tuple_output);
}

/* CudaCall(handle, owner, device, device_obj, input_indices, outputs,
 * out_dtypes, tuple_output): the same over a kiln_cuda_executable. */
static PyObject* CudaCall_new(PyTypeObject* type, PyObject* args,
                              PyObject* kwargs) {
  unsigned long long handle;
  int device;
  PyObject *owner, *device_obj, *inputs, *outputs, *dtypes;
  int tuple_output;
  static char* kwlist[] = {"handle", "owner", "device", "device_obj",
                           "input_indices", "outputs", "out_dtypes",
                           "tuple_output", NULL};
  if (!PyArg_ParseTupleAndKeywords(args, kwargs, "KOiOOOO!p:CudaCall", kwlist,
                                   &handle, &owner, &device, &device_obj,
                                   &inputs, &outputs, &PyTuple_Type, &dtypes,
                                   &tuple_output)) {
    return NULL;
  }
  if (g_dtype_codes == NULL || g_current_stream == NULL) {
    PyErr_SetString(PyExc_RuntimeError,
                    "_kiln_call.init/init_cuda was not called");
    return NULL;
  }
  CpuCall* self = (CpuCall*)type->tp_alloc(type, 0);
  if (self == NULL) return NULL;
  self->vectorcall = CpuCall_vectorcall;
  self->cuda_exe = (const kiln_cuda_executable*)(uintptr_t)handle;
  self->cuda_device = device;
  self->device_obj = Py_NewRef(device_obj);
  self->owner = Py_NewRef(owner);
  return CallInit(self, inputs, outputs, dtypes, Py_None, tuple_output);
}

static PyObject* CallInit(CpuCall* self, PyObject* inputs, PyObject* outputs,
                          PyObject* dtypes, PyObject* static_sizes,
                          int tuple_output) {
  self->tuple_output = tuple_output;
  self->input_indices = IndexArray(inputs, &self->num_inputs);
  if (self->input_indices == NULL) goto fail;
  self->num_outputs = PyTuple_GET_SIZE(dtypes);
  self->out_dtypes = Py_NewRef(dtypes);
  if ((size_t)self->num_outputs != ExeNumOutputs(self) ||
      (size_t)self->num_inputs != ExeNumInputs(self)) {
    PyErr_SetString(PyExc_ValueError,
                    "CpuCall: input/output counts differ from the "
                    "executable's");
    goto fail;
  }
  Py_ssize_t n = self->num_outputs ? self->num_outputs : 1;
  self->out_codes = PyMem_Malloc((size_t)n * sizeof(int32_t));
  self->out_ranks = PyMem_Malloc((size_t)n * sizeof(int32_t));
  if (self->out_codes == NULL || self->out_ranks == NULL) {
    PyErr_NoMemory();
    goto fail;
  }
  self->total_out_rank = 0;
  for (Py_ssize_t o = 0; o < self->num_outputs; ++o) {
    self->out_codes[o] = ExeOutputDtype(self, o);
    self->out_ranks[o] = ExeOutputRank(self, o);
    self->total_out_rank += self->out_ranks[o];
  }
  if (static_sizes != Py_None) {
    if (!PyTuple_Check(static_sizes) ||
        PyTuple_GET_SIZE(static_sizes) != self->num_outputs) {
      PyErr_SetString(PyExc_ValueError,
                      "CpuCall: static_sizes must be a tuple per output");
      goto fail;
    }
    self->static_sizes = Py_NewRef(static_sizes);
    self->static_dims = PyMem_Malloc(
        (size_t)(self->total_out_rank ? self->total_out_rank : 1) *
        sizeof(int64_t));
    if (self->static_dims == NULL) {
      PyErr_NoMemory();
      goto fail;
    }
    int64_t* d = self->static_dims;
    for (Py_ssize_t o = 0; o < self->num_outputs; ++o) {
      PyObject* t = PyTuple_GET_ITEM(static_sizes, o);
      if (!PyTuple_Check(t) || PyTuple_GET_SIZE(t) != self->out_ranks[o]) {
        PyErr_Format(PyExc_ValueError,
                     "CpuCall: static sizes of output %zd do not have its "
                     "rank %d",
                     o, self->out_ranks[o]);
        goto fail;
      }
      if (TupleToInt64(t, d)) goto fail;
      d += self->out_ranks[o];
    }
  }
  PyObject* fast = PySequence_Fast(outputs, "outputs: expected a sequence");
  if (fast == NULL) goto fail;
  self->num_results = PySequence_Fast_GET_SIZE(fast);
  n = self->num_results ? self->num_results : 1;
  self->result_kind = PyMem_Malloc((size_t)n * sizeof(int));
  self->result_index = PyMem_Malloc((size_t)n * sizeof(Py_ssize_t));
  self->result_view = PyMem_Calloc((size_t)n, sizeof(PyObject*));
  if (self->result_kind == NULL || self->result_index == NULL ||
      self->result_view == NULL) {
    Py_DECREF(fast);
    PyErr_NoMemory();
    goto fail;
  }
  for (Py_ssize_t r = 0; r < self->num_results; ++r) {
    int kind;
    Py_ssize_t index;
    PyObject *sizes = NULL, *strides = NULL, *offset = NULL;
    if (!PyArg_ParseTuple(PySequence_Fast_GET_ITEM(fast, r), "in|O!O!O!", &kind,
                          &index, &PyTuple_Type, &sizes, &PyTuple_Type,
                          &strides, &PyLong_Type, &offset)) {
      Py_DECREF(fast);
      goto fail;
    }
    int is_kiln = kind == 0 || kind == 3;
    if (kind < 0 || kind > 3 || (kind >= 2) != (offset != NULL) || index < 0 ||
        (is_kiln && index >= self->num_outputs)) {
      Py_DECREF(fast);
      PyErr_Format(PyExc_ValueError, "CpuCall: result %zd: bad entry", r);
      goto fail;
    }
    self->result_kind[r] = kind;
    self->result_index[r] = index;
    if (kind >= 2) {
      self->result_view[r] = PyTuple_Pack(3, sizes, strides, offset);
      if (self->result_view[r] == NULL) {
        Py_DECREF(fast);
        goto fail;
      }
    }
  }
  Py_DECREF(fast);
  if (!self->tuple_output && self->num_results != 1) {
    PyErr_SetString(PyExc_ValueError,
                    "CpuCall: a non-tuple result has one entry");
    goto fail;
  }
  return (PyObject*)self;
fail:
  Py_DECREF(self);
  return NULL;
}

static PyTypeObject CpuCallType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "kiln._kiln_call.CpuCall",
    .tp_basicsize = sizeof(CpuCall),
    .tp_dealloc = (destructor)CpuCall_dealloc,
    .tp_vectorcall_offset = offsetof(CpuCall, vectorcall),
    .tp_call = PyVectorcall_Call,
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_VECTORCALL,
    .tp_doc = "A CPU executable bound to a call signature (module doc).",
    .tp_new = CpuCall_new,
};

static PyTypeObject CudaCallType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "kiln._kiln_call.CudaCall",
    .tp_basicsize = sizeof(CpuCall),
    .tp_dealloc = (destructor)CpuCall_dealloc,
    .tp_vectorcall_offset = offsetof(CpuCall, vectorcall),
    .tp_call = PyVectorcall_Call,
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_VECTORCALL,
    .tp_doc = "A CUDA executable bound to a call signature (module doc).",
    .tp_new = CudaCall_new,
};

/* ---- torch_allocator ------------------------------------------------------
 * PyTorch's caching allocator as a kiln_allocator whose callbacks are C:
 * each allocation is three calls of torch._C builtins (exchange the current
 * device, raw_alloc on the stream, exchange back) and one dict store, each
 * free one dict pop and raw_delete, instead of a ctypes callback into
 * _binding._TorchAllocator's Python methods and torch.cuda.memory's
 * wrappers (about 11 and 5 us per block on an H100 host, 18 blocks in a
 * batch-norm training step). A free whose last-use stream is not the one
 * the block was allocated for (the cross-stream case, which needs an event)
 * goes to the Python adapter's free, which owns that logic; so do errors,
 * through on_error.
 *
 *   handle, state = _kiln_call.torch_allocator(
 *       raw_alloc, raw_delete, exchange_device, maybe_exchange_device,
 *       slow_free, on_error, streams, device)
 *
 * handle: the kiln_allocator* as int (kiln_allocator_destroy frees it);
 * state: a capsule that must outlive every use of the handle. streams: the
 * adapter's dict {ptr: stream} (shared with slow_free). */

typedef struct {
  PyObject* raw_alloc;
  PyObject* raw_delete;
  PyObject* exchange;
  PyObject* maybe_exchange;
  PyObject* slow_free;
  PyObject* on_error;
  PyObject* streams;
  int device;
} TorchAllocState;

/* Hands the pending Python exception to on_error (which keeps it for the
 * KilnError the failed run raises); never leaves one set. */
static void TorchAllocError(TorchAllocState* a) {
  PyObject *type, *value, *tb;
  PyErr_Fetch(&type, &value, &tb);
  PyErr_NormalizeException(&type, &value, &tb);
  if (value != NULL) {
    PyObject* r = PyObject_CallOneArg(a->on_error, value);
    Py_XDECREF(r);
  }
  Py_XDECREF(type);
  Py_XDECREF(value);
  Py_XDECREF(tb);
  PyErr_Clear();
}

static uint64_t TorchAlloc(size_t bytes, void* stream, void* user) {
  TorchAllocState* a = (TorchAllocState*)user;
  PyGILState_STATE gil = PyGILState_Ensure();
  uint64_t ptr = 0;
  PyObject* prev = PyObject_CallFunction(a->exchange, "i", a->device);
  if (prev != NULL) {
    PyObject* p = PyObject_CallFunction(a->raw_alloc, "nK", (Py_ssize_t)bytes,
                                        (unsigned long long)(uintptr_t)stream);
    /* The device goes back whatever raw_alloc did; its error (if any) is
     * kept across that call. */
    PyObject *type, *value, *tb;
    PyErr_Fetch(&type, &value, &tb);
    PyObject* back = PyObject_CallOneArg(a->maybe_exchange, prev);
    Py_DECREF(prev);
    if (back == NULL && type == NULL) {
      PyErr_Fetch(&type, &value, &tb);
    } else {
      PyErr_Clear();
    }
    Py_XDECREF(back);
    PyErr_Restore(type, value, tb);
    if (p != NULL && !PyErr_Occurred()) {
      ptr = PyLong_AsUnsignedLongLong(p);
      if (PyErr_Occurred()) ptr = 0;
      PyObject* val = PyLong_FromUnsignedLongLong((uintptr_t)stream);
      if (ptr != 0 && (val == NULL || PyDict_SetItem(a->streams, p, val) < 0)) {
        PyObject *t2, *v2, *tb2;
        PyErr_Fetch(&t2, &v2, &tb2);
        PyObject* r = PyObject_CallOneArg(a->raw_delete, p);
        Py_XDECREF(r);
        PyErr_Clear();
        PyErr_Restore(t2, v2, tb2);
        ptr = 0;
      }
      Py_XDECREF(val);
    }
    Py_XDECREF(p);
  }
  if (ptr == 0) TorchAllocError(a);
  PyGILState_Release(gil);
  return ptr;
}

static void TorchFree(uint64_t ptr, size_t bytes, void* last_use_stream,
                      void* user) {
  TorchAllocState* a = (TorchAllocState*)user;
  PyGILState_STATE gil = PyGILState_Ensure();
  const uint64_t last_use = (uint64_t)(uintptr_t)last_use_stream;
  PyObject* key = PyLong_FromUnsignedLongLong(ptr);
  PyObject* r = NULL;
  if (key != NULL) {
    PyObject* s = PyDict_GetItemWithError(a->streams, key); /* borrowed */
    uint64_t alloc_stream = last_use;
    if (s != NULL) alloc_stream = PyLong_AsUnsignedLongLong(s);
    if (!PyErr_Occurred()) {
      if (alloc_stream == last_use) {
        if (s == NULL || PyDict_DelItem(a->streams, key) == 0) {
          r = PyObject_CallOneArg(a->raw_delete, key);
        }
      } else {
        r = PyObject_CallFunction(a->slow_free, "KnKO",
                                  (unsigned long long)ptr, (Py_ssize_t)bytes,
                                  (unsigned long long)last_use, Py_None);
      }
    }
    Py_DECREF(key);
  }
  if (r == NULL) {
    TorchAllocError(a);
  } else {
    Py_DECREF(r);
  }
  PyGILState_Release(gil);
}

static void TorchAllocStateFree(PyObject* capsule) {
  TorchAllocState* a =
      (TorchAllocState*)PyCapsule_GetPointer(capsule, "kiln.torch_allocator");
  if (a == NULL) return;
  Py_XDECREF(a->raw_alloc);
  Py_XDECREF(a->raw_delete);
  Py_XDECREF(a->exchange);
  Py_XDECREF(a->maybe_exchange);
  Py_XDECREF(a->slow_free);
  Py_XDECREF(a->on_error);
  Py_XDECREF(a->streams);
  PyMem_Free(a);
}

static PyObject* TorchAllocator(PyObject* self, PyObject* args) {
  PyObject *raw_alloc, *raw_delete, *exchange, *maybe_exchange, *slow_free,
      *on_error, *streams;
  int device;
  if (!PyArg_ParseTuple(args, "OOOOOOO!i:torch_allocator", &raw_alloc,
                        &raw_delete, &exchange, &maybe_exchange, &slow_free,
                        &on_error, &PyDict_Type, &streams, &device)) {
    return NULL;
  }
  TorchAllocState* a = PyMem_Calloc(1, sizeof(TorchAllocState));
  if (a == NULL) return PyErr_NoMemory();
  PyObject* capsule =
      PyCapsule_New(a, "kiln.torch_allocator", TorchAllocStateFree);
  if (capsule == NULL) {
    PyMem_Free(a);
    return NULL;
  }
  a->raw_alloc = Py_NewRef(raw_alloc);
  a->raw_delete = Py_NewRef(raw_delete);
  a->exchange = Py_NewRef(exchange);
  a->maybe_exchange = Py_NewRef(maybe_exchange);
  a->slow_free = Py_NewRef(slow_free);
  a->on_error = Py_NewRef(on_error);
  a->streams = Py_NewRef(streams);
  a->device = device;
  kiln_allocator* handle = NULL;
  kiln_status* st = kiln_allocator_create(TorchAlloc, TorchFree, a, &handle);
  if (st != NULL) {
    Py_DECREF(capsule);
    RaiseStatus(st);
    return NULL;
  }
  return Py_BuildValue("(NN)", PyLong_FromVoidPtr(handle), capsule);
}

static PyObject* InitCuda(PyObject* self, PyObject* args) {
  PyObject *current_stream, *from_dlpack;
  if (!PyArg_ParseTuple(args, "OO:init_cuda", &current_stream, &from_dlpack)) {
    return NULL;
  }
  Py_XSETREF(g_current_stream, Py_NewRef(current_stream));
  Py_XSETREF(g_from_dlpack, Py_NewRef(from_dlpack));
  Py_RETURN_NONE;
}

static PyMethodDef kMethods[] = {
    {"init", Init, METH_VARARGS,
     "init(KilnError, dtype_codes, empty, tensor_type, dtype_error)"},
    {"init_cuda", InitCuda, METH_VARARGS,
     "init_cuda(current_raw_stream, from_dlpack)"},
    {"torch_allocator", TorchAllocator, METH_VARARGS,
     "torch_allocator(raw_alloc, raw_delete, exchange_device, "
     "maybe_exchange_device, slow_free, on_error, streams, device) -> "
     "(handle, state)"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef kModule = {
    PyModuleDef_HEAD_INIT,
    .m_name = "_kiln_call",
    .m_doc = "The fast call path of python/kiln over libkiln_c.so.",
    .m_size = -1,
    .m_methods = kMethods,
};

PyMODINIT_FUNC PyInit__kiln_call(void) {
  if (kiln_c_api_version() != KILN_C_API_VERSION) {
    PyErr_Format(PyExc_ImportError,
                 "_kiln_call: libkiln_c.so speaks C API %d, built for %d",
                 kiln_c_api_version(), KILN_C_API_VERSION);
    return NULL;
  }
  if (PyType_Ready(&CpuCallType) < 0 || PyType_Ready(&CudaCallType) < 0) {
    return NULL;
  }
  g_str_shape = PyUnicode_InternFromString("shape");
  g_str_stride = PyUnicode_InternFromString("stride");
  g_str_data_ptr = PyUnicode_InternFromString("data_ptr");
  g_str_dtype = PyUnicode_InternFromString("dtype");
  g_str_is_cpu = PyUnicode_InternFromString("is_cpu");
  g_str_get_device = PyUnicode_InternFromString("get_device");
  g_str_as_strided = PyUnicode_InternFromString("as_strided");
  g_str_storage_offset = PyUnicode_InternFromString("storage_offset");
  g_kwnames_dtype = Py_BuildValue("(s)", "dtype");
  if (!g_str_shape || !g_str_stride || !g_str_data_ptr || !g_str_dtype ||
      !g_str_is_cpu || !g_str_get_device || !g_str_as_strided ||
      !g_str_storage_offset || !g_kwnames_dtype) {
    return NULL;
  }
  PyObject* m = PyModule_Create(&kModule);
  if (m == NULL) return NULL;
  if (PyModule_AddObjectRef(m, "CpuCall", (PyObject*)&CpuCallType) < 0 ||
      PyModule_AddObjectRef(m, "CudaCall", (PyObject*)&CudaCallType) < 0) {
    Py_DECREF(m);
    return NULL;
  }
  return m;
}
