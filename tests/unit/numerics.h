// The tests' names for compiler/numerics.h: comparing compiled results with
// the reference evaluator, with per-dtype tolerances; seeded random inputs.
#ifndef KILN_TESTS_UNIT_NUMERICS_H_
#define KILN_TESTS_UNIT_NUMERICS_H_

#include "compiler/numerics.h"

namespace kiln::testing {

using numerics::Compare;
using numerics::FillRandom;
using numerics::RandomInputs;
using numerics::Tolerance;
using numerics::ToleranceFor;

}  // namespace kiln::testing

#endif  // KILN_TESTS_UNIT_NUMERICS_H_
