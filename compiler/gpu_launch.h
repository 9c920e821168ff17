// Every block and grid choice of the CUDA code generator, in one place.
//
// A fused kernel (loop_ir.h) takes one of three forms:
//
//   kPointwise      no inner (reduced) dims. Each thread computes
//                   `vector_width` consecutive elements of the flattened
//                   range: one 128-bit load/store per buffer when the
//                   accesses are contiguous along the last dim and aligned,
//                   else scalar accesses. 256 threads per block (8 warps),
//                   grid = ceil(range / (256 * vector_width *
//                   groups_per_thread)). One element per thread for a
//                   static range of at most kMaxOneElementPerThread
//                   (the launch-overhead graphs: fewer blocks than SMs
//                   either way), else four elements per group, even
//                   for long bodies whose four unrolled copies make ptxas
//                   slow: measured on an H100 (bench/README.md, "Elements
//                   per thread"), 2 or 1 per thread compile chain-30 in
//                   ~30% less time but run 3-15% (2) and 8-40% (1) slower
//                   on every chain over 2^26 elements, as the four independent
//                   elements are the ILP and the bytes in flight these kernels
//                   need. With `lane_loop` (benchmarks only) a group's lanes
//                   run in a loop instead of being unrolled: the body is
//                   compiled once instead of vector_width times. Measured on an
//                   H200 (bench/README.md): chain-30 compiles in 63 ms
//                   instead of 103 but runs 12% slower (issue-bound: the
//                   lane selects add instructions; 34 registers instead of
//                   28 cut occupancy to 75%), so it is off.
//                   Each thread takes `groups_per_thread` such groups, the
//                   block's groups strided by 256 * vector_width (so each
//                   group's accesses stay coalesced), and in a whole tile
//                   loads every group's vectors before computing any: two
//                   groups (8 elements, as Triton's kernels for these
//                   chains) where the range is static and at least
//                   kMinPointwiseGroupsRange, the last dim a multiple of
//                   vector_width, and the body makes 1 to
//                   kMaxMathCallsForPointwiseGroups math-library calls,
//                   else one. Measured on an H100 (bench/README.md,
//                   "Pointwise groups per thread"): two groups run chain-5
//                   and chain-10 4-9% faster, chain-15/20/30 under 1%
//                   faster at about twice the compile time, chain-1 (no
//                   math call, bound by memory) 0.5% slower.
//   kPersistentRow  a row kernel whose row (the product of the inner dims)
//                   is static and at most kMaxPersistentRow elements (or
//                   kMaxPersistentRowOneLoad, reading one row tensor). The
//                   row stays in registers across the stages of the kernel
//                   (softmax reads its input once): each of the row's
//                   `threads_per_row` threads holds `groups_per_thread`
//                   (about kDefaultGroupsPerThread) groups of
//                   `vector_width` consecutive elements (groups of one,
//                   about one per thread, in a kernel of at most
//                   kMaxOneElementPerThread elements). Rows of at most
//                   kMaxRowPerThread elements take one thread each, 128
//                   rows per block, with no cross-thread reduction; short
//                   rows take one warp each, four rows per
//                   block, reduced with warp shuffles only; longer rows take
//                   a block of 128..1024 threads, reduced with shuffles and
//                   a 32-slot shared-memory exchange.
//   kLoopedRow      any other row kernel (dynamic or long rows): one block
//                   of 512 threads (1024 for a static row) per row loops
//                   over the row once per stage; re-reads of the row mostly
//                   hit L1/L2.
//   kColumn         a row kernel whose rows are columns in memory
//                   (IsColumnKernel: a bias gradient's or a layer norm
//                   weight's sum over the tokens of a [tokens, features]
//                   tensor), which a block per row would read with a
//                   stride: kColumnRows consecutive rows (columns) per
//                   block, one per lane of a warp, so that a warp's loads
//                   are adjacent, and kColumnThreads warps splitting each
//                   row, each looping over its share, kColumnUnroll
//                   elements at a time; the warps' partials meet in shared
//                   memory, combined in warp order (deterministic).
//
// The launch: range = the kernel's outer range (elements or rows), grid =
// max(1, ceil(range / items_per_block)) blocks of block_threads threads
// (artifact.proto's Launch).
#ifndef KILN_COMPILER_GPU_LAUNCH_H_
#define KILN_COMPILER_GPU_LAUNCH_H_

#include <cstdint>
#include <string>

#include "compiler/loop_ir.h"

