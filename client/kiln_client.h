// kiln::Client: the library a training process uses to get compiled
// kernels from kilnd.
//
//   auto client = kiln::Client::Connect({});           // KILN_SERVER or
//   127.0.0.1:7733 auto exe = (*client)->GetExecutable(request);      // a
//   graph + target auto outputs = (*exe)->Run({x, w});                // guards
//   checked, then run
//
// A request that names no target gets DefaultTarget(): this host's CPU by
// its x86-64 level (client/host_target.h; no LLVM in clients), which is also
// what `kilnctl --target=cpu` sends, so the library and kilnctl compute the
// same guard key for a graph, and hosts of one level share artifacts. (A
// request built with compiler/cpu_backend.h's HostCpuTarget(), the exact CPU
// and its features, gets another key.)
//
// GetExecutable computes the guard key locally and serves, in order: the
// in-process cache of loaded executables, the daemon's cache through
// Lookup (a 32-byte request; on kilnd's hit socket when it has one, see
// client/hit_socket_client.h), and only then a Compile with the whole graph.
// The binary's SHA-256 is verified before any code is loaded. The key of a
// request already seen is remembered by the SHA-256 of the request's bytes,
// so a repeated call does not import the graph again.
//
// Verification cost: the check (SHA-256 of the whole binary, ~65 us for
// 100 KB on the 2-core dev box) is paid once per key per Client, when the
// executable is first loaded; later calls for the key get the loaded
// executable from the in-process cache, whose code was verified when it was
// loaded and cannot change since (a sealed memfd). Nothing ever loads bytes
// that were not hashed first: there is no "already verified" shortcut keyed by
// hash or key that could admit new bytes. A Lookup hit is received as gRPC's
// own slices and hashed and loaded from them (client/raw_lookup.h), so the
// binary is not copied in user space on its way to the loader.
//
// Several replicas (ClientOptions::server "A,B,C"): Lookup and Compile of a
// key go to its home replica; UNAVAILABLE or RESOURCE_EXHAUSTED moves the
// call to the next replica, backing off after each round of them.
//
// Errors: the daemon's status (INVALID_ARGUMENT/UNIMPLEMENTED name node,
// op and reason); UNAVAILABLE after the retries are spent; DATA_LOSS for an
// artifact whose binary does not match its hash; PERMISSION_DENIED, with
// trusted keys configured (ClientOptions::trusted_keys), for an artifact
// not signed by one of them (checked first, before anything is loaded).
//
// CUDA: GetCudaExecutable is the same flow for a request that names a CUDA
// target (`sm_XX`); the artifact (a cubin the daemon cross-compiled, no GPU
// needed there) is loaded with CudaExecutable::Load into the primary context
// of CudaLoadOptions::device_ordinal. Loading needs the NVIDIA driver and a
// device (runtime/cuda_driver.h loads the driver with dlopen, so this library
// builds, links and runs without one); without them GetCudaExecutable
// returns FAILED_PRECONDITION after the artifact was fetched (the daemon's
// cache is warm for the next process that has a GPU).
//
// Thread-safety: a Client and the Executables it returns are thread-safe.
#ifndef KILN_CLIENT_KILN_CLIENT_H_
#define KILN_CLIENT_KILN_CLIENT_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "client/connection_options.h"
#include "runtime/cuda_executable.h"
#include "graph/host_tensor.h"
#include "kiln/v1/graph.pb.h"

