/* Kiln's C API: kiln::Client (client/kiln_client.h), its CPU and CUDA
 * executables, for languages that call C, such as Python through ctypes
 * (python/kiln). Built
 * into libkiln_c.so, which exports the kiln_* functions below and nothing
 * else (the C++ code inside, gRPC/Protobuf/Abseil aside, is private to it).
 *
 *   kiln_client* client = NULL;
 *   kiln_status* s = kiln_client_create(NULL, 0, -1, &client);  // KILN_SERVER
 *   kiln_cuda_executable* exe = NULL;
 *   s = kiln_client_get_cuda_executable(client, json, strlen(json), "sm_90",
 *                                       0, 0, NULL, &exe);
 *   if (s) { fprintf(stderr, "%s\n", kiln_status_message(s));
 *            kiln_status_free(s); }
 *   kiln_tensor_view x = {x_ptr, KILN_FLOAT32, 2, sizes, strides};
 *   kiln_cuda_tensor* y[1];
 *   s = kiln_cuda_executable_run(exe, &x, 1, stream, y, 1);   // enqueued
 *   ... kiln_cuda_tensor_data(y[0]) is ready when `stream` gets there ...
 *   kiln_cuda_tensor_destroy(y[0]);     // memory back, stream-ordered
 *   kiln_cuda_executable_destroy(exe);
 *   kiln_client_destroy(client);
 *
 * CPU executables run over host memory the caller owns, without copies:
 *
 *   kiln_cpu_executable* cpu = NULL;
 *   s = kiln_client_get_cpu_executable(client, json, strlen(json), "cpu", 0,
 *                                      &cpu);
 *   kiln_tensor_view x = {(uint64_t)x_ptr, KILN_FLOAT32, 2, sizes, strides};
 *   kiln_tensor_view y = {(uint64_t)y_ptr, KILN_FLOAT32, 2, sizes, NULL};
 *   s = kiln_cpu_executable_run(cpu, &x, 1, &y, 1);  // y written, done
 *
 * Errors: every function that can fail returns a kiln_status*: NULL on
 * success, else a status the caller owns and frees with kiln_status_free,
 * holding the code (the gRPC/absl canonical codes, KILN_* below) and the
 * message (the same text kiln::Client returns: "node 3
 * (aten.frobnicate.default): ...", "CUDA driver not available: ..."). There
 * is no global "last error": errors go to the caller that got them.
 *
 * Ownership: each *_create / get / run output is a handle the caller owns
 * and releases with the matching *_destroy (NULL is accepted and ignored).
 * Handles are reference-counted inside where they share objects: an
 * executable keeps its allocator alive, an output keeps its allocator alive,
 * a client's in-process cache keeps what it loaded; so handles may be
 * destroyed in any order (an output may outlive its executable and client).
 *
 * Thread-safety: a kiln_client, a kiln_cuda_executable and a
 * kiln_cpu_executable may be used from many threads at once (kiln::Client's,
 * CudaExecutable's and CpuExecutable's contracts); a kiln_cuda_tensor, a
 * kiln_cpu_tensor and a kiln_status by one thread at a time. The allocator
 * callbacks are called from whichever thread runs an executable (alloc,
 * free of temporaries) or destroys an output (free), and must be
 * thread-safe.
 *
 * Only one Kiln library per process: libkiln_c.so and libkiln_client.so
 * both register the kiln.v1 protobuf messages with the shared libprotobuf,
 * which refuses the second registration.
 */
#ifndef KILN_CLIENT_KILN_C_H_
#define KILN_CLIENT_KILN_C_H_

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Bumped when a declaration here changes or is added (2: CPU executables,
 * kiln_supported_ops; 3: kiln_client_create_with_trust; 4:
 * kiln_cuda_executable_check_index_errors, and OUT_OF_RANGE from runs for
 * indices out of range; 5: the `options` flags of the get_*_executable
 * calls, which took fast_math as 0 or 1; 6:
 * kiln_cuda_executable_run_into; 7: kiln_cpu_runtime_prepare). */
#define KILN_C_API_VERSION 7
int kiln_c_api_version(void);

