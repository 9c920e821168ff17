#include "compiler/op_lowering.h"

#include <memory>

namespace kiln {

const OpLowerings& OpLowerings::Get() {
  // Built once at first use and never mutated afterwards (a registry built
  // at start-up).
  static const OpLowerings* const table = [] {
    auto table = std::make_unique<OpLowerings>();
    RegisterPointwiseLowerings(*table);
    RegisterReductionLowerings(*table);
    RegisterViewLowerings(*table);
    RegisterIndexingLowerings(*table);
    RegisterCreationLowerings(*table);
    RegisterCompositeLowerings(*table);
    RegisterMatmulLowerings(*table);
    RegisterNormLowerings(*table);
    RegisterPoolingLowerings(*table);
    RegisterConvLowerings(*table);
    RegisterAttentionLowerings(*table);
    RegisterGatherScatterLowerings(*table);
    RegisterRandomLowerings(*table);
    RegisterSortLowerings(*table);
    return table.release();  // lives for the process
  }();
  return *table;
}

}  // namespace kiln