namespace kiln {

class CpuExecutable;  // runtime/cpu_executable.h
class ThreadPool;     // runtime/thread_pool.h

struct ClientOptions {
  // HOST:PORT of kilnd; empty: $KILN_SERVER, else 127.0.0.1:7733. A
  // comma-separated list names the replicas of a fleet (README.md, "Running
  // a fleet"): each key goes to its home replica (rendezvous hashing over
  // the list), and to the next one when that answers UNAVAILABLE (which is
  // then tried last for a few seconds).
  std::string server;
  // Deadline of one Compile/Lookup call.
  absl::Duration rpc_deadline = absl::Minutes(5);
  // Retries on UNAVAILABLE, with exponential backoff from initial_backoff.
  int max_retries = 5;
  absl::Duration initial_backoff = absl::Milliseconds(100);
  // Threads that run kernels (0: the machine's cores).
  int runtime_threads = 0;
  // Look up on kilnd's hit socket when it has one (client/hit_socket_client.h;
  // gRPC otherwise, and whenever the socket fails). $KILN_HIT_SOCKET=0 turns
  // it off too.
  bool use_hit_socket = true;
  // TLS and a token (client/connection.h); empty fields are taken from
  // $KILN_TOKEN, $KILN_TOKEN_FILE, $KILN_TLS_CA, $KILN_TLS_CERT,
  // $KILN_TLS_KEY, $KILN_TLS_SERVER_NAME, $KILN_TLS.
  ConnectionOptions connection;
  // Public keys (64 hex digits each, comma- or space-separated; what
  // `kilnctl public-key` prints) of the kilnds whose artifacts this client
  // loads; empty: $KILN_TRUSTED_KEYS; both empty: no signature is checked.
  // With keys, an artifact that is unsigned or not signed by one of them
  // (support/artifact_signature.h) is refused with PERMISSION_DENIED before
  // any of its code is loaded. Several keys: rotation.
  std::string trusted_keys;
};

class Executable {
 public:
  virtual ~Executable() = default;
  // Checks the guards against the inputs and runs; outputs are new tensors.
  virtual absl::StatusOr<std::vector<HostTensor>> Run(
      absl::Span<const HostTensor> inputs) const = 0;
  // The guard key (32 bytes) this executable was served under.
  virtual const std::string& guard_key() const = 0;
  // The loaded executable Run runs and the pool it runs on (may be null),
  // for callers that run over their own memory (CpuExecutable::RunInto,
  // the C API's kiln_cpu_executable_run).
  virtual const CpuExecutable& cpu_executable() const = 0;
  virtual ThreadPool* thread_pool() const = 0;
};

class Client {
 public:
  // How requests were served so far, for logs and tests.
  // Counted for CPU and CUDA requests alike.
  struct Counters {
    uint64_t local_hits = 0;   // served from the in-process cache
    uint64_t lookup_hits = 0;  // served by Lookup (no graph sent)
    uint64_t compiles = 0;     // Compile requests sent
  };

  virtual ~Client() = default;
  // The target of requests that name none (see the file comment).
  static v1::Target DefaultTarget();

  // Creates the channel; does not contact the server yet.
  static absl::StatusOr<std::unique_ptr<Client>> Connect(
      const ClientOptions& options);

  // A CPU executable for `request` (no target: DefaultTarget()). Errors:
  // see the file comment; UNIMPLEMENTED for a CUDA target (use
  // GetCudaExecutable).
  virtual absl::StatusOr<std::shared_ptr<const Executable>> GetExecutable(
      const v1::CompileRequest& request) = 0;

  // A CUDA executable for `request`, which must name a CUDA target
  // (`target.cuda.arch`, e.g. "sm_90"): the guard key is computed locally,
  // then served from the in-process cache, by Lookup, or by Compile (as
  // GetExecutable), and the cubin is verified (SHA-256) and loaded into
  // device `options.device_ordinal`'s primary context, with outputs and
  // intermediates from `options.allocator` (null: a CachingDeviceAllocator
  // owned by the executable).
  //
  // The in-process cache holds one loaded executable per (guard key, device
  // ordinal, allocator): a module belongs to one device's context, and the
  // executable keeps its allocator alive. Requests that differ only in the
  // allocator therefore load the cubin once each; pass the same allocator
  // (or none) to share. The cache keeps the allocator alive as long as the
  // Client lives.
  //
  // Errors: INVALID_ARGUMENT when the request names no CUDA target or its
  // graph is malformed (node, op and reason); the daemon's status;
  // UNAVAILABLE after the retries are spent; DATA_LOSS for a cubin whose
  // hash does not match; FAILED_PRECONDITION when there is no CUDA driver or
  // device ("CUDA driver not available: ..."), the device cannot run the
  // artifact's arch, and CudaExecutable::Load's other errors.
  // Thread-safety: as GetExecutable; the executable's Run may be called from
  // many threads (CudaExecutable's contract).
  virtual absl::StatusOr<std::shared_ptr<const CudaExecutable>>
  GetCudaExecutable(const v1::CompileRequest& request,
                    const CudaLoadOptions& options = {}) = 0;

  virtual Counters counters() const = 0;
};

}  // namespace kiln

#endif  // KILN_CLIENT_KILN_CLIENT_H_
