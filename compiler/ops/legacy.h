// TRANSITIONAL (issue 14): the old OpDef form, so the families not yet
// converted (compiler/ops/*_old.cc) keep registering while the others move
// to the signature/reference/lowering tables. Removed when the last family
// is converted.
#ifndef KILN_COMPILER_OPS_LEGACY_H_
#define KILN_COMPILER_OPS_LEGACY_H_

#include <string>
#include <utility>
#include <vector>

#include "compiler/op_lowering.h"
#include "compiler/op_reference.h"
#include "compiler/ops/lowering_util.h"
#include "compiler/ops/reference_util.h"
#include "graph/op_signature.h"
#include "graph/ops/signature_util.h"

namespace kiln {

struct OpDef {
  std::string name;
  OpClass op_class = OpClass::kPointwise;
  std::vector<ArgSpec> schema;
  int num_outputs = 1;
  ShapeRule shape;
  DTypeRule dtype;
  ReferenceFn reference;
  LowerFn lower;
};

// Adds each OpDef's parts to whichever of the three tables it was given.
class OpRegistry {
 public:
  OpRegistry(OpSignatures* signatures, OpReferences* references,
             OpLowerings* lowerings)
      : signatures_(signatures),
        references_(references),
        lowerings_(lowerings) {}
  void Add(OpDef def) {
    if (signatures_) {
      signatures_->Add(OpSignature{def.name, def.op_class, def.schema,
                                   def.num_outputs, def.shape, def.dtype});
    }
    if (references_ && def.reference) references_->Add(def.name, def.reference);
    if (lowerings_ && def.lower) lowerings_->Add(def.name, def.lower);
  }

 private:
  OpSignatures* signatures_;
  OpReferences* references_;
  OpLowerings* lowerings_;
};

void RegisterPointwiseOps(OpRegistry& registry);
void RegisterReductionOps(OpRegistry& registry);
void RegisterShapeOps(OpRegistry& registry);
void RegisterCompositeOps(OpRegistry& registry);

}  // namespace kiln

#endif  // KILN_COMPILER_OPS_LEGACY_H_
