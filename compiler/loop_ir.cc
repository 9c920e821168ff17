#include "compiler/loop_ir.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <optional>

#include "absl/container/flat_hash_map.h"
#include "absl/hash/hash.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace kiln {
namespace ir {
namespace {

uint64_t Mix(uint64_t h, uint64_t v) {
  return (h ^ v) * 0x100000001b3ull + (h >> 29);
}

Expr Make(ExprOp op, DType dtype, std::vector<Expr> args, double f = 0,
          int64_t i = 0, int index = 0) {
  auto n = std::make_shared<ExprNode>();
  n->op = op;
  n->dtype = dtype;
  n->f = f;
  n->i = i;
  n->index = index;
  uint64_t h = Mix(0xcbf29ce484222325ull, static_cast<uint64_t>(op));
  h = Mix(h, static_cast<uint64_t>(dtype));
  uint64_t fb;
  std::memcpy(&fb, &f, 8);
  h = Mix(Mix(Mix(h, fb), static_cast<uint64_t>(i)),
          static_cast<uint64_t>(index));
  for (const Expr& a : args) h = Mix(h, a->hash);
  n->hash = h;
  n->args = std::move(args);
  return n;
}

std::optional<int64_t> IntValue(const Expr& e) {
  if (e->op == ExprOp::kConst && !IsFloating(e->dtype)) return e->i;
  return std::nullopt;
}

// floor(a / b) for b != 0 (PyTorch's floor division).
int64_t FloorDivConst(int64_t a, int64_t b) {
  int64_t q = a / b;
  if ((a % b != 0) && ((a < 0) != (b < 0))) --q;
  return q;
}

}  // namespace

Expr Const(double v, DType dtype) {
  if (!IsFloating(dtype)) return IntConst(static_cast<int64_t>(v), dtype);
  return Make(ExprOp::kConst, dtype, {}, v);
}
Expr IntConst(int64_t v, DType dtype) {
  return Make(ExprOp::kConst, dtype, {}, 0, v);
}
Expr Var(int index) {
  return Make(ExprOp::kVar, DType::kInt64, {}, 0, 0, index);
}
Expr Sym(int index) {
  return Make(ExprOp::kSym, DType::kInt64, {}, 0, 0, index);
}
Expr Load(int node, std::vector<Expr> index, DType dtype) {
  return Make(ExprOp::kLoad, dtype, std::move(index), 0, 0, node);
}
Expr LoadBuffer(int slot, Expr offset, DType dtype) {
  return Make(ExprOp::kLoadBuffer, dtype, {std::move(offset)}, 0, 0, slot);
}
Expr Acc(int stage, DType dtype) {
  return Make(ExprOp::kAcc, dtype, {}, 0, 0, stage);
}
Expr Cast(Expr x, DType to) {
  if (x->dtype == to) return x;
  return Make(ExprOp::kCast, to, {std::move(x)});
}
Expr Unary(ExprOp op, Expr x, DType dtype) {
  return Make(op, dtype, {std::move(x)});
}
Expr Binary(ExprOp op, Expr a, Expr b, DType dtype) {
  return Make(op, dtype, {std::move(a), std::move(b)});
}
Expr Select(Expr cond, Expr a, Expr b) {
  const DType d = a->dtype;
  return Make(ExprOp::kSelect, d,
              {std::move(cond), std::move(a), std::move(b)});
}
Expr Philox(Expr seed, Expr offset, Expr index, int word) {
  return Make(ExprOp::kPhilox, DType::kInt64,
              {std::move(seed), std::move(offset), std::move(index)}, 0, word);
}

Expr Check(Expr value, Expr bad, Expr raw, int site, int error_slot) {
  if (auto c = IntValue(bad); c && *c == 0) return value;
  const DType d = value->dtype;
  return Make(ExprOp::kCheck, d,
              {std::move(value), std::move(bad), std::move(raw)}, 0, site,
              error_slot);
}

Expr Add(Expr a, Expr b) {
  auto ca = IntValue(a), cb = IntValue(b);
  if (ca && cb) return IntConst(*ca + *cb);
  if (ca && *ca == 0) return b;
  if (cb && *cb == 0) return a;
  return Make(ExprOp::kAdd, DType::kInt64, {std::move(a), std::move(b)});
}
Expr Mul(Expr a, Expr b) {
  auto ca = IntValue(a), cb = IntValue(b);
  if (ca && cb) return IntConst(*ca * *cb);
  if ((ca && *ca == 0) || (cb && *cb == 0)) return IntConst(0);
  if (ca && *ca == 1) return b;
  if (cb && *cb == 1) return a;
  return Make(ExprOp::kMul, DType::kInt64, {std::move(a), std::move(b)});
}
Expr FloorDiv(Expr a, Expr b) {
  auto ca = IntValue(a), cb = IntValue(b);
  if (cb && *cb == 1) return a;
  if (ca && *ca == 0) return a;
  if (ca && cb && *cb != 0) return IntConst(FloorDivConst(*ca, *cb));
  return Make(ExprOp::kFloorDiv, DType::kInt64, {std::move(a), std::move(b)});
}
Expr Mod(Expr a, Expr b) {
  auto ca = IntValue(a), cb = IntValue(b);
  if (cb && *cb == 1) return IntConst(0);
  if (ca && *ca == 0) return a;
  if (ca && cb && *cb != 0) {
    int64_t r = *ca % *cb;
    if (r != 0 && ((r < 0) != (*cb < 0))) r += *cb;
    return IntConst(r);
  }
  return Make(ExprOp::kRemainder, DType::kInt64, {std::move(a), std::move(b)});
}

Expr FromSym(const SymExpr& e) {
  Expr sum = IntConst(0);
  for (const SymExpr::Term& t : e.terms()) {
    Expr prod = IntConst(t.coeff);
    for (int s : t.symbols) prod = Mul(prod, Sym(s));
    sum = Add(sum, prod);
  }
  return sum;
}

bool ContainsOp(const Expr& e, ExprOp op) {
  if (!e) return false;
  if (e->op == op) return true;
  for (const Expr& a : e->args) {
    if (ContainsOp(a, op)) return true;
  }
  return false;
}

namespace {
void CollectLoads(const Expr& e, absl::flat_hash_set<int>& nodes,
                  absl::flat_hash_set<const ExprNode*>& seen) {
  if (!seen.insert(e.get()).second) return;
  if (e->op == ExprOp::kLoad) nodes.insert(e->index);
  for (const Expr& a : e->args) CollectLoads(a, nodes, seen);
}
}  // namespace

absl::flat_hash_set<int> LoadsOf(const Expr& e) {
  absl::flat_hash_set<int> nodes;
  absl::flat_hash_set<const ExprNode*> seen;
  if (e) CollectLoads(e, nodes, seen);
  return nodes;
}

bool Equal(const Expr& a, const Expr& b) {
  if (a == b) return true;
  if (a->hash != b->hash || a->op != b->op || a->dtype != b->dtype ||
      a->i != b->i || a->index != b->index ||
      a->args.size() != b->args.size()) {
    return false;
  }
  if (!(a->f == b->f || (std::isnan(a->f) && std::isnan(b->f)))) return false;
  for (size_t k = 0; k < a->args.size(); ++k) {
    if (!Equal(a->args[k], b->args[k])) return false;
  }
  return true;
}

Expr Rebuild(const Expr& e, std::vector<Expr> args) {
  switch (e->op) {
    case ExprOp::kAdd:
      if (e->dtype == DType::kInt64) return Add(args[0], args[1]);
      break;
    case ExprOp::kMul:
      if (e->dtype == DType::kInt64) return Mul(args[0], args[1]);
      break;
    case ExprOp::kFloorDiv:
      if (e->dtype == DType::kInt64) return FloorDiv(args[0], args[1]);
      break;
    case ExprOp::kRemainder:
      if (e->dtype == DType::kInt64) return Mod(args[0], args[1]);
      break;
    default:
      break;
  }
  return Make(e->op, e->dtype, std::move(args), e->f, e->i, e->index);
}

Expr SubstituteVars(const Expr& e, const std::vector<Expr>& vars) {
  absl::flat_hash_map<const ExprNode*, Expr> memo;
  std::function<Expr(const Expr&)> go = [&](const Expr& x) -> Expr {
    if (x->op == ExprOp::kVar) return vars[x->index];
    if (x->args.empty()) return x;
    auto it = memo.find(x.get());
    if (it != memo.end()) return it->second;
    std::vector<Expr> args;
    bool changed = false;
    for (const Expr& a : x->args) {
      args.push_back(go(a));
      changed |= args.back() != a;
    }
    Expr r = changed ? Rebuild(x, std::move(args)) : x;
    memo.emplace(x.get(), r);
    return r;
  };
  return go(e);
}

namespace {
const char* OpName(ExprOp op) {
  switch (op) {
    case ExprOp::kConst:
      return "const";
    case ExprOp::kVar:
      return "var";
    case ExprOp::kSym:
      return "sym";
    case ExprOp::kLoad:
      return "load";
    case ExprOp::kLoadBuffer:
      return "load_buffer";
    case ExprOp::kAcc:
      return "acc";
    case ExprOp::kCast:
      return "cast";
    case ExprOp::kNeg:
      return "neg";
    case ExprOp::kAbs:
      return "abs";
    case ExprOp::kExp:
      return "exp";
    case ExprOp::kExp2:
      return "exp2";
    case ExprOp::kExpm1:
      return "expm1";
    case ExprOp::kLog:
      return "log";
    case ExprOp::kLog2:
      return "log2";
    case ExprOp::kLog1p:
      return "log1p";
    case ExprOp::kSqrt:
      return "sqrt";
    case ExprOp::kRsqrt:
      return "rsqrt";
    case ExprOp::kReciprocal:
      return "reciprocal";
    case ExprOp::kSin:
      return "sin";
    case ExprOp::kCos:
      return "cos";
    case ExprOp::kTan:
      return "tan";
    case ExprOp::kTanh:
      return "tanh";
    case ExprOp::kSigmoid:
      return "sigmoid";
    case ExprOp::kErf:
      return "erf";
    case ExprOp::kFloor:
      return "floor";
    case ExprOp::kCeil:
      return "ceil";
    case ExprOp::kRound:
      return "round";
    case ExprOp::kTrunc:
      return "trunc";
    case ExprOp::kSign:
      return "sign";
    case ExprOp::kRelu:
      return "relu";
    case ExprOp::kNot:
      return "not";
    case ExprOp::kBitNot:
      return "bitnot";
    case ExprOp::kIsNan:
      return "isnan";
    case ExprOp::kAdd:
      return "add";
    case ExprOp::kSub:
      return "sub";
    case ExprOp::kMul:
      return "mul";
    case ExprOp::kDiv:
      return "div";
    case ExprOp::kFloorDiv:
      return "floordiv";
    case ExprOp::kRemainder:
      return "remainder";
    case ExprOp::kFmod:
      return "fmod";
    case ExprOp::kPow:
      return "pow";
    case ExprOp::kMax:
      return "max";
    case ExprOp::kMin:
      return "min";
    case ExprOp::kAtan2:
      return "atan2";
    case ExprOp::kEq:
      return "eq";
    case ExprOp::kNe:
      return "ne";
    case ExprOp::kLt:
      return "lt";
    case ExprOp::kLe:
      return "le";
    case ExprOp::kGt:
      return "gt";
    case ExprOp::kGe:
      return "ge";
    case ExprOp::kAnd:
      return "and";
    case ExprOp::kOr:
      return "or";
    case ExprOp::kBitAnd:
      return "bitand";
    case ExprOp::kBitOr:
      return "bitor";
    case ExprOp::kSelect:
      return "select";
    case ExprOp::kPhilox:
      return "philox";
    case ExprOp::kCheck:
      return "check";
  }
  return "?";
}
}  // namespace

std::string ToString(const Expr& e, const std::vector<std::string>& names) {
  switch (e->op) {
    case ExprOp::kConst:
      return IsFloating(e->dtype) ? absl::StrCat(e->f) : absl::StrCat(e->i);
    case ExprOp::kVar:
      return absl::StrCat("v", e->index);
    case ExprOp::kSym:
      return e->index < static_cast<int>(names.size())
                 ? names[e->index]
                 : absl::StrCat("s", e->index);
    case ExprOp::kAcc:
      return absl::StrCat("acc", e->index);
    case ExprOp::kAdd:
      if (e->dtype == DType::kInt64)
        return absl::StrCat("(", ToString(e->args[0], names), " + ",
                            ToString(e->args[1], names), ")");
      break;
    case ExprOp::kMul:
      if (e->dtype == DType::kInt64)
        return absl::StrCat(ToString(e->args[0], names), "*",
                            ToString(e->args[1], names));
      break;
    default:
      break;
  }
  std::vector<std::string> parts;
  for (const Expr& a : e->args) parts.push_back(ToString(a, names));
  std::string head = OpName(e->op);
  if (e->op == ExprOp::kLoad) head = absl::StrCat("%", e->index);
  if (e->op == ExprOp::kLoadBuffer) head = absl::StrCat("buf", e->index);
  if (e->op == ExprOp::kCast) head = absl::StrCat("to_", DTypeName(e->dtype));
  if (e->op == ExprOp::kPhilox) head = absl::StrCat("philox", e->i);
  if (e->op == ExprOp::kCheck) head = absl::StrCat("check", e->i);
  return absl::StrCat(
      head, e->op == ExprOp::kLoad || e->op == ExprOp::kLoadBuffer ? "[" : "(",
      absl::StrJoin(parts, ", "),
      e->op == ExprOp::kLoad || e->op == ExprOp::kLoadBuffer ? "]" : ")");
}

Expr Rewriter::Run(const Expr& e) {
  if (!e) return e;
  if (auto hit = Find(e)) return *hit;
  std::vector<Expr> args;
  bool changed = false;
  for (const Expr& a : e->args) {
    args.push_back(Run(a));
    changed |= args.back() != a;
  }
  Expr rebuilt = e;
  if (changed) {
    auto n = std::make_shared<ExprNode>(*e);
    n->args = std::move(args);
    // Recompute the hash over the new args through a rebuild by
    // substitution of nothing: SubstituteVars with identity keeps folding.
    rebuilt = Recons(n);
  }
  std::optional<Expr> replaced = fn_(rebuilt);
  Expr result = replaced ? *replaced : rebuilt;
  memo_[e->hash].push_back({e, result});
  return result;
}

Expr Rewriter::Recons(const std::shared_ptr<ExprNode>& n) {
  switch (n->op) {
    case ExprOp::kConst:
    case ExprOp::kVar:
    case ExprOp::kSym:
    case ExprOp::kAcc:
      return n;
    case ExprOp::kLoad:
      return ir::Load(n->index, n->args, n->dtype);
    case ExprOp::kLoadBuffer:
      return ir::LoadBuffer(n->index, n->args[0], n->dtype);
    case ExprOp::kSelect:
      return ir::Select(n->args[0], n->args[1], n->args[2]);
    case ExprOp::kPhilox:
      return ir::Philox(n->args[0], n->args[1], n->args[2],
                        static_cast<int>(n->i));
    case ExprOp::kCheck:
      return ir::Check(n->args[0], n->args[1], n->args[2],
                       static_cast<int>(n->i), n->index);
    case ExprOp::kCast:
      return ir::Cast(n->args[0], n->dtype);
    default:
      break;
  }
  if (n->args.size() == 1) return ir::Unary(n->op, n->args[0], n->dtype);
  if (n->dtype == DType::kInt64) {
    switch (n->op) {
      case ExprOp::kAdd:
        return ir::Add(n->args[0], n->args[1]);
      case ExprOp::kMul:
        return ir::Mul(n->args[0], n->args[1]);
      case ExprOp::kFloorDiv:
        return ir::FloorDiv(n->args[0], n->args[1]);
      case ExprOp::kRemainder:
        return ir::Mod(n->args[0], n->args[1]);
      default:
        break;
    }
  }
  return ir::Binary(n->op, n->args[0], n->args[1], n->dtype);
}

std::optional<Expr> Rewriter::Find(const Expr& e) {
  auto it = memo_.find(e->hash);
  if (it == memo_.end()) return std::nullopt;
  for (const auto& [k, v] : it->second) {
    if (ir::Equal(k, e)) return v;
  }
  return std::nullopt;
}

}  // namespace ir