/* Status codes (= absl::StatusCode = grpc::StatusCode). */
enum {
  KILN_OK = 0,
  KILN_CANCELLED = 1,
  KILN_UNKNOWN = 2,
  KILN_INVALID_ARGUMENT = 3,
  KILN_DEADLINE_EXCEEDED = 4,
  KILN_NOT_FOUND = 5,
  KILN_ALREADY_EXISTS = 6,
  KILN_PERMISSION_DENIED = 7,
  KILN_RESOURCE_EXHAUSTED = 8,
  KILN_FAILED_PRECONDITION = 9,
  KILN_ABORTED = 10,
  KILN_OUT_OF_RANGE = 11,
  KILN_UNIMPLEMENTED = 12,
  KILN_INTERNAL = 13,
  KILN_UNAVAILABLE = 14,
  KILN_DATA_LOSS = 15,
  KILN_UNAUTHENTICATED = 16
};

/* Element types (= kiln::DType = kiln.v1.DType). */
enum {
  KILN_FLOAT32 = 1,
  KILN_FLOAT16 = 2,
  KILN_BFLOAT16 = 3,
  KILN_INT32 = 4,
  KILN_INT64 = 5,
  KILN_BOOL = 6
};

typedef struct kiln_status kiln_status;
typedef struct kiln_client kiln_client;
typedef struct kiln_allocator kiln_allocator;
typedef struct kiln_cuda_executable kiln_cuda_executable;
typedef struct kiln_cuda_tensor kiln_cuda_tensor;
typedef struct kiln_cpu_executable kiln_cpu_executable;
typedef struct kiln_cpu_tensor kiln_cpu_tensor;

/* ---- status ------------------------------------------------------------ */

/* KILN_OK for NULL. */
int kiln_status_code(const kiln_status* status);
/* "" for NULL; valid until the status is freed. */
const char* kiln_status_message(const kiln_status* status);
void kiln_status_free(kiln_status* status);

/* ---- client ------------------------------------------------------------ */

/* A client of kilnd at `server` ("HOST:PORT" or "unix:PATH", or a
 * comma-separated list of a fleet's replicas: keys spread over them, with
 * failover; NULL or "": $KILN_SERVER, else 127.0.0.1:7733). `rpc_deadline_seconds` <= 0 and
 * `max_retries` < 0 keep kiln::ClientOptions' defaults (5 minutes, 5
 * retries on UNAVAILABLE). Does not contact the server yet. With
 * $KILN_TRUSTED_KEYS set (kilnd public keys, 64 hex digits each,
 * comma-separated: `kilnctl public-key`), artifacts not signed by one of them
 * are refused with KILN_PERMISSION_DENIED before any code is loaded; a
 * malformed list fails here with KILN_INVALID_ARGUMENT. */
kiln_status* kiln_client_create(const char* server, double rpc_deadline_seconds,
                                int max_retries, kiln_client** out);
/* kiln_client_create for kilnd with tokens and/or TLS (README.md, "Running
 * kilnd for a team"). Each string may be NULL or "" for its environment
 * variable: `token` ($KILN_TOKEN), `token_file` ($KILN_TOKEN_FILE: its
 * first line is the token), `tls_ca` ($KILN_TLS_CA: PEM CA bundle; set,
 * the channel is TLS; $KILN_TLS=1: TLS with the system's roots),
 * `tls_cert`/`tls_key` ($KILN_TLS_CERT/$KILN_TLS_KEY: client certificate
 * and key, mTLS), `tls_server_name` ($KILN_TLS_SERVER_NAME: the name in
 * kilnd's certificate). kiln_client_create reads the same variables.
 * Errors: NOT_FOUND for a file that cannot be read, INVALID_ARGUMENT for an
 * empty token file or a certificate without its key. */
kiln_status* kiln_client_create_with_auth(
    const char* server, double rpc_deadline_seconds, int max_retries,
    const char* token, const char* token_file, const char* tls_ca,
    const char* tls_cert, const char* tls_key, const char* tls_server_name,
    kiln_client** out);
/* kiln_client_create_with_auth with the trusted kilnd public keys given
 * here (`trusted_keys`: 64 hex digits each, comma-separated; NULL or "":
 * $KILN_TRUSTED_KEYS, as kiln_client_create). With keys, artifacts not
 * signed by one of them are refused with KILN_PERMISSION_DENIED before any
 * code is loaded. Errors: kiln_client_create_with_auth's, and
 * INVALID_ARGUMENT for a malformed key list. */
kiln_status* kiln_client_create_with_trust(
    const char* server, double rpc_deadline_seconds, int max_retries,
    const char* token, const char* token_file, const char* tls_ca,
    const char* tls_cert, const char* tls_key, const char* tls_server_name,
    const char* trusted_keys, kiln_client** out);
