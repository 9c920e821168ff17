// Where a CUDA compile's time goes, stage by stage: import + lower + fuse,
// LLVM IR emission, libdevice link, the NVPTX optimisation pipeline, PTX
// emission and nvJitLink (ptxas). Each stage is timed (wall and the
// thread's CPU time) over --reps compiles of each graph; medians are
// printed. Stage boundaries are the ones Compile() uses (compile.cc).
//
//   build/bench/compiler/cuda_stage_profile [--reps=N] [--ab] [--ptx_dir=D]
//       [--vector_width=4|2|1] [--groups=G] chain10.json ...
//
// Graph files are looked up in examples/graphs (a path relative to it
// works too); inputs are 16-byte aligned,
// the target sm_90. --ab compares compiles with the trig functions compiled
// in each compile ("each") and precompiled ("pre"), interleaved. The first
// compile of each variant is a warm-up (nvJitLink's start-up, the
// precompiled trig functions) and is not counted.
#include <time.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "compiler/codegen_cuda.h"
#include "compiler/cuda_backend.h"
#include "compiler/fuse.h"
#include "compiler/lower.h"
#include "compiler/split_reductions.h"
#include "google/protobuf/util/json_util.h"
#include "graph/import.h"
#include "llvm/IR/LLVMContext.h"
#include "llvm/IR/Module.h"