namespace ir {
namespace {

// floor(x / divisor) mod modulus (modulus 0: no modulus) times coeff.
struct DivModAtom {
  Expr x;
  SymExpr divisor;
  SymExpr modulus;
  SymExpr coeff;
};

struct Linear {
  SymExpr constant;
  std::vector<SymExpr> vars;
  std::vector<DivModAtom> atoms;
  bool IsConstant() const {
    if (!atoms.empty()) return false;
    for (const SymExpr& c : vars) {
      if (c != SymExpr(0)) return false;
    }
    return true;
  }
};

// A symbol-only int64 expression as a polynomial.
std::optional<SymExpr> AsPoly(const Expr& e) {
  switch (e->op) {
    case ExprOp::kConst:
      return SymExpr(e->i);
    case ExprOp::kSym:
      return SymExpr::Symbol(e->index);
    case ExprOp::kAdd:
    case ExprOp::kMul: {
      auto a = AsPoly(e->args[0]), b = AsPoly(e->args[1]);
      if (!a || !b) return std::nullopt;
      return e->op == ExprOp::kAdd ? *a + *b : *a * *b;
    }
    default:
      return std::nullopt;
  }
}

void AddScaled(Linear& into, const Linear& l, const SymExpr& scale) {
  into.constant = into.constant + l.constant * scale;
  for (size_t i = 0; i < l.vars.size(); ++i)
    into.vars[i] = into.vars[i] + l.vars[i] * scale;
  for (const DivModAtom& a : l.atoms) {
    DivModAtom scaled = a;
    scaled.coeff = a.coeff * scale;
    into.atoms.push_back(std::move(scaled));
  }
}

std::optional<Linear> ToLinear(const Expr& e, int num_vars);

// Applies floor(x/p) mod s + s * (floor(x/(p*s)) mod t) = floor(x/p) mod
// (s*t) (t = 0: no modulus) and floor(x/1) = x until nothing changes.
bool FoldDivMods(Linear& l, int num_vars) {
  for (bool changed = true; changed;) {
    changed = false;
    for (size_t i = 0; i < l.atoms.size() && !changed; ++i) {
      const DivModAtom& a = l.atoms[i];
      if (a.divisor == SymExpr(1) && a.modulus == SymExpr(0)) {
        std::optional<Linear> x = ToLinear(a.x, num_vars);
        if (!x) return false;
        const SymExpr coeff = a.coeff;
        l.atoms.erase(l.atoms.begin() + i);
        AddScaled(l, *x, coeff);
        changed = true;
        break;
      }
      if (a.modulus == SymExpr(0)) continue;
      for (size_t j = 0; j < l.atoms.size(); ++j) {
        const DivModAtom& b = l.atoms[j];
        if (j == i || !Equal(a.x, b.x) || b.divisor != a.divisor * a.modulus ||
            b.coeff != a.coeff * a.modulus) {
          continue;
        }
        DivModAtom merged{
            a.x, a.divisor,
            b.modulus == SymExpr(0) ? SymExpr(0) : a.modulus * b.modulus,
            a.coeff};
        l.atoms.erase(l.atoms.begin() + std::max(i, j));
        l.atoms.erase(l.atoms.begin() + std::min(i, j));
        l.atoms.push_back(std::move(merged));
        changed = true;
        break;
      }
    }
  }
  return true;
}

std::optional<Linear> ToLinear(const Expr& e, int num_vars) {
  Linear l;
  l.vars.assign(num_vars, SymExpr(0));
  switch (e->op) {
    case ExprOp::kConst:
      if (IsFloating(e->dtype)) return std::nullopt;
      l.constant = SymExpr(e->i);
      return l;
    case ExprOp::kSym:
      l.constant = SymExpr::Symbol(e->index);
      return l;
    case ExprOp::kVar:
      if (e->index >= num_vars) return std::nullopt;
      l.vars[e->index] = SymExpr(1);
      return l;
    case ExprOp::kNeg: {
      auto a = ToLinear(e->args[0], num_vars);
      if (!a) return std::nullopt;
      AddScaled(l, *a, SymExpr(-1));
      return l;
    }
    case ExprOp::kAdd:
    case ExprOp::kSub: {
      auto a = ToLinear(e->args[0], num_vars);
      auto b = ToLinear(e->args[1], num_vars);
      if (!a || !b) return std::nullopt;
      AddScaled(l, *a, SymExpr(1));
      AddScaled(l, *b, SymExpr(e->op == ExprOp::kAdd ? 1 : -1));
      return l;
    }
    case ExprOp::kMul: {
      auto a = ToLinear(e->args[0], num_vars);
      auto b = ToLinear(e->args[1], num_vars);
      if (!a || !b) return std::nullopt;
      if (b->IsConstant()) {
        AddScaled(l, *a, b->constant);
      } else if (a->IsConstant()) {
        AddScaled(l, *b, a->constant);
      } else {
        return std::nullopt;
      }
      return l;
    }
    case ExprOp::kFloorDiv:
    case ExprOp::kRemainder: {
      std::optional<SymExpr> by = AsPoly(e->args[1]);
      if (!by) return std::nullopt;
      DivModAtom atom{e->args[0], SymExpr(1), SymExpr(0), SymExpr(1)};
      if (e->op == ExprOp::kRemainder) {
        atom.modulus = *by;
        // (floor(y / p)) mod s
        if (atom.x->op == ExprOp::kFloorDiv) {
          std::optional<SymExpr> p = AsPoly(atom.x->args[1]);
          if (!p) return std::nullopt;
          atom.divisor = *p;
          atom.x = atom.x->args[0];
        }
      } else {
        atom.divisor = *by;
      }
      l.atoms.push_back(std::move(atom));
      return l;
    }
    default:
      return std::nullopt;
  }
}

}  // namespace

std::optional<AffineForm> Affine(const Expr& e, int num_vars) {
  std::optional<Linear> l = ToLinear(e, num_vars);
  if (!l || !FoldDivMods(*l, num_vars) || !l->atoms.empty())
    return std::nullopt;
  return AffineForm{std::move(l->constant), std::move(l->vars)};
}

namespace {

// a * b, or nullopt on overflow.
std::optional<int64_t> CheckedMul(int64_t a, int64_t b) {
  int64_t out;
  if (__builtin_mul_overflow(a, b, &out)) return std::nullopt;
  return out;
}
std::optional<int64_t> CheckedAdd(int64_t a, int64_t b) {
  int64_t out;
  if (__builtin_add_overflow(a, b, &out)) return std::nullopt;
  return out;
}

// An int64 expression as constant + sum of coeff * atom; an atom is any
// node but a sum, a difference, a negation or a product by a constant.
struct Terms {
  int64_t constant = 0;
  std::vector<std::pair<int64_t, Expr>> terms;  // (coeff, atom)
};

// An atom as floor(x / p) mod s (s = 0: no modulus).
struct DivMod {
  Expr x;
  int64_t p = 1;
  int64_t s = 0;
};

std::optional<DivMod> AsDivMod(const Expr& atom) {
  auto constant = [](const Expr& e) -> std::optional<int64_t> {
    if (e->op != ExprOp::kConst || e->dtype != DType::kInt64) return {};
    if (e->i <= 0) return std::nullopt;
    return e->i;
  };
  if (atom->dtype != DType::kInt64) return std::nullopt;
  if (atom->op == ExprOp::kFloorDiv) {
    std::optional<int64_t> p = constant(atom->args[1]);
    if (!p) return std::nullopt;
    return DivMod{atom->args[0], *p, 0};
  }
  if (atom->op == ExprOp::kRemainder) {
    std::optional<int64_t> s = constant(atom->args[1]);
    if (!s) return std::nullopt;
    const Expr& x = atom->args[0];
    if (x->op == ExprOp::kFloorDiv && x->dtype == DType::kInt64) {
      if (std::optional<int64_t> p = constant(x->args[1])) {
        return DivMod{x->args[0], *p, *s};
      }
    }
    return DivMod{x, 1, *s};
  }
  return std::nullopt;
}

Expr FromDivMod(const DivMod& d) {
  Expr e = d.p == 1 ? d.x : FloorDiv(d.x, IntConst(d.p));
  return d.s == 0 ? e : Mod(e, IntConst(d.s));
}

// constant + sum coeff * atom, in the terms' order.
Expr Build(int64_t constant,
           const std::vector<std::pair<int64_t, Expr>>& terms) {
  Expr sum;
  for (const auto& [c, atom] : terms) {
    Expr term = c == 1 ? atom : Mul(atom, IntConst(c));
    sum = sum ? Add(sum, term) : term;
  }
  if (!sum) return IntConst(constant);
  return constant == 0 ? sum : Add(sum, IntConst(constant));
}

class IndexSimplifier {
 public:
  explicit IndexSimplifier(const std::vector<std::optional<IndexRange>>& vars)
      : vars_(vars), rewriter_([this](const Expr& e) { return Visit(e); }) {}