void kiln_client_destroy(kiln_client* client);
/* kiln::Client::Counters; any pointer may be NULL. */
void kiln_client_counters(const kiln_client* client, uint64_t* local_hits,
                          uint64_t* lookup_hits, uint64_t* compiles);

/* ---- device memory ----------------------------------------------------- */

/* Device memory of at least `bytes` (> 0) bytes, 256-byte aligned, usable by
 * work enqueued on `stream` (a CUstream / cudaStream_t) after this call, or
 * 0 when none can be had (the run then fails with RESOURCE_EXHAUSTED). */
typedef uint64_t (*kiln_alloc_fn)(size_t bytes, void* stream, void* user_data);
/* Gives back `ptr` (from alloc with this `bytes`). Work already enqueued on
 * `last_use_stream` may still use it: the callee must not let work on any
 * other stream reuse it before that work finished (e.g. make the allocation
 * stream wait for an event recorded on `last_use_stream` when they
 * differ). Must not block on the device. */
typedef void (*kiln_free_fn)(uint64_t ptr, size_t bytes, void* last_use_stream,
                             void* user_data);

/* A kiln::DeviceAllocator that calls `alloc` and `free` with `user_data`:
 * the adapter for an external caching allocator such as PyTorch's
 * (python/kiln wraps torch.cuda.caching_allocator_alloc/_delete). The
 * callbacks and `user_data` must stay valid while any executable or output
 * that uses the allocator lives (a client's in-process cache keeps
 * executables until the client is destroyed). Errors: INVALID_ARGUMENT for
 * a NULL callback. */
kiln_status* kiln_allocator_create(kiln_alloc_fn alloc, kiln_free_fn free,
                                   void* user_data, kiln_allocator** out);
/* Kiln's own CachingDeviceAllocator over device `device_ordinal`, to share
 * between executables. Errors: FAILED_PRECONDITION without a driver or
 * device. */
kiln_status* kiln_allocator_create_caching(int device_ordinal,
                                           kiln_allocator** out);
/* Drops this handle's reference; executables and outputs keep theirs. */
void kiln_allocator_destroy(kiln_allocator* allocator);

/* ---- compile options -------------------------------------------------- */

/* The `options` of kiln_client_get_cuda_executable and
 * kiln_client_get_cpu_executable: an or of these (0: none), each a
 * kiln.v1.CompileOptions field (proto/kiln/v1/graph.proto). 1 is fast_math,
 * so callers that passed fast_math as 0 or 1 keep their meaning. CPU
 * targets ignore the matrix-product, convolution and determinism flags
 * (they are not in CPU keys). Any other bit is INVALID_ARGUMENT. */
#define KILN_OPTION_FAST_MATH 1
#define KILN_OPTION_ALLOW_TF32 2             /* allow_tf32 */
#define KILN_OPTION_STRICT_FP16_REDUCTION 4  /* strict_fp16_reduction */
#define KILN_OPTION_STRICT_BF16_REDUCTION 8  /* strict_bf16_reduction */
#define KILN_OPTION_UNFUSED_GEMM_EPILOGUES 16 /* unfused_gemm_epilogues */
#define KILN_OPTION_ALLOW_TF32_CONVOLUTION 32 /* allow_tf32_convolution */
#define KILN_OPTION_DETERMINISTIC_CONVOLUTIONS 64 \
  /* deterministic_convolutions */
#define KILN_OPTION_DETERMINISTIC_ALGORITHMS 128 \
  /* deterministic_algorithms */
#define KILN_OPTION_CUDNN_BENCHMARK 256 /* cudnn_benchmark */

/* ---- CUDA executables -------------------------------------------------- */

/* kiln::Client::GetCudaExecutable for the graph `graph_json` (kiln.v1.Graph
 * in the protobuf JSON mapping, as the files in examples/graphs;
 * `graph_json_len` bytes, need not be NUL-terminated) compiled for `target`
 * ("sm_90", ...) with the CompileOptions of `options` (KILN_OPTION_*), loaded on
 * device `device_ordinal` with outputs and intermediates from `allocator`
 * (NULL: a CachingDeviceAllocator of the executable's own). The request is the
 * one `kilnctl compile GRAPH.json --target=...` sends (same guard key). Errors:
 * INVALID_ARGUMENT for JSON that is not a graph, a target that is not sm_XX, a
 * malformed graph; UNIMPLEMENTED naming an unknown op; UNAVAILABLE when kilnd
 * cannot be reached; FAILED_PRECONDITION when there is no CUDA driver or
 * device, or it cannot run `target`; see kiln::Client::GetCudaExecutable. */