namespace kiln {
namespace {

double ThreadCpuMs() {
  timespec ts;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

double WallMs() {
  return std::chrono::duration<double, std::milli>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

struct Samples {
  std::vector<double> wall, cpu;
};

double Median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

int Run(int argc, char** argv) {
  int reps = 11;
  std::string ptx_dir;  // --ptx_dir=D: writes D/<graph>.ptx and .log
  // --vector_width=4|2|1: GpuPlanOptions::pointwise_vector_width (0: the
  // default).
  int vector_width = 0;
  // --groups=G: GpuPlanOptions::pointwise_groups_per_thread (0: the default).
  int groups = 0;
  // --ab: NvptxOptimizeOptions::precompiled_trig off ("each") and on
  // ("pre"), one rep of each in turn.
  std::vector<std::pair<std::string, bool>> variants;
  std::vector<std::string> files;
  for (int i = 1; i < argc; ++i) {
    absl::string_view a = argv[i];
    if (absl::ConsumePrefix(&a, "--reps=")) {
      if (!absl::SimpleAtoi(a, &reps)) return 2;
    } else if (a == "--ab") {
      variants = {{"each", false}, {"pre", true}};
    } else if (absl::ConsumePrefix(&a, "--vector_width=")) {
      if (!absl::SimpleAtoi(a, &vector_width)) return 2;
    } else if (absl::ConsumePrefix(&a, "--groups=")) {
      if (!absl::SimpleAtoi(a, &groups)) return 2;
    } else if (absl::ConsumePrefix(&a, "--ptx_dir=")) {
      ptx_dir = std::string(a);
    } else {
      files.push_back(argv[i]);
    }
  }
  if (files.empty()) files = {"chain10.json", "chain30.json"};
  if (variants.empty()) variants = {{"default", true}};
  for (const std::string& file : files) {
    std::ifstream in(std::string(KILN_EXAMPLES_DIR) + "/" + file);
    std::stringstream ss;
    ss << in.rdbuf();
    v1::Graph proto;
    if (!google::protobuf::util::JsonStringToMessage(ss.str(), &proto).ok()) {
      std::fprintf(stderr, "cannot parse %s\n", file.c_str());
      return 1;
    }
    for (v1::Input& input : *proto.mutable_inputs())
      input.mutable_meta()->set_alignment(16);
    v1::CudaTarget target;
    target.set_arch("sm_90");
    std::vector<std::string> order;
    std::map<std::string, Samples> samples;
    size_t ptx_bytes = 0;
    // One untimed warm-up compile: nvJitLink's and libdevice's first use.
    const int nv = variants.size();
    for (int rv = -nv; rv < reps * nv; ++rv) {
      const int r = rv < 0 ? -1 : rv / nv;
      const auto& variant = variants[(rv + nv) % nv];
      const std::string vp = variant.first + " ";
      double wall = WallMs(), cpu = ThreadCpuMs();
      auto lap = [&](const std::string& stage) {
        const double w = WallMs(), c = ThreadCpuMs();
        if (r >= 0) {
          if (!samples.count(vp + stage)) order.push_back(vp + stage);
          samples[vp + stage].wall.push_back(w - wall);
          samples[vp + stage].cpu.push_back(c - cpu);
        }
        wall = w;
        cpu = c;
      };
      const double start_wall = wall, start_cpu = cpu;
      auto graph = ImportGraph(proto);
      if (!graph.ok()) return 1;
      auto loops = Lower(*graph);
      if (!loops.ok()) return 1;
      auto fused = Fuse(*loops, FuseOptions{true});
      if (!fused.ok()) return 1;
      *fused = SplitLongReductions(*std::move(fused));
      lap("import+lower+fuse");
      auto tm = MakeNvptxTargetMachine(target);
      if (!tm.ok()) return 1;
      lap("target machine");
      llvm::LLVMContext context;
      GpuPlanOptions plan_options;
      if (vector_width > 0) plan_options.pointwise_vector_width = vector_width;
      if (groups > 0) plan_options.pointwise_groups_per_thread = groups;
      const std::vector<GpuKernelPlan> plans =
          PlanGpuLaunches(*fused, plan_options);
      CudaCodegenOptions options;
      for (const GraphInput& gi : graph->inputs)
        options.input_alignment.push_back(gi.alignment);
      auto cuda = EmitCudaModule(*fused, plans, context, options);
      if (!cuda.ok()) return 1;
      llvm::Module& module = **cuda;
      module.setTargetTriple((*tm)->getTargetTriple().str());
      module.setDataLayout((*tm)->createDataLayout());
      lap("LLVM IR emission");
      if (!LinkLibdevice(module, false).ok()) return 1;
      lap("libdevice link");
      if (!OptimizeNvptxModule(module, **tm,
                               NvptxOptimizeOptions{variant.second})
               .ok())
        return 1;
      lap("NVPTX opt pipeline");
      auto ptx = EmitPtx(module, **tm);
      if (!ptx.ok()) return 1;
      lap("PTX codegen");
      auto cubin = LinkCubin({*ptx}, "sm_90");
      if (!cubin.ok()) {
        std::fprintf(stderr, "%s\n", cubin.status().ToString().c_str());
        return 1;
      }
      lap("nvJitLink");
      ptx_bytes = ptx->size();
      if (!ptx_dir.empty() && r == reps - 1) {
        const std::string base = file.substr(file.rfind('/') + 1);
        std::ofstream(ptx_dir + "/" + variant.first + "." + base + ".ptx")
            << *ptx;
        std::ofstream(ptx_dir + "/" + variant.first + "." + base + ".log")
            << cubin->log;
      }
      if (r >= 0) {
        if (!samples.count(vp + "total")) order.push_back(vp + "total");
        samples[vp + "total"].wall.push_back(WallMs() - start_wall);
        samples[vp + "total"].cpu.push_back(ThreadCpuMs() - start_cpu);
      }
    }
    std::sort(order.begin(), order.end());
    order.erase(std::unique(order.begin(), order.end()), order.end());
    std::printf(
        "%s (%d reps, PTX %zu bytes): wall ms median / thread CPU ms median, "
        "min\n",
        file.c_str(), reps, ptx_bytes);
    for (const std::string& stage : order) {
      const Samples& s = samples[stage];
      std::printf("  %-34s %8.2f %8.2f %8.2f\n", stage.c_str(), Median(s.wall),
                  Median(s.cpu), *std::min_element(s.cpu.begin(), s.cpu.end()));
    }
  }
  return 0;
}

}  // namespace
}  // namespace kiln

int main(int argc, char** argv) { return kiln::Run(argc, argv); }