  Expr Run(const Expr& e) { return rewriter_.Run(e); }

 private:
  std::optional<Expr> Visit(const Expr& e) {
    if (e->dtype != DType::kInt64) return std::nullopt;
    switch (e->op) {
      case ExprOp::kFloorDiv:
        return Divide(e->args[0], e->args[1], /*remainder=*/false);
      case ExprOp::kRemainder:
        return Divide(e->args[0], e->args[1], /*remainder=*/true);
      case ExprOp::kAdd:
      case ExprOp::kSub:
        return Recombine(e);
      default:
        return std::nullopt;
    }
  }

  // Adds scale * e to `out`; false on overflow.
  bool Decompose(const Expr& e, int64_t scale, Terms& out) {
    if (e->dtype == DType::kInt64) {
      if (e->op == ExprOp::kConst) {
        std::optional<int64_t> v = CheckedMul(e->i, scale);
        std::optional<int64_t> sum =
            v ? CheckedAdd(out.constant, *v) : std::nullopt;
        if (!sum) return false;
        out.constant = *sum;
        return true;
      }
      switch (e->op) {
        case ExprOp::kAdd:
          return Decompose(e->args[0], scale, out) &&
                 Decompose(e->args[1], scale, out);
        case ExprOp::kSub: {
          if (scale == INT64_MIN) return false;
          return Decompose(e->args[0], scale, out) &&
                 Decompose(e->args[1], -scale, out);
        }
        case ExprOp::kNeg:
          if (scale == INT64_MIN) return false;
          return Decompose(e->args[0], -scale, out);
        case ExprOp::kMul:
          for (int k : {1, 0}) {
            const Expr& c = e->args[k];
            if (c->op == ExprOp::kConst) {
              std::optional<int64_t> v = CheckedMul(c->i, scale);
              return v && Decompose(e->args[1 - k], *v, out);
            }
          }
          break;
        default:
          break;
      }
    }
    for (auto it = out.terms.begin(); it != out.terms.end(); ++it) {
      if (!Equal(it->second, e)) continue;
      std::optional<int64_t> sum = CheckedAdd(it->first, scale);
      if (!sum) return false;
      it->first = *sum;
      if (*sum == 0) out.terms.erase(it);
      return true;
    }
    if (scale != 0) out.terms.push_back({scale, e});
    return true;
  }