kiln_status* kiln_client_get_cuda_executable(
    kiln_client* client, const char* graph_json, size_t graph_json_len,
    const char* target, int options, int device_ordinal,
    kiln_allocator* allocator, kiln_cuda_executable** out);
void kiln_cuda_executable_destroy(kiln_cuda_executable* exe);

size_t kiln_cuda_executable_num_inputs(const kiln_cuda_executable* exe);
size_t kiln_cuda_executable_num_outputs(const kiln_cuda_executable* exe);
/* The dtype (KILN_*) and rank of output `index`; -1 when out of range. Its
 * sizes depend on the inputs' (symbolic sizes): they come with each run. */
int kiln_cuda_executable_output_dtype(const kiln_cuda_executable* exe,
                                      size_t index);
int kiln_cuda_executable_output_rank(const kiln_cuda_executable* exe,
                                     size_t index);
/* The graph's input writes (Graph.input_writes, a mutated input's new
 * value) that a run stores into the input's memory: write `index` <
 * num_input_writes is graph output *output, written into input *input.
 * Such a graph output is not among the executable's outputs, which are the
 * graph's other outputs in order. Returns 0, or -1 (nothing written) when
 * `index` is out of range or an argument is null. */
size_t kiln_cuda_executable_num_input_writes(const kiln_cuda_executable* exe);
int kiln_cuda_executable_input_write(const kiln_cuda_executable* exe,
                                     size_t index, int* output, int* input);
/* The guard key as 64 lowercase hex digits and a NUL, into `hex`. */
void kiln_cuda_executable_guard_key(const kiln_cuda_executable* exe,
                                    char hex[65]);
int kiln_cuda_executable_device_ordinal(const kiln_cuda_executable* exe);

/* An input: device memory the caller owns, read by the enqueued work (keep
 * it alive until `stream` has passed it). */
typedef struct kiln_tensor_view {
  uint64_t data; /* the first element (storage offset applied) */
  int32_t dtype; /* KILN_* */
  int32_t rank;
  const int64_t* sizes;   /* rank entries */
  const int64_t* strides; /* rank entries, in elements */
} kiln_tensor_view;

/* kiln::CudaExecutable::Run: checks the guards, allocates the outputs from
 * the executable's allocator for `stream`, enqueues the program on `stream`
 * (a CUstream / cudaStream_t of the executable's device; NULL: the legacy
 * default stream) and returns without synchronising. On success
 * outputs[0 .. num_outputs) are new handles (num_outputs must equal
 * kiln_cuda_executable_num_outputs), whose memory is ready when `stream`
 * reaches this point. Errors: INVALID_ARGUMENT naming the input, dim and
 * guard, a bad dtype/rank or a wrong count; RESOURCE_EXHAUSTED when the
 * allocator gives nothing; OUT_OF_RANGE when an earlier run of `exe` read
 * an index out of range (PyTorch's device-side assert, reported at a later
 * call: see kiln_cuda_executable_check_index_errors); the driver's status.
 * On error no handle is written. */
kiln_status* kiln_cuda_executable_run(const kiln_cuda_executable* exe,
                                      const kiln_tensor_view* inputs,
                                      size_t num_inputs, void* stream,
                                      kiln_cuda_tensor** outputs,
                                      size_t num_outputs);

/* kiln::CudaExecutable::RunInto: as kiln_cuda_executable_run, but output
 * o is written into outputs[o] (device memory of the executable's device
 * the caller owns, e.g. from PyTorch's allocator on `stream`: contiguous,
 * NULL strides meaning so, of the output's dtype and of the sizes the
 * inputs imply) instead of new memory; only temporaries are allocated.
 * Input strides may be NULL (contiguous). Errors: as
 * kiln_cuda_executable_run, and INVALID_ARGUMENT naming the output whose
 * count, dtype, sizes, strides or data pointer differ; FAILED_PRECONDITION
 * when the program needs more memory for an output than its elements (use
 * kiln_cuda_executable_run). Nothing is enqueued on error. */
kiln_status* kiln_cuda_executable_run_into(const kiln_cuda_executable* exe,
                                           const kiln_tensor_view* inputs,
                                           size_t num_inputs, void* stream,
                                           const kiln_tensor_view* outputs,
                                           size_t num_outputs);

