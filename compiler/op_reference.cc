#include "compiler/op_reference.h"

#include <memory>

namespace kiln {

const OpReferences& OpReferences::Get() {
  // Built once at first use and never mutated afterwards (a registry built
  // at start-up).
  static const OpReferences* const table = [] {
    auto table = std::make_unique<OpReferences>();
    RegisterPointwiseReferences(*table);
    RegisterReductionReferences(*table);
    RegisterViewReferences(*table);
    RegisterIndexingReferences(*table);
    RegisterCreationReferences(*table);
    RegisterCompositeReferences(*table);
    RegisterMatmulReferences(*table);
    RegisterNormReferences(*table);
    RegisterPoolingReferences(*table);
    RegisterConvReferences(*table);
    RegisterAttentionReferences(*table);
    RegisterGatherScatterReferences(*table);
    RegisterRandomReferences(*table);
    RegisterSortReferences(*table);
    return table.release();  // lives for the process
  }();
  return *table;
}

}  // namespace kiln