  std::optional<IndexRange> Range(const Expr& e) {
    auto it = ranges_.find(e.get());
    if (it != ranges_.end()) return it->second;
    std::optional<IndexRange> r = ComputeRange(e);
    ranges_.emplace(e.get(), r);
    keep_.push_back(e);
    return r;
  }

  std::optional<IndexRange> ComputeRange(const Expr& e) {
    if (e->dtype != DType::kInt64) return std::nullopt;
    auto scaled = [](IndexRange r, int64_t c) -> std::optional<IndexRange> {
      std::optional<int64_t> a = CheckedMul(r.lo, c), b = CheckedMul(r.hi, c);
      if (!a || !b) return std::nullopt;
      return IndexRange{std::min(*a, *b), std::max(*a, *b)};
    };
    switch (e->op) {
      case ExprOp::kConst:
        return IndexRange{e->i, e->i};
      case ExprOp::kVar:
        if (e->index < 0 || static_cast<size_t>(e->index) >= vars_.size())
          return std::nullopt;
        return vars_[e->index];
      case ExprOp::kNeg: {
        std::optional<IndexRange> a = Range(e->args[0]);
        return a ? scaled(*a, -1) : std::nullopt;
      }
      case ExprOp::kAdd:
      case ExprOp::kSub: {
        std::optional<IndexRange> a = Range(e->args[0]);
        std::optional<IndexRange> b = Range(e->args[1]);
        if (!a || !b) return std::nullopt;
        if (e->op == ExprOp::kSub) {
          b = scaled(*b, -1);
          if (!b) return std::nullopt;
        }
        std::optional<int64_t> lo = CheckedAdd(a->lo, b->lo);
        std::optional<int64_t> hi = CheckedAdd(a->hi, b->hi);
        if (!lo || !hi) return std::nullopt;
        return IndexRange{*lo, *hi};
      }
      case ExprOp::kMul: {
        std::optional<IndexRange> a = Range(e->args[0]);
        std::optional<IndexRange> b = Range(e->args[1]);
        if (!a || !b) return std::nullopt;
        std::optional<IndexRange> lo = scaled(*a, b->lo);
        std::optional<IndexRange> hi = scaled(*a, b->hi);
        if (!lo || !hi) return std::nullopt;
        return IndexRange{std::min(lo->lo, hi->lo), std::max(lo->hi, hi->hi)};
      }
      case ExprOp::kFloorDiv:
      case ExprOp::kRemainder: {
        const Expr& d = e->args[1];
        if (d->op != ExprOp::kConst || d->i <= 0) return std::nullopt;
        std::optional<IndexRange> a = Range(e->args[0]);
        if (!a || a->lo < 0) return std::nullopt;
        if (e->op == ExprOp::kFloorDiv)
          return IndexRange{a->lo / d->i, a->hi / d->i};
        if (a->hi < d->i) return a;
        return IndexRange{0, d->i - 1};
      }
      default:
        return std::nullopt;
    }
  }