/* kiln::CudaExecutable::CheckIndexErrors: OUT_OF_RANGE ("node 7
 * (aten.embedding.default): index 50300 is out of range for dimension 0 of
 * size 50257"), cleared once reported, when a run of `exe` read an index
 * out of range and that run's error word has reached the host; with `wait`
 * nonzero it first synchronises `stream`, so every run enqueued on it is
 * accounted for. NULL otherwise. */
kiln_status* kiln_cuda_executable_check_index_errors(
    const kiln_cuda_executable* exe, void* stream, int wait);

/* ---- outputs ----------------------------------------------------------- */

uint64_t kiln_cuda_tensor_data(const kiln_cuda_tensor* tensor);
int kiln_cuda_tensor_dtype(const kiln_cuda_tensor* tensor);
int kiln_cuda_tensor_rank(const kiln_cuda_tensor* tensor);
/* rank entries each, contiguous layout; valid while the handle lives. */
const int64_t* kiln_cuda_tensor_sizes(const kiln_cuda_tensor* tensor);
const int64_t* kiln_cuda_tensor_strides(const kiln_cuda_tensor* tensor);
size_t kiln_cuda_tensor_nbytes(const kiln_cuda_tensor* tensor);
/* The stream whose work uses the memory last (default: the run's stream):
 * destroying the handle frees it after the work enqueued there so far.
 * Work on any other stream must be finished or ordered before it. */
void kiln_cuda_tensor_set_last_use_stream(kiln_cuda_tensor* tensor,
                                          void* stream);
/* Gives the memory back to the allocator (stream-ordered; no sync). */
void kiln_cuda_tensor_destroy(kiln_cuda_tensor* tensor);

/* Hands `tensor` over to a DLPack DLManagedTensor (dlpack.h's unversioned
 * ABI, what a "dltensor" PyCapsule holds for torch.from_dlpack, CuPy or
 * JAX) describing it on CUDA device `device_ordinal`; the consumer's call
 * of its deleter frees the memory as kiln_cuda_tensor_destroy does. Takes
 * ownership of `tensor` (do not destroy it). NULL for NULL. A
 * DLManagedTensor never handed to a consumer is freed with
 * kiln_dlpack_delete. */
void* kiln_cuda_tensor_to_dlpack(kiln_cuda_tensor* tensor, int device_ordinal);
/* Calls the DLManagedTensor's deleter; NULL is ignored. */
void kiln_dlpack_delete(void* managed_tensor);

/* ---- CPU executables -------------------------------------------------- */

/* kiln::Client::GetExecutable for the graph `graph_json` (as for
 * kiln_client_get_cuda_executable) compiled for the CPU target `target`
 * ("cpu" or NULL: this host's x86-64 level, kiln::Client's default target,
 * the one `kilnctl compile --target=cpu` sends, so the guard keys match)
 * with the CompileOptions of `options` (KILN_OPTION_*), and loaded (its
 * binary's SHA-256 checked first). Served from the client's in-process
 * cache, kilnd's cache by Lookup, or a Compile. Errors: INVALID_ARGUMENT for
 * JSON that is not a graph, a target that is not a CPU target, a malformed
 * graph; UNIMPLEMENTED naming an unknown op; UNAVAILABLE when kilnd cannot
 * be reached; DATA_LOSS for a binary whose hash does not match. */
kiln_status* kiln_client_get_cpu_executable(kiln_client* client,
                                            const char* graph_json,
                                            size_t graph_json_len,
                                            const char* target, int options,
                                            kiln_cpu_executable** out);
void kiln_cpu_executable_destroy(kiln_cpu_executable* exe);

/* Loads the CPU runtime's BLAS and runs one small product, so that the
 * library's one-time start-up (about 70 ms for oneDNN on a 2-core machine)
 * is paid now, e.g. by a thread of the caller's own while it traces its
 * model, rather than by the first run of a CPU executable with a matrix
 * product. Idempotent; thread-safe. Errors: FAILED_PRECONDITION when no
 * BLAS loads (naming each library tried), INTERNAL when it fails. */
kiln_status* kiln_cpu_runtime_prepare(void);

size_t kiln_cpu_executable_num_inputs(const kiln_cpu_executable* exe);
size_t kiln_cpu_executable_num_outputs(const kiln_cpu_executable* exe);
/* The dtype (KILN_*) and rank of output `index`; -1 when out of range. */
int kiln_cpu_executable_output_dtype(const kiln_cpu_executable* exe,
                                     size_t index);