namespace kiln {

inline constexpr int64_t kMaxPersistentRow = 32768;
// Persistent rows of at most this many elements take one thread each
// instead of a warp (whose other lanes would idle: a max-pool backward's
// 2x2 candidate windows left 28 of 32 lanes idle). Measured on an H100
// (bench/README.md, "Rows of a thread"): ResNet-18's max-pool backward
// (8M rows of 4, bfloat16) took 2.40 ms a step a warp per row, 0.16 ms a
// thread per row; the whole step 15.7 ms, then 13.4.
inline constexpr int64_t kMaxRowPerThread = 16;
// Rows of kernels that read one row tensor in three passes or more stay
// persistent up to this (GPT-2's vocabulary, 50257, included). Measured on
// an H100 (bench/README.md, session 12): the cross-entropy forward over
// 8192 rows of 50257 (log-softmax's max, sum of exps and store, and the
// target's gather) ran 1224 µs persistent against 2568 µs looped; its
// backward (a sum and a store: two passes) ran slower persistent (2204 µs
// against 1828) and stays looped.
inline constexpr int64_t kMaxPersistentRowOneLoad = 65536;
// kLoopedRow's block for static rows (too long for kPersistentRow); dynamic
// rows keep GpuPlanOptions::looped_row_threads (512). Measured on an H100
// (bench/README.md, session 12): the cross-entropy step's looped kernels
// over 8192 rows of 50257 ran 10-12% faster with 1024 threads a row than
// with 512, 27-29% slower with 256.
inline constexpr int kLoopedLongRowThreads = 1024;

// Pointwise bodies with more math-library calls (exp, log, sin, cos, tan,
// tanh, sigmoid, erf, pow, atan2, ...) keep one group per thread: the
// second group's copy of the body would double ptxas's time for ~1%.
inline constexpr int64_t kMaxMathCallsForPointwiseGroups = 4;
// Kernels over a static range of at most this many elements in all take
// one element per thread (pointwise), or groups of one, one per thread
// (persistent rows of up to 1024 elements): a pointwise kernel
// is at most 128 blocks of 256 threads, one partial wave on an H100's 132
// SMs, so wider groups only lengthen each thread's work (latency), while
// emitting the body 4 times makes ptxas ~2x slower (chain-30 on 8x16:
// 51 KB of PTX instead of 18).
inline constexpr int64_t kMaxOneElementPerThread = 32768;
// Nor do smaller or dynamic ranges take two: a tile that is not whole runs
// its elements one at a time (so the body is emitted once more, not twice),
// which only the last of many tiles may.
inline constexpr int64_t kMinPointwiseGroupsRange = 1 << 16;

// kColumn: rows per block (a warp's lanes), warps per row (the block's row
// threads), and the elements each thread loads before it accumulates.
inline constexpr int kColumnRows = 32;
inline constexpr int kColumnThreads = 16;
inline constexpr int kColumnUnroll = 4;

// Whether `kernel` is a row kernel whose rows are columns in memory: its
// stages are reductions and row stores only, and every load that moves
// along the row has stride 1 along the last outer dim and another along
// the last inner dim (the rows' elements), or does not move along the
// last outer dim at all (a value per row element shared by the columns, as
// layer norm's per-token statistics).
bool IsColumnKernel(const Kernel& kernel);

struct GpuKernelPlan {
  enum class Form : uint8_t { kPointwise, kPersistentRow, kLoopedRow, kColumn };
  Form form = Form::kPointwise;
  int block_threads = 256;
  int64_t items_per_block = 1024;  // elements (pointwise) or rows
  int vector_width = 4;            // consecutive elements per group
  int threads_per_row = 0;         // row forms
  int groups_per_thread = 0;       // kPersistentRow; kPointwise (>= 1)
  int64_t row_size = 0;            // kPersistentRow: elements per row
  bool lane_loop = false;          // kPointwise: lanes in a loop