  // The range of constant + sum coeff * atom over `terms`.
  std::optional<IndexRange> RangeOf(
      int64_t constant, const std::vector<std::pair<int64_t, Expr>>& terms) {
    IndexRange sum{constant, constant};
    for (const auto& [c, atom] : terms) {
      std::optional<IndexRange> r = Range(atom);
      if (!r) return std::nullopt;
      std::optional<int64_t> a = CheckedMul(r->lo, c), b = CheckedMul(r->hi, c);
      if (!a || !b) return std::nullopt;
      std::optional<int64_t> lo = CheckedAdd(sum.lo, std::min(*a, *b));
      std::optional<int64_t> hi = CheckedAdd(sum.hi, std::max(*a, *b));
      if (!lo || !hi) return std::nullopt;
      sum = IndexRange{*lo, *hi};
    }
    return sum;
  }

  // floor(x / d) or x mod d for a constant d > 0 and x >= 0.
  std::optional<Expr> Divide(const Expr& x, const Expr& divisor,
                             bool remainder) {
    if (divisor->op != ExprOp::kConst || divisor->i <= 0) return std::nullopt;
    const int64_t d = divisor->i;
    std::optional<IndexRange> rx = Range(x);
    if (!rx || rx->lo < 0) return std::nullopt;
    if (rx->hi < d) return remainder ? x : IntConst(0);
    // x = y mod m with d | m: x mod d = y mod d and floor(x / d) =
    // floor(y / d) mod (m / d) (the heads of 64 within each of q, k and v
    // in a [tokens, 3 * 192] gradient: remainder(remainder(L, 192), 64)),
    // so the parts of y show (and the CPU's segments can split L).
    if (x->op == ExprOp::kRemainder && x->args[1]->op == ExprOp::kConst &&
        x->args[1]->i > 0 && x->args[1]->i % d == 0) {
      const Expr& y = x->args[0];
      if (std::optional<IndexRange> ry = Range(y); ry && ry->lo >= 0) {
        if (remainder)
          return Divide(y, divisor, true).value_or(Mod(y, divisor));
        Expr q = Divide(y, divisor, false).value_or(FloorDiv(y, divisor));
        Expr m = IntConst(x->args[1]->i / d);
        return Divide(q, m, true).value_or(Mod(q, m));
      }
    }
    Terms t;
    if (!Decompose(x, 1, t)) return std::nullopt;
    // Candidates for a: d, then the coefficients dividing d, largest first.
    std::vector<int64_t> candidates = {d};
    for (const auto& [c, atom] : t.terms) {
      if (c > 1 && c < d && d % c == 0) candidates.push_back(c);
    }
    std::sort(candidates.begin() + 1, candidates.end(), std::greater<>());
    for (int64_t a : candidates) {
      std::vector<std::pair<int64_t, Expr>> q, r;
      for (const auto& [c, atom] : t.terms) {
        if (c % a == 0) {
          q.push_back({c / a, atom});
        } else {
          r.push_back({c, atom});
        }
      }
      const int64_t q0 = FloorDivConst(t.constant, a);
      const int64_t r0 = t.constant - q0 * a;
      std::optional<IndexRange> rr = RangeOf(r0, r);
      if (!rr || rr->lo < 0) continue;
      if (rr->hi < a) {
        // x = a * Q + R with 0 <= R < a (so Q >= 0).
        Expr quotient = Build(q0, q);
        if (remainder) {
          Expr rest = Build(r0, r);
          if (a == d) return rest;
          Expr inner = Mod(quotient, IntConst(d / a));
          return Add(
              Mul(Divide(quotient, IntConst(d / a), true).value_or(inner),
                  IntConst(a)),
              rest);
        }
        if (a == d) return quotient;
        Expr inner = FloorDiv(quotient, IntConst(d / a));
        return Divide(quotient, IntConst(d / a), false).value_or(inner);
      }
      if (a == d && !q.empty()) {
        // Multiples of d leave the division: x = d * Q + R, R >= 0.
        Expr rest = Build(r0, r);
        if (remainder) {
          Expr inner = Mod(rest, divisor);
          return Divide(rest, divisor, true).value_or(inner);
        }
        Expr inner = FloorDiv(rest, divisor);
        return Add(Build(q0, q), Divide(rest, divisor, false).value_or(inner));
      }
    }
    return std::nullopt;
  }