int kiln_cpu_executable_output_rank(const kiln_cpu_executable* exe,
                                    size_t index);
/* As kiln_cuda_executable_num_input_writes and _input_write. */
size_t kiln_cpu_executable_num_input_writes(const kiln_cpu_executable* exe);
int kiln_cpu_executable_input_write(const kiln_cpu_executable* exe,
                                    size_t index, int* output, int* input);
/* The guard key as 64 lowercase hex digits and a NUL, into `hex`. */
void kiln_cpu_executable_guard_key(const kiln_cpu_executable* exe,
                                   char hex[65]);

/* CPU inputs and outputs are kiln_tensor_views of host memory: `data` is the
 * address of the first element (storage offset applied) as an integer.
 * Inputs may have any strides the guards allow (those the graph was
 * compiled for; strides of dims of size 1 are not checked); `strides` may be
 * NULL for a contiguous tensor. */

/* The sizes of every output for these inputs, after checking the inputs'
 * guards: output 0's sizes, then output 1's, ... into `sizes`
 * (`num_sizes` must be the sum of the outputs' ranks). What
 * kiln_cpu_executable_run expects its outputs to hold when sizes are
 * symbolic; a graph without symbols always has its outputs' static sizes.
 * Errors: INVALID_ARGUMENT naming the input, dim and guard, or a wrong
 * count. */
kiln_status* kiln_cpu_executable_output_sizes(const kiln_cpu_executable* exe,
                                              const kiln_tensor_view* inputs,
                                              size_t num_inputs, int64_t* sizes,
                                              size_t num_sizes);

/* kiln::CpuExecutable::RunInto: checks the guards and runs the program on
 * the client's runtime threads, writing output o into the caller's memory
 * `outputs[o].data`, which must hold the output's dtype and sizes
 * (kiln_cpu_executable_output_sizes) contiguously (strides NULL or
 * row-major) and overlap no input or other output. Returns when the outputs
 * are written; reads the inputs only during the call; copies nothing.
 * Errors: INVALID_ARGUMENT naming the input or output and the guard or
 * size it fails, a bad dtype/rank or a wrong count; RESOURCE_EXHAUSTED
 * when a temporary cannot be allocated; OUT_OF_RANGE naming the node, op,
 * index and size when the graph reads an index out of range (PyTorch's
 * IndexError; the outputs then hold clamped reads). */
kiln_status* kiln_cpu_executable_run(const kiln_cpu_executable* exe,
                                     const kiln_tensor_view* inputs,
                                     size_t num_inputs,
                                     const kiln_tensor_view* outputs,
                                     size_t num_outputs);

/* The same with outputs Kiln allocates (64-byte aligned, contiguous): on
 * success outputs[0 .. num_outputs) are new handles the caller destroys
 * with kiln_cpu_tensor_destroy. On error no handle is written. */
kiln_status* kiln_cpu_executable_run_alloc(const kiln_cpu_executable* exe,
                                           const kiln_tensor_view* inputs,
                                           size_t num_inputs,
                                           kiln_cpu_tensor** outputs,
                                           size_t num_outputs);

void* kiln_cpu_tensor_data(kiln_cpu_tensor* tensor);
int kiln_cpu_tensor_dtype(const kiln_cpu_tensor* tensor);
int kiln_cpu_tensor_rank(const kiln_cpu_tensor* tensor);
/* rank entries each, contiguous layout; valid while the handle lives. */
const int64_t* kiln_cpu_tensor_sizes(const kiln_cpu_tensor* tensor);
const int64_t* kiln_cpu_tensor_strides(const kiln_cpu_tensor* tensor);
size_t kiln_cpu_tensor_nbytes(const kiln_cpu_tensor* tensor);
void kiln_cpu_tensor_destroy(kiln_cpu_tensor* tensor);

/* ---- what Kiln compiles ------------------------------------------------ */

/* The Core ATen overloads this library's op signature table holds
 * ("aten.add.Tensor", ...), sorted, one per line, NUL-terminated; static
 * storage, valid for the process. A kilnd built from the same tree compiles
 * the same set; kilnd reports its own in kiln.v1.ServerInfo.supported_ops. */
const char* kiln_supported_ops(void);

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* KILN_CLIENT_KILN_C_H_ */
