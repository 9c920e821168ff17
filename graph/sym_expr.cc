#include "graph/sym_expr.h"

#include <algorithm>
#include <iterator>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace kiln {

SymExpr::SymExpr(int64_t value) {
  if (value != 0) terms_.push_back(Term{value, {}});
}

SymExpr SymExpr::Symbol(int id) {
  SymExpr e;
  e.terms_.push_back(Term{1, {id}});
  return e;
}

bool SymExpr::IsConstant() const {
  return terms_.empty() || (terms_.size() == 1 && terms_[0].symbols.empty());
}

std::optional<int64_t> SymExpr::AsConstant() const {
  if (terms_.empty()) return 0;
  if (terms_.size() == 1 && terms_[0].symbols.empty()) return terms_[0].coeff;
  return std::nullopt;
}

std::optional<int> SymExpr::AsSymbol() const {
  if (terms_.size() == 1 && terms_[0].coeff == 1 &&
      terms_[0].symbols.size() == 1) {
    return terms_[0].symbols[0];
  }
  return std::nullopt;
}

void SymExpr::Canonicalize() {
  std::sort(terms_.begin(), terms_.end(),
            [](const Term& a, const Term& b) { return a.symbols < b.symbols; });
  std::vector<Term> merged;
  for (Term& t : terms_) {
    if (!merged.empty() && merged.back().symbols == t.symbols) {
      // Wrapping arithmetic: sizes are validated to stay far below 2^62.
      merged.back().coeff =
          static_cast<int64_t>(static_cast<uint64_t>(merged.back().coeff) +
                               static_cast<uint64_t>(t.coeff));
    } else {
      merged.push_back(std::move(t));
    }
  }
  merged.erase(std::remove_if(merged.begin(), merged.end(),
                              [](const Term& t) { return t.coeff == 0; }),
               merged.end());
  terms_ = std::move(merged);
}

SymExpr operator+(const SymExpr& a, const SymExpr& b) {
  SymExpr r = a;
  r.terms_.insert(r.terms_.end(), b.terms_.begin(), b.terms_.end());
  r.Canonicalize();
  return r;
}

SymExpr operator-(const SymExpr& a, const SymExpr& b) {
  SymExpr r = a;
  for (SymExpr::Term t : b.terms_) {
    t.coeff = static_cast<int64_t>(0 - static_cast<uint64_t>(t.coeff));
    r.terms_.push_back(std::move(t));
  }
  r.Canonicalize();
  return r;
}

SymExpr operator*(const SymExpr& a, const SymExpr& b) {
  SymExpr r;
  for (const SymExpr::Term& x : a.terms_) {
    for (const SymExpr::Term& y : b.terms_) {
      SymExpr::Term t;
      t.coeff = static_cast<int64_t>(static_cast<uint64_t>(x.coeff) *
                                     static_cast<uint64_t>(y.coeff));
      t.symbols = x.symbols;
      t.symbols.insert(t.symbols.end(), y.symbols.begin(), y.symbols.end());
      std::sort(t.symbols.begin(), t.symbols.end());
      r.terms_.push_back(std::move(t));
    }
  }
  r.Canonicalize();
  return r;
}

std::optional<SymExpr> SymExpr::DivExact(const SymExpr& a, const SymExpr& b) {
  if (b.terms_.size() != 1) {
    if (a == b && !a.terms_.empty()) return SymExpr(1);
    return std::nullopt;
  }
  const Term& d = b.terms_[0];
  SymExpr r;
  for (const Term& t : a.terms_) {
    if (t.coeff % d.coeff != 0) return std::nullopt;
    // Remove d's symbols (a sorted multiset) from t's.
    std::vector<int> rest;
    if (!std::includes(t.symbols.begin(), t.symbols.end(), d.symbols.begin(),
                       d.symbols.end())) {
      return std::nullopt;
    }
    std::set_difference(t.symbols.begin(), t.symbols.end(), d.symbols.begin(),
                        d.symbols.end(), std::back_inserter(rest));
    r.terms_.push_back(Term{t.coeff / d.coeff, std::move(rest)});
  }
  r.Canonicalize();
  return r;
}

bool SymExpr::NonNegativeFrom(int64_t min) const {
  SymExpr shifted;
  for (const Term& t : terms_) {
    SymExpr product(t.coeff);
    for (int s : t.symbols) product = product * (SymExpr(min) + Symbol(s));
    shifted = shifted + product;
  }
  for (const Term& t : shifted.terms_) {
    if (t.coeff < 0) return false;
  }
  return true;
}

bool SymExpr::NonNegativeWithin(int64_t min,
                                absl::Span<const int64_t> max_values) const {
  if (NonNegativeFrom(min)) return true;
  if (min > 0 && !terms_.empty()) {
    // Symbols every term has (s0 in 384*s0 - s0*s1) are positive factors:
    // the sign is the quotient's.
    std::vector<int> common = terms_[0].symbols;
    for (const Term& t : terms_) {
      std::vector<int> both;
      std::set_intersection(common.begin(), common.end(), t.symbols.begin(),
                            t.symbols.end(), std::back_inserter(both));
      common = std::move(both);
    }
    if (!common.empty()) {
      SymExpr quotient;
      for (const Term& t : terms_) {
        std::vector<int> rest;
        std::set_difference(t.symbols.begin(), t.symbols.end(), common.begin(),
                            common.end(), std::back_inserter(rest));
        quotient.terms_.push_back(Term{t.coeff, std::move(rest)});
      }
      quotient.Canonicalize();
      return quotient.NonNegativeWithin(min, max_values);
    }
  }
  __int128 least = 0;
  constexpr __int128 kLimit = static_cast<__int128>(1) << 100;
  for (const Term& t : terms_) {
    __int128 v = t.coeff;
    for (int s : t.symbols) {
      int64_t at = min;
      if (t.coeff < 0) {
        if (s >= static_cast<int>(max_values.size()) || max_values[s] <= 0) {
          return false;
        }
        at = max_values[s];
      }
      v *= at;
      if (v > kLimit || v < -kLimit) return false;
    }
    least += v;
  }
  return least >= 0;
}

int64_t SymExpr::Evaluate(absl::Span<const int64_t> values) const {
  uint64_t sum = 0;
  for (const Term& t : terms_) {
    uint64_t prod = static_cast<uint64_t>(t.coeff);
    for (int s : t.symbols) prod *= static_cast<uint64_t>(values[s]);
    sum += prod;
  }
  return static_cast<int64_t>(sum);
}

std::string SymExpr::ToString(absl::Span<const std::string> names) const {
  if (terms_.empty()) return "0";
  std::vector<std::string> parts;
  for (const Term& t : terms_) {
    std::vector<std::string> factors;
    if (t.coeff != 1 || t.symbols.empty()) {
      factors.push_back(absl::StrCat(t.coeff));
    }
    for (int s : t.symbols) {
      factors.push_back(
          s < static_cast<int>(names.size()) ? names[s] : absl::StrCat("s", s));
    }
    parts.push_back(absl::StrJoin(factors, "*"));
  }
  return absl::StrJoin(parts, " + ");
}

}  // namespace kiln