  // A sum whose divisions and remainders of one value recombine (Affine's
  // FoldDivMods over expressions).
  std::optional<Expr> Recombine(const Expr& e) {
    Terms t;
    if (!Decompose(e, 1, t)) return std::nullopt;
    bool changed = false;
    for (bool again = true; again;) {
      again = false;
      for (size_t i = 0; i < t.terms.size() && !again; ++i) {
        std::optional<DivMod> a = AsDivMod(t.terms[i].second);
        if (!a || a->s == 0) continue;
        for (size_t j = 0; j < t.terms.size() && !again; ++j) {
          if (j == i) continue;
          std::optional<DivMod> b = AsDivMod(t.terms[j].second);
          std::optional<int64_t> ps = CheckedMul(a->p, a->s);
          std::optional<int64_t> cs = CheckedMul(t.terms[i].first, a->s);
          if (!b || !ps || !cs || b->p != *ps || t.terms[j].first != *cs ||
              !Equal(a->x, b->x)) {
            continue;
          }
          std::optional<int64_t> st =
              b->s == 0 ? std::optional<int64_t>(0) : CheckedMul(a->s, b->s);
          if (!st) continue;
          const int64_t coeff = t.terms[i].first;
          const DivMod merged{a->x, a->p, *st};
          t.terms.erase(t.terms.begin() + std::max(i, j));
          t.terms.erase(t.terms.begin() + std::min(i, j));
          if (merged.p == 1 && merged.s == 0) {
            if (!Decompose(merged.x, coeff, t)) return std::nullopt;
          } else if (!Decompose(FromDivMod(merged), coeff, t)) {
            return std::nullopt;
          }
          changed = again = true;
        }
      }
    }
    if (!changed) return std::nullopt;
    return Build(t.constant, t.terms);
  }

  const std::vector<std::optional<IndexRange>>& vars_;
  absl::flat_hash_map<const ExprNode*, std::optional<IndexRange>> ranges_;
  std::vector<Expr> keep_;  // keeps ranges_'s keys alive
  Rewriter rewriter_;
};

}  // namespace

Expr SimplifyIndex(const Expr& e,
                   const std::vector<std::optional<IndexRange>>& var_ranges) {
  if (!e) return e;
  IndexSimplifier s(var_ranges);
  return s.Run(e);
}

}  // namespace ir

bool EpilogueHasBias(GemmEpilogue e) {
  return e == GemmEpilogue::kBias || e == GemmEpilogue::kReluBias ||
         e == GemmEpilogue::kGeluTanhBias;
}

bool EpilogueWritesBias(GemmEpilogue e) {
  return e == GemmEpilogue::kBiasGradB || e == GemmEpilogue::kBiasGradA;
}

