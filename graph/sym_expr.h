// Integer expressions over symbolic sizes: a polynomial with int64
// coefficients in the graph's symbols (s0, s1, ...), kept in a canonical form
// so equality is structural. Static sizes are constant polynomials.
//
// Sizes of graph values, strides of inputs and (later) index expressions of
// the loop IR are SymExprs. Only the operations shapes need exist: +, -, *,
// exact division, and evaluation under concrete symbol values.
//
// Thread-safety: values, freely copyable and shareable.
#ifndef KILN_GRAPH_SYM_EXPR_H_
#define KILN_GRAPH_SYM_EXPR_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/types/span.h"

namespace kiln {

class SymExpr {
 public:
  // A product of symbols (sorted symbol ids, repeated for powers) times a
  // coefficient. The empty product is the constant term.
  struct Term {
    int64_t coeff = 0;
    std::vector<int> symbols;
    bool operator==(const Term&) const = default;
  };

  SymExpr() = default;     // zero
  SymExpr(int64_t value);  // NOLINT: constants convert implicitly
  static SymExpr Symbol(int id);

  bool IsConstant() const;
  // The value of a constant expression.
  std::optional<int64_t> AsConstant() const;
  // Whether this is exactly one symbol (coefficient 1, no constant).
  std::optional<int> AsSymbol() const;
  const std::vector<Term>& terms() const { return terms_; }

  friend SymExpr operator+(const SymExpr& a, const SymExpr& b);
  friend SymExpr operator-(const SymExpr& a, const SymExpr& b);
  friend SymExpr operator*(const SymExpr& a, const SymExpr& b);
  bool operator==(const SymExpr& o) const { return terms_ == o.terms_; }
  bool operator!=(const SymExpr& o) const { return !(*this == o); }

  // a / b when the division is exact in the polynomial ring (b a single
  // term dividing every term of a); nullopt otherwise.
  static std::optional<SymExpr> DivExact(const SymExpr& a, const SymExpr& b);

  // Whether the expression is >= 0 whenever every symbol is >= `min`,
  // by a sufficient test: after substituting s = min + t for each symbol,
  // every coefficient of the polynomial in the t's is >= 0. Exact for
  // a*s + b; conservative otherwise (may say false for a polynomial that
  // is non-negative, such as s0^2 - 2*s0*s1 + s1^2).
  // Coefficients must be small enough that the expansion does not wrap
  // (the importer bounds them).
  bool NonNegativeFrom(int64_t min) const;

  // Whether the expression is >= 0 whenever every symbol s is in
  // [min, max_values[s]] (max_values[s] <= 0: unbounded), by a sufficient
  // test: NonNegativeFrom(min), or the sum over terms of each term's least
  // value (a positive term at every symbol = min, a negative one at every
  // symbol = its max) is >= 0, after dividing out the symbols every term
  // has (positive when min > 0: 384*s0 - s0*s1 is tested as 384 - s1).
  // False when a negative term has an unbounded symbol. Used to prove a
  // slice end never passes its dim (s0 <= 512) and that input sizes and
  // strides are sizes (graph/import.cc).
  bool NonNegativeWithin(int64_t min,
                         absl::Span<const int64_t> max_values) const;

  // Value with symbol i bound to values[i].
  int64_t Evaluate(absl::Span<const int64_t> values) const;

  // Human-readable, e.g. "16*s0*s1 + 4". `names[i]` names symbol i; without
  // names symbols print as s<i>.
  std::string ToString(absl::Span<const std::string> names = {}) const;

 private:
  void Canonicalize();
  std::vector<Term> terms_;  // sorted by symbols, no zero coefficients
};

}  // namespace kiln

#endif  // KILN_GRAPH_SYM_EXPR_H_