  std::string ToString() const;
};

// Groups of `vector_width` elements each thread of a persistent row aims
// for: enough independent loads in flight per thread without starving the
// SM of warps.
// Measured on an H200 (bench/README.md): 4 takes layer norm 16384x4096 from
// 3.2 to 4.1 TB/s and changes no other benchmark row by more than 1%.
inline constexpr int kDefaultGroupsPerThread = 4;

// Reductions over few, long rows are split in two kernels
// (split_reductions.h): fewer than kSplitMaxRows rows of more than
// kMaxPersistentRow elements. Rows the persistent form takes whole stay one
// kernel: measured on an H100 (bench/README.md, "When to split"), sum,
// argmax and var over 8-128 rows of 8192 or 32768 run in 5-6 µs as one
// kernel and 8-13 µs split (the second launch costs more than the blocks it
// adds). S partial blocks per row bring rows * S to
// about kSplitTargetBlocks (several waves on 132 SMs), and each chunk to at
// most kMaxPersistentRow (the persistent form, with its 128-bit loads),
// while each partial block still reduces kSplitMinChunk elements or more.
// The one-pass split of centered second moments (var, layer norm) relies on
// the latter: its partial block runs the two-level reduction over a chunk
// kept in registers, so it reads the chunk once only in the persistent form
// (a chunk over kMaxPersistentRow, where no S fits, is fissioned instead).
// 1024 rather than 256 since batch norm (a row per channel: 64-512 rows of
// N*H*W, 100352 at ResNet's 32x256x56x56) left half the H100 idle with a
// block per row (bench/python/train_ops.py).
inline constexpr int64_t kSplitMaxRows = 1024;
inline constexpr int64_t kSplitTargetBlocks = 1024;
inline constexpr int64_t kSplitMinChunk = 4096;

// The number of partial blocks per row for `rows` rows of `row` elements:
// the largest S within the limits above that divides `row` (preferring a
// chunk divisible by 4, for 128-bit loads); 1 for no split.
int64_t ChooseReductionSplits(int64_t rows, int64_t row);

// Column kernels (kColumn) are split too when their blocks (kColumnRows rows
// each) are fewer than kColumnTargetBlocks: the column form keeps few
// loads in flight per SM, so a [8192, 768] sum over the tokens in 24 blocks
// is latency-bound (split_reductions.h; the partials [S, rows] are again
// read by adjacent rows). S brings the blocks to about kColumnTargetBlocks
// while each chunk keeps kColumnMinChunk elements or more, and divides the
// row; 1 for no split.
inline constexpr int64_t kColumnTargetBlocks = 512;
inline constexpr int64_t kColumnMinChunk = 256;
int64_t ChooseColumnSplits(int64_t rows, int64_t row);

// What benchmarks may change (none is part of the guard key).
struct GpuPlanOptions {
  int groups_per_thread = kDefaultGroupsPerThread;
  bool lane_loop = false;  // kPointwise: lanes in a loop
  // kPointwise: elements per group, 4, 2 or 1 (0: 4, or 1 for a small
  // static range, as described above).
  int pointwise_vector_width = 0;
  // Static ranges of at most this many elements take one element per
  // thread (kMaxOneElementPerThread; 0: none does).
  int64_t one_element_per_thread_max = kMaxOneElementPerThread;
  // kPointwise: groups per thread (0: two or one, as described above).
  int pointwise_groups_per_thread = 0;
  // Static rows of at most this many elements take kPersistentRow, longer
  // ones kLoopedRow. For benchmarks.
  int64_t max_persistent_row = kMaxPersistentRow;
  // When > 0: a persistent row of 1024 threads a row (rows over 4096
  // groups) that would hold more loaded values a thread than this (groups
  // x vector width x the kernel's distinct row loads; a 1024-thread block
  // has 64 registers a thread) takes kLoopedRow instead. Off (0) by
  // default: measured on an H100 (bench/README.md, session 12) with 32,
  // group norm's backward (1024 rows of 25088, two row loads, 412 bytes of
  // spills) ran 412 instead of 455 µs, but batch norm's backward partial
  // (the same row loads, no harmful spills) 301 instead of 181 µs. For
  // benchmarks.
  int64_t max_persistent_row_values = 0;
  // kLoopedRow: threads a row (a block). For benchmarks.
  int looped_row_threads = 512;
};

// The plan for `kernel`; a pure function of the kernel's structure and of
// `options`.
GpuKernelPlan PlanGpuKernel(const Kernel& kernel,
                            const GpuPlanOptions& options = {});

// The pipeline stage (compile.h): FusedProgram -> one plan per kernel, in
// kernel order. The CUDA emitter emits each kernel in its plan's form and
// the artifact's launches take their block and grid from it.
std::vector<GpuKernelPlan> PlanGpuLaunches(const FusedProgram& program,
                                           const GpuPlanOptions& options = {});

// The dump of that stage: one line per kernel, "name: plan".
std::string GpuPlansToString(const FusedProgram& program,
                             const std::vector<GpuKernelPlan>& plans);

}  // namespace kiln

#endif  // KILN_COMPILER_GPU_LAUNCH_H_