const char* EpilogueName(GemmEpilogue e) {
  switch (e) {
    case GemmEpilogue::kNone:
      return "none";
    case GemmEpilogue::kBias:
      return "bias";
    case GemmEpilogue::kRelu:
      return "relu";
    case GemmEpilogue::kReluBias:
      return "relu_bias";
    case GemmEpilogue::kGeluTanh:
      return "gelu_tanh";
    case GemmEpilogue::kGeluTanhBias:
      return "gelu_tanh_bias";
    case GemmEpilogue::kBiasGradB:
      return "bgrad_b";
    case GemmEpilogue::kBiasGradA:
      return "bgrad_a";
  }
  return "?";
}

bool IsBlasLayout(const MatrixLayout& layout) {
  return layout.row_stride == SymExpr(1) || layout.col_stride == SymExpr(1);
}

std::string MatrixLayout::ToString(
    const std::vector<std::string>& symbol_names) const {
  return absl::StrCat("@", offset.ToString(symbol_names), " strides (",
                      batch_stride.ToString(symbol_names), ", ",
                      row_stride.ToString(symbol_names), ", ",
                      col_stride.ToString(symbol_names), ")");
}

const char* ConvDirectionName(ConvDirection d) {
  switch (d) {
    case ConvDirection::kForward:
      return "forward";
    case ConvDirection::kBackwardData:
      return "backward_data";
    case ConvDirection::kBackwardFilter:
      return "backward_filter";
  }
  return "?";
}

namespace {

std::string SizesString(const std::vector<SymExpr>& s,
                        const std::vector<std::string>& names) {
  std::vector<std::string> parts;
  for (const SymExpr& e : s) parts.push_back(e.ToString(names));
  return absl::StrCat("[", absl::StrJoin(parts, ", "), "]");
}

// "conv <direction> x [..] w [..] y [..] stride (..) padding (..) dilation
// (..) groups G[ tf32][ deterministic]".
std::string ConvString(const ConvCall& c,
                       const std::vector<std::string>& names) {
  std::string out = absl::StrCat(
      "conv ", ConvDirectionName(c.direction), " x ",
      SizesString(c.x_sizes, names), " w ", SizesString(c.w_sizes, names),
      " y ", SizesString(c.y_sizes, names), " stride (",
      absl::StrJoin(c.stride, ","), ") padding (",
      absl::StrJoin(c.padding, ","), ") dilation (",
      absl::StrJoin(c.dilation, ","), ") groups ", c.groups);
  if (c.tf32) absl::StrAppend(&out, " tf32");
  if (c.deterministic) absl::StrAppend(&out, " deterministic");
  return out;
}
// "attention forward|backward [B, H, L, S] dims E, Ev[ causal] scale s[
// dropout p]".
std::string AttentionString(const AttentionCall& a,
                            const std::vector<std::string>& names) {
  return absl::StrCat(
      "attention ", a.backward ? "backward " : "forward ",
      SizesString({a.batch, a.heads, a.s_q, a.s_kv}, names), " dims ",
      a.d_qk.ToString(names), ", ", a.d_v.ToString(names),
      a.causal ? " causal" : "", " scale ", a.scale,
      a.dropout > 0 ? absl::StrCat(" dropout ", a.dropout) : "");
}

const char* ReduceName(ReduceKind k) {
  switch (k) {
    case ReduceKind::kSum:
      return "sum";
    case ReduceKind::kProd:
      return "prod";
    case ReduceKind::kMax:
      return "max";
    case ReduceKind::kMin:
      return "min";
    case ReduceKind::kArgMax:
      return "argmax";
    case ReduceKind::kArgMin:
      return "argmin";
    case ReduceKind::kAny:
      return "any";
    case ReduceKind::kAll:
      return "all";
  }
  return "?";
}
}  // namespace

std::string LoopGraph::ToString() const {
  std::string out;
  for (size_t n = 0; n < nodes.size(); ++n) {
    const LoopNode& node = nodes[n];
    absl::StrAppend(&out, "%", n, " ", node.name, ": ", DTypeName(node.dtype),
                    SizesString(node.sizes, symbol_names));
    switch (node.kind) {
      case LoopNode::Kind::kInput:
        absl::StrAppend(&out, " = input ", node.input_index, " strides ",
                        SizesString(node.strides, symbol_names));
        break;
      case LoopNode::Kind::kPointwise:
        absl::StrAppend(&out, " = ", ir::ToString(node.body, symbol_names));
        if (node.epilogue != GemmEpilogue::kNone)
          absl::StrAppend(&out, "  [epilogue ", EpilogueName(node.epilogue),
                          " of %", node.epilogue_source,
                          node.epilogue_bias >= 0
                              ? absl::StrCat(" bias %", node.epilogue_bias)
                              : "",
                          "]");
        break;
      case LoopNode::Kind::kReduction: {
        std::vector<std::string> dims;
        for (size_t d = 0; d < node.reduced.size(); ++d) {
          if (node.reduced[d]) dims.push_back(absl::StrCat("v", d));
        }
        absl::StrAppend(&out, " = ", ReduceName(node.reduce), " over ",
                        SizesString(node.reduce_sizes, symbol_names), " dims {",
                        absl::StrJoin(dims, ","), "} of ",
                        ir::ToString(node.body, symbol_names));
        if (node.finalize)
          absl::StrAppend(&out, " then ",
                          ir::ToString(node.finalize, symbol_names));
        break;
      }
      case LoopNode::Kind::kScatter: {
        std::vector<std::string> index, inner;
        for (const Expr& e : node.scatter_index)
          index.push_back(ir::ToString(e, symbol_names));
        for (size_t d = 0; d < node.scatter_inner.size(); ++d) {
          if (node.scatter_inner[d]) inner.push_back(absl::StrCat("v", d));
        }
        absl::StrAppend(
            &out, " = ", ir::ToString(node.body, symbol_names), " then over ",
            SizesString(node.scatter_sizes, symbol_names), " in order {",
            absl::StrJoin(inner, ","), "} ",
            node.scatter_replace ? "store [" : "add [",
            absl::StrJoin(index, ", "), node.scatter_replace ? "] = " : "] += ",
            ir::ToString(node.scatter_value, symbol_names));
        break;
      }
      case LoopNode::Kind::kExtern: {
        if (node.extern_owner >= 0) {
          absl::StrAppend(&out, " = written by %", node.extern_owner);
          break;
        }
        if (node.attention) {
          absl::StrAppend(
              &out, " = ", AttentionString(*node.attention, symbol_names),
              " of %", absl::StrJoin(node.extern_inputs, ", %"),
              " also writing %", absl::StrJoin(node.extern_outputs, ", %"));
          break;
        }
        if (node.conv) {
          absl::StrAppend(&out, " = ", ConvString(*node.conv, symbol_names),
                          " of %", node.extern_inputs[0], ", %",
                          node.extern_inputs[1]);
          break;
        }
        const GemmCall& g = *node.gemm;
        absl::StrAppend(
            &out, " = gemm batch ", g.batch.ToString(symbol_names), " m ",
            g.m.ToString(symbol_names), " n ", g.n.ToString(symbol_names),
            " k ", g.k.ToString(symbol_names), " alpha ", g.alpha, " of %",
            node.extern_inputs[0], g.a.ToString(symbol_names), ", %",
            node.extern_inputs[1], g.b.ToString(symbol_names));
        if (g.epilogue != GemmEpilogue::kNone)
          absl::StrAppend(&out, " epilogue ", EpilogueName(g.epilogue));
        if (EpilogueHasBias(g.epilogue))
          absl::StrAppend(&out, " bias %", node.extern_inputs[2], "@",
                          g.bias_offset.ToString(symbol_names));
        if (EpilogueWritesBias(g.epilogue))
          absl::StrAppend(&out, " also writing %", node.extern_outputs[0]);
        if (g.tf32) absl::StrAppend(&out, " tf32");
        if (g.strict_reduction) absl::StrAppend(&out, " strict_reduction");
        if (g.deterministic) absl::StrAppend(&out, " deterministic");
        break;
      }
    }
    if (node.realize) absl::StrAppend(&out, "  (realized)");
    if (node.output_index >= 0)
      absl::StrAppend(&out, "  -> output ", node.output_index);
    absl::StrAppend(&out, "\n");
  }
  return out;
}

