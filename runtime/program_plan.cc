#include "runtime/program_plan.h"

#include <algorithm>
#include <optional>

#include "absl/strings/str_cat.h"

namespace kiln {
namespace {

absl::Status CheckPoly(const v1::SymPoly& poly, int num_symbols,
                       absl::string_view what) {
  for (const v1::SymPoly::Term& term : poly.terms()) {
    for (int s : term.symbols()) {
      if (s < 0 || s >= num_symbols) {
        return absl::InvalidArgumentError(absl::StrCat(
            "artifact: ", what, " uses symbol #", s, " of ", num_symbols));
      }
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<ProgramPlan> PlanProgram(const v1::Artifact& artifact,
                                        const LaunchLimits& limits) {
  ProgramPlan out;
  const v1::Program& program = artifact.program();
  const int num_symbols = artifact.symbols_size();
  const int num_buffers = program.buffers_size();
  out.element_size.assign(num_buffers, 0);
  out.temp_slot.assign(num_buffers, -1);
  out.outputs.assign(artifact.outputs_size(), ProgramPlan::Output{});
  std::vector<bool> output_seen(artifact.outputs_size(), false);

  for (int i = 0; i < artifact.inputs_size(); ++i) {
    const v1::InputGuard& g = artifact.inputs(i);
    for (const v1::SymPoly& p : g.sizes()) {
      if (absl::Status s = CheckPoly(p, num_symbols, "an input size");
          !s.ok()) {
        return s;
      }
    }
    for (const v1::SymPoly& p : g.strides()) {
      if (absl::Status s = CheckPoly(p, num_symbols, "an input stride");
          !s.ok()) {
        return s;
      }
    }
    if (g.strides_size() != g.sizes_size()) {
      return absl::InvalidArgumentError(
          absl::StrCat("artifact: input ", i, " guards ", g.sizes_size(),
                       " sizes and ", g.strides_size(), " strides"));
    }
  }

  for (int b = 0; b < num_buffers; ++b) {
    const v1::BufferSpec& spec = program.buffers(b);
    const std::optional<DType> dtype = DTypeFromWire(spec.dtype());
    if (!dtype) {
      return absl::InvalidArgumentError(absl::StrCat(
          "artifact: buffer ", b, " has unknown dtype #", spec.dtype()));
    }
    out.element_size[b] = DTypeSize(*dtype);
    if (absl::Status s = CheckPoly(spec.elements(), num_symbols,
                                   absl::StrCat("buffer ", b, "'s size"));
        !s.ok()) {
      return s;
    }
    switch (spec.kind()) {
      case v1::BufferSpec::INPUT:
        if (spec.index() < 0 || spec.index() >= artifact.inputs_size()) {
          return absl::InvalidArgumentError(
              absl::StrCat("artifact: buffer ", b, " is input ", spec.index(),
                           " of ", artifact.inputs_size()));
        }
        out.input_buffers.emplace_back(b, spec.index());
        break;
      case v1::BufferSpec::OUTPUT: {
        const int o = spec.index();
        if (o < 0 || o >= artifact.outputs_size() ||
            artifact.outputs(o).buffer() != b || output_seen[o]) {
          return absl::InvalidArgumentError(
              absl::StrCat("artifact: buffer ", b, " claims to be output ", o,
                           ", which the output specs do not give that buffer"));
        }
        output_seen[o] = true;
        const v1::OutputSpec& output = artifact.outputs(o);
        const std::optional<DType> out_dtype = DTypeFromWire(output.dtype());
        if (!out_dtype || *out_dtype != *dtype) {
          return absl::InvalidArgumentError(absl::StrCat(
              "artifact: output ", o, "'s dtype differs from its buffer's"));
        }
        for (const v1::SymPoly& p : output.sizes()) {
          if (absl::Status s = CheckPoly(p, num_symbols, "an output size");
              !s.ok()) {
            return s;
          }
        }
        out.outputs[o] =
            ProgramPlan::Output{b, *dtype, &output, &spec.elements()};
        break;
      }
      case v1::BufferSpec::TEMP:
        out.temp_slot[b] = out.num_temps++;
        break;
      default:
        return absl::InvalidArgumentError(
            absl::StrCat("artifact: buffer ", b, " has no kind"));
    }
  }
  for (int o = 0; o < artifact.outputs_size(); ++o) {
    if (!output_seen[o]) {
      return absl::InvalidArgumentError(
          absl::StrCat("artifact: no buffer holds output ", o));
    }
  }

  // Walk the steps as Run will, so that a launch never sees a temp that is
  // not allocated.
  std::vector<bool> allocated(num_buffers, false);
  for (int i = 0; i < program.steps_size(); ++i) {
    const v1::Step& step = program.steps(i);
    if (step.has_alloc() || step.has_free()) {
      const int b = step.has_alloc() ? step.alloc() : step.free();
      if (b < 0 || b >= num_buffers || out.temp_slot[b] < 0) {
        return absl::InvalidArgumentError(
            absl::StrCat("artifact: step ", i, " allocates or frees buffer ", b,
                         ", which is not a temp"));
      }
      if (allocated[b] == step.has_alloc()) {
        return absl::InvalidArgumentError(absl::StrCat(
            "artifact: step ", i, (step.has_alloc() ? " allocates" : " frees"),
            " buffer ", b,
            step.has_alloc() ? " twice" : " before allocating it"));
      }
      allocated[b] = step.has_alloc();
      out.steps.push_back(
          ProgramPlan::Step{step.has_alloc() ? ProgramPlan::Step::Kind::kAlloc
                                             : ProgramPlan::Step::Kind::kFree,
                            b});
      continue;
    }
    if (!step.has_launch()) {
      return absl::InvalidArgumentError(
          absl::StrCat("artifact: step ", i, " is empty"));
    }
    const v1::Launch& l = step.launch();
    const std::string where =
        absl::StrCat("step ", i, " (kernel '", l.kernel(), "')");
    if (l.kernel().empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat("artifact: step ", i, " launches no kernel"));
    }
    if (limits.max_block_threads > 0 &&
        (l.block_threads() < 1 ||
         l.block_threads() > limits.max_block_threads ||
         l.items_per_block() < 1)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "artifact: ", where, " has block_threads ", l.block_threads(),
          " and items_per_block ", l.items_per_block()));
    }
    if (limits.max_kernel_params > 0 &&
        l.buffers_size() + num_symbols > limits.max_kernel_params) {
      return absl::InvalidArgumentError(absl::StrCat(
          "artifact: ", where, " takes ", l.buffers_size() + num_symbols,
          " parameters, more than a launch can pass"));
    }
    if (absl::Status s = CheckPoly(l.range(), num_symbols, where + "'s range");
        !s.ok()) {
      return s;
    }
    ProgramPlan::Launch plan;
    plan.kernel = &l.kernel();
    plan.range = &l.range();
    plan.items_per_block = l.items_per_block();
    plan.block_threads = static_cast<unsigned>(l.block_threads());
    plan.grain = std::max<int64_t>(l.grain(), 1);
    plan.first_slot = static_cast<int>(out.launch_slots.size());
    plan.num_slots = l.buffers_size();
    for (int b : l.buffers()) {
      if (b < 0 || b >= num_buffers) {
        return absl::InvalidArgumentError(absl::StrCat(
            "artifact: ", where, " passes buffer ", b, " of ", num_buffers));
      }
      if (out.temp_slot[b] >= 0 && !allocated[b]) {
        return absl::InvalidArgumentError(
            absl::StrCat("artifact: ", where, " uses temp buffer ", b,
                         " while it is not allocated"));
      }
      out.launch_slots.push_back(b);
    }
    out.max_params = std::max(out.max_params, l.buffers_size() + num_symbols);
    out.steps.push_back(
        ProgramPlan::Step{ProgramPlan::Step::Kind::kLaunch,
                          static_cast<int>(out.launches.size())});
    out.launches.push_back(plan);
  }
  return out;
}

}  // namespace kiln