SymExpr Kernel::OuterRange() const {
  SymExpr r(1);
  for (size_t d = 0; d < dims.size(); ++d) {
    if (!inner[d]) r = r * dims[d];
  }
  return r;
}

std::string Kernel::ToString(const std::vector<std::string>& names) const {
  std::string out = absl::StrCat("kernel ", name, " buffers [",
                                 absl::StrJoin(buffers, ", "), "]\n");
  if (conv) absl::StrAppend(&out, "  extern ", ConvString(*conv, names), "\n");
  if (attention) {
    absl::StrAppend(&out, "  extern ", AttentionString(*attention, names),
                    "\n");
  }
  if (gemm) {
    absl::StrAppend(&out, "  extern gemm batch ", gemm->batch.ToString(names),
                    " m ", gemm->m.ToString(names), " n ",
                    gemm->n.ToString(names), " k ", gemm->k.ToString(names),
                    " alpha ", gemm->alpha, "\n    a ", gemm->a.ToString(names),
                    "\n    b ", gemm->b.ToString(names), "\n    c ",
                    gemm->c.ToString(names), "\n");
    if (gemm->epilogue != GemmEpilogue::kNone)
      absl::StrAppend(
          &out, "    epilogue ", EpilogueName(gemm->epilogue),
          EpilogueHasBias(gemm->epilogue) || EpilogueWritesBias(gemm->epilogue)
              ? absl::StrCat(" bias @", gemm->bias_offset.ToString(names))
              : "",
          "\n");
    if (gemm->tf32 || gemm->strict_reduction || gemm->deterministic)
      absl::StrAppend(&out, "    ", gemm->tf32 ? "tf32 " : "",
                      gemm->strict_reduction ? "strict_reduction " : "",
                      gemm->deterministic ? "deterministic" : "", "\n");
  }
  for (size_t d = 0; d < dims.size(); ++d) {
    absl::StrAppend(&out, "  ", inner[d] ? "inner" : "outer", " v", d, " < ",
                    dims[d].ToString(names), "\n");
  }
  for (size_t s = 0; s < stages.size(); ++s) {
    const Stage& st = stages[s];
    switch (st.kind) {
      case Stage::Kind::kReduce:
        absl::StrAppend(&out, "  acc", s, " = ", ReduceName(st.reduce), "(",
                        ir::ToString(st.value, names), ")");
        if (st.finalize)
          absl::StrAppend(&out, " then ", ir::ToString(st.finalize, names));
        break;
      case Stage::Kind::kStoreInner:
      case Stage::Kind::kStoreOuter:
        absl::StrAppend(
            &out, "  ",
            st.kind == Stage::Kind::kStoreInner ? "for inner: " : "", "buf",
            st.buffer_slot, "[", ir::ToString(st.offset, names),
            "] = ", ir::ToString(st.value, names));
        break;
      case Stage::Kind::kScatterAdd:
      case Stage::Kind::kScatterStore:
        absl::StrAppend(
            &out, "  for all: buf", st.buffer_slot, "[",
            ir::ToString(st.offset, names),
            st.kind == Stage::Kind::kScatterAdd ? "] += " : "] = ",
            ir::ToString(st.value, names));
        break;
    }
    absl::StrAppend(&out, "\n");
  }
  return out;
}

std::string FusedProgram::ToString() const {
  std::string out;
  for (size_t b = 0; b < buffers.size(); ++b) {
    const ProgramBuffer& buf = buffers[b];
    const char* kind = buf.kind == ProgramBuffer::Kind::kInput    ? "input"
                       : buf.kind == ProgramBuffer::Kind::kOutput ? "output"
                       : buf.kind == ProgramBuffer::Kind::kError  ? "error"
                                                                  : "temp";
    absl::StrAppend(&out, "buffer ", b, ": ", kind, " ", buf.index, " ",
                    DTypeName(buf.dtype), " x ",
                    buf.elements.ToString(symbol_names), "\n");
  }
  for (const auto& [output, input] : input_writes) {
    absl::StrAppend(&out, "graph output ", output, " written into input ",
                    input, "\n");
  }
  for (const Kernel& k : kernels)
    absl::StrAppend(&out, k.ToString(symbol_names));
  return out;
}

}  // namespace kiln
