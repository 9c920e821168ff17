#include "graph/import.h"

#include <limits>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "graph/op_signature.h"

namespace kiln {
namespace {

// Largest size, stride or size-list entry accepted anywhere: far enough
// below 2^63 that products of two stay representable.
constexpr int64_t kMaxExtent = int64_t{1} << 40;
// Limits of a SizeExpr (graph.proto): they keep every product and the
// non-negativity test's expansion far from int64 overflow.
constexpr int kMaxExprTerms = 16;
constexpr int kMaxTermSymbols = 8;

absl::Status Invalid(absl::string_view where, absl::string_view what) {
  return absl::InvalidArgumentError(absl::StrCat(where, ": ", what));
}

const char* ArgKindName(ArgKind k) {
  switch (k) {
    case ArgKind::kTensor:
      return "Tensor";
    case ArgKind::kOptionalTensor:
      return "Tensor?";
    case ArgKind::kTensorOrScalar:
      return "Tensor or Scalar";
    case ArgKind::kScalar:
      return "Scalar";
    case ArgKind::kOptionalScalar:
      return "Scalar?";
    case ArgKind::kSymScalar:
      return "Scalar or SymInt";
    case ArgKind::kInt:
      return "int";
    case ArgKind::kOptionalInt:
      return "int?";
    case ArgKind::kOptionalSymInt:
      return "SymInt?";
    case ArgKind::kIntList:
      return "int[]";
    case ArgKind::kOptionalIntList:
      return "int[]?";
    case ArgKind::kBool:
      return "bool";
    case ArgKind::kFloat:
      return "float";
    case ArgKind::kOptionalFloat:
      return "float?";
    case ArgKind::kOptionalDType:
      return "ScalarType?";
    case ArgKind::kString:
      return "str";
    case ArgKind::kOptionalString:
      return "str?";
    case ArgKind::kTensorList:
      return "Tensor[]";
    case ArgKind::kIgnored:
      return "an ignored option";
  }
  return "?";
}

const char* ArgumentKindName(const v1::Argument& a) {
  switch (a.kind_case()) {
    case v1::Argument::kRef:
      return "a tensor reference";
    case v1::Argument::kI:
      return "an int";
    case v1::Argument::kF:
      return "a float";
    case v1::Argument::kB:
      return "a bool";
    case v1::Argument::kInts:
      return "an int list";
    case v1::Argument::kDims:
      return "a size list";
    case v1::Argument::kRefs:
      return "a tensor list";
    case v1::Argument::kDtype:
      return "a dtype";
    case v1::Argument::kStr:
      return "a string";
    case v1::Argument::kNone:
      return "None";
    case v1::Argument::KIND_NOT_SET:
      return "nothing (no value set)";
  }
  return "?";
}

class Importer {
 public:
  Importer(const v1::Graph& proto, const ImportLimits& limits)
      : proto_(proto), limits_(limits) {}

  absl::StatusOr<Graph> Run() {
    if (proto_.nodes_size() > limits_.max_nodes) {
      return absl::InvalidArgumentError(
          absl::StrCat("graph has ", proto_.nodes_size(),
                       " nodes, more than the limit of ", limits_.max_nodes));
    }
    if (proto_.inputs_size() > limits_.max_inputs) {
      return absl::InvalidArgumentError(
          absl::StrCat("graph has ", proto_.inputs_size(),
                       " inputs, more than the limit of ", limits_.max_inputs));
    }
    if (absl::Status s = ImportSymbols(); !s.ok()) return s;
    CollectBoundSymbols();
    // Where each name is defined, to tell "undefined" from "defined later".
    for (int n = 0; n < proto_.nodes_size(); ++n) {
      for (const std::string& out : proto_.nodes(n).outputs())
        defined_by_node_.emplace(out, n);
    }
    for (int i = 0; i < proto_.inputs_size(); ++i) {
      if (absl::Status s = ImportInput(i); !s.ok()) return s;
    }
    for (int n = 0; n < proto_.nodes_size(); ++n) {
      if (absl::Status s = ImportNode(n); !s.ok()) return s;
    }
    if (proto_.outputs_size() == 0) {
      return absl::InvalidArgumentError("graph has no outputs");
    }
    for (int o = 0; o < proto_.outputs_size(); ++o) {
      auto v = Resolve(proto_.outputs(o), absl::StrCat("output ", o),
                       proto_.nodes_size());
      if (!v.ok()) return v.status();
      graph_.outputs.push_back(*v);
    }
    if (absl::Status s = ImportInputWrites(); !s.ok()) return s;
    return std::move(graph_);
  }

 private:
  // Graph.input_writes: each pairs an output with an input of its dtype and
  // sizes that is contiguous; at most one per output and one per input.
  absl::Status ImportInputWrites() {
    absl::flat_hash_set<int> outputs, inputs;
    for (int w = 0; w < proto_.input_writes_size(); ++w) {
      const v1::InputWrite& iw = proto_.input_writes(w);
      const std::string where = absl::StrCat("input write ", w);
      if (iw.output() < 0 || iw.output() >= proto_.outputs_size())
        return Invalid(where, absl::StrCat("output ", iw.output(),
                                           " is not an output of the graph"));
      if (iw.input() < 0 || iw.input() >= proto_.inputs_size())
        return Invalid(where, absl::StrCat("input ", iw.input(),
                                           " is not an input of the graph"));
      if (!outputs.insert(iw.output()).second)
        return Invalid(where, absl::StrCat("output ", iw.output(),
                                           " is written into two inputs"));
      if (!inputs.insert(iw.input()).second)
        return Invalid(where,
                       absl::StrCat("input ", iw.input(), " is written twice"));
      const GraphInput& in = graph_.inputs[iw.input()];
      const TensorType& it = graph_.type(in.value);
      const TensorType& ot = graph_.type(graph_.outputs[iw.output()]);
      if (it.dtype != ot.dtype)
        return Invalid(
            where,
            absl::StrCat("output ", iw.output(), " is ", DTypeName(ot.dtype),
                         ", input ", iw.input(), " ", DTypeName(it.dtype)));
      if (it.sizes != ot.sizes)
        return Invalid(where,
                       absl::StrCat("output ", iw.output(), " and input ",
                                    iw.input(), " differ in sizes"));
      // Contiguous: a dim of size 1 may have any stride (it is never
      // stepped over).
      const std::vector<SymExpr> contiguous = ContiguousStrides(it.sizes);
      bool dense =
          in.storage_offset == 0 && in.strides.size() == it.sizes.size();
      for (size_t d = 0; dense && d < it.sizes.size(); ++d)
        dense = it.sizes[d] == SymExpr(1) || in.strides[d] == contiguous[d];
      if (!dense)
        return Invalid(
            where, absl::StrCat("input ", iw.input(), " is not contiguous"));
      graph_.input_writes.push_back({iw.output(), iw.input()});
    }
    return absl::OkStatus();
  }

  absl::Status ImportSymbols() {
    for (int i = 0; i < proto_.symbols_size(); ++i) {
      const v1::Symbol& s = proto_.symbols(i);
      const std::string where = absl::StrCat("symbol ", i, " '", s.name(), "'");
      if (s.name().empty()) return Invalid(where, "symbol name is empty");
      if (!symbol_ids_.emplace(s.name(), i).second)
        return Invalid(where, "symbol is declared twice");
      if (s.max_value() != 0 && s.max_value() < kMinSymbolValue) {
        return Invalid(
            where,
            absl::StrCat("max_value ", s.max_value(), " is below the minimum ",
                         kMinSymbolValue, " of a symbolic size"));
      }
      if (s.max_value() > kMaxExtent)
        return Invalid(where, "max_value exceeds 2^40");
      if (s.multiple_of() < 0 || s.multiple_of() > kMaxExtent) {
        return Invalid(where, absl::StrCat("multiple_of ", s.multiple_of(),
                                           " is out of range"));
      }
      graph_.symbols.push_back(SymbolInfo{
          s.name(), s.max_value(), std::max<int64_t>(s.multiple_of(), 1)});
    }
    max_values_ = graph_.SymbolMaxValues();
    return absl::OkStatus();
  }

  absl::StatusOr<SymExpr> SymbolRef(const std::string& name,
                                    absl::string_view where) {
    auto it = symbol_ids_.find(name);
    if (it == symbol_ids_.end()) {
      return Invalid(where, absl::StrCat("symbol '", name,
                                         "' is not declared in graph.symbols"));
    }
    return SymExpr::Symbol(it->second);
  }

  // A wire polynomial as a SymExpr: every symbol declared, within the
  // limits of SizeExpr (graph.proto). `what` names it in messages.
  absl::StatusOr<SymExpr> ImportSizeExpr(const v1::SizeExpr& e,
                                         absl::string_view where,
                                         absl::string_view what) {
    if (e.terms_size() > kMaxExprTerms) {
      return Invalid(where, absl::StrCat(what, " has ", e.terms_size(),
                                         " terms, more than ", kMaxExprTerms));
    }
    SymExpr result;
    for (const v1::SizeExpr::Term& t : e.terms()) {
      if (t.coeff() > kMaxExtent || t.coeff() < -kMaxExtent) {
        return Invalid(where, absl::StrCat(what, ": coefficient ", t.coeff(),
                                           " is out of range (|c| <= 2^40)"));
      }
      if (t.symbols_size() > kMaxTermSymbols) {
        return Invalid(where,
                       absl::StrCat(what, ": a term has ", t.symbols_size(),
                                    " symbols, more than ", kMaxTermSymbols));
      }
      SymExpr term(t.coeff());
      for (const std::string& name : t.symbols()) {
        auto sym = SymbolRef(name, absl::StrCat(where, ": ", what));
        if (!sym.ok()) return sym.status();
        term = term * *sym;
      }
      result = result + term;
    }
    // Terms given twice may have merged into one past the limits.
    for (const SymExpr::Term& t : result.terms()) {
      if (t.coeff > kMaxExtent || t.coeff < -kMaxExtent) {
        return Invalid(where, absl::StrCat(what, " = ", Text(result),
                                           ": a coefficient is out of range "
                                           "(|c| <= 2^40)"));
      }
    }
    return result;
  }

  // An input's size or stride given as a polynomial: imported, >= 0 for
  // every value of its symbols, over symbols the inputs bind, and a
  // constant one at most 2^40.
  absl::StatusOr<SymExpr> ImportExtent(const v1::SizeExpr& expr,
                                       absl::string_view where,
                                       absl::string_view what) {
    auto e = ImportSizeExpr(expr, where, what);
    if (!e.ok()) return e.status();
    if (absl::Status s = CheckNonNegative(*e, where, what); !s.ok()) return s;
    if (absl::Status s = CheckBound(*e, where, what); !s.ok()) return s;
    if (auto c = e->AsConstant(); c && *c > kMaxExtent)
      return Invalid(where, absl::StrCat(what, " exceeds 2^40"));
    return e;
  }

  // A size that must be >= 0 for every value of its symbols: >= 2 and at
  // most their max_value, which the runtime's guards check (a dim of
  // 384 - s0 where Dynamo bounds s0 by 382).
  absl::Status CheckNonNegative(const SymExpr& e, absl::string_view where,
                                absl::string_view what) {
    if (e.NonNegativeWithin(kMinSymbolValue, max_values_)) {
      return absl::OkStatus();
    }
    return Invalid(
        where, absl::StrCat(what, " = ", Text(e),
                            " can be negative for symbol values >= ",
                            kMinSymbolValue, " (and within their max_value)"));
  }

  // Every symbol of `e` is bound from an input's plain dim (the runtime
  // reads symbols only there; compiler/build_artifact.cc).
  absl::Status CheckBound(const SymExpr& e, absl::string_view where,
                          absl::string_view what) {
    for (const SymExpr::Term& t : e.terms()) {
      for (int s : t.symbols) {
        if (!bound_symbols_.contains(s)) {
          return Invalid(
              where, absl::StrCat(what, " = ", Text(e), " uses symbol '",
                                  graph_.symbols[s].name,
                                  "', which no input has as a dim's size (Kiln "
                                  "binds each symbol from an input dim that is "
                                  "exactly that symbol)"));
        }
      }
    }
    return absl::OkStatus();
  }

  std::string Text(const SymExpr& e) const {
    return e.ToString(graph_.SymbolNames());
  }

  // The symbols that are some input dim's whole size.
  void CollectBoundSymbols() {
    for (const v1::Input& in : proto_.inputs()) {
      for (const v1::Dim& d : in.meta().sizes()) {
        if (d.kind_case() != v1::Dim::kSymbol) continue;
        auto it = symbol_ids_.find(d.symbol());
        if (it != symbol_ids_.end()) bound_symbols_.insert(it->second);
      }
    }
  }

  absl::Status ImportInput(int i) {
    const v1::Input& in = proto_.inputs(i);
    const v1::TensorMeta& meta = in.meta();
    const std::string where = absl::StrCat("input ", i, " '", in.name(), "'");
    if (in.name().empty()) return Invalid(where, "input name is empty");
    if (defined_by_node_.contains(in.name()) ||
        value_ids_.contains(in.name())) {
      return Invalid(where, "name is defined more than once");
    }
    std::optional<DType> dtype = DTypeFromWire(meta.dtype());
    if (!dtype)
      return Invalid(
          where, absl::StrCat("dtype ", meta.dtype(), " is not a Kiln dtype"));
    if (meta.sizes_size() > limits_.max_rank) {
      return Invalid(where,
                     absl::StrCat("rank ", meta.sizes_size(),
                                  " is above the limit of ", limits_.max_rank));
    }
    TensorType type{*dtype, {}};
    for (int d = 0; d < meta.sizes_size(); ++d) {
      const v1::Dim& dim = meta.sizes(d);
      if (dim.kind_case() == v1::Dim::kSymbol) {
        auto e = SymbolRef(dim.symbol(), where);
        if (!e.ok()) return e.status();
        type.sizes.push_back(*e);
      } else if (dim.kind_case() == v1::Dim::kExpr) {
        auto e =
            ImportExtent(dim.expr(), where, absl::StrCat("size of dim ", d));
        if (!e.ok()) return e.status();
        type.sizes.push_back(*std::move(e));
      } else {
        if (dim.value() < 0)
          return Invalid(where, absl::StrCat("size ", dim.value(), " of dim ",
                                             d, " is negative"));
        if (dim.value() > kMaxExtent)
          return Invalid(where,
                         absl::StrCat("size of dim ", d, " exceeds 2^40"));
        type.sizes.push_back(SymExpr(dim.value()));
      }
    }
    if (absl::Status s = CheckElementCount(type.sizes, where); !s.ok())
      return s;
    GraphInput gi;
    if (meta.strides_size() == 0) {
      gi.strides = ContiguousStrides(type.sizes);
    } else if (meta.strides_size() != meta.sizes_size()) {
      return Invalid(where,
                     absl::StrCat("has ", meta.strides_size(), " strides for ",
                                  meta.sizes_size(), " sizes"));
    } else {
      for (int d = 0; d < meta.strides_size(); ++d) {
        const v1::Stride& st = meta.strides(d);
        if (st.has_expr()) {
          const std::string what = absl::StrCat("stride of dim ", d);
          if (st.value() != 0 || st.symbols_size() != 0) {
            return Invalid(where, absl::StrCat(what,
                                               " sets both expr and "
                                               "value/symbols"));
          }
          auto e = ImportExtent(st.expr(), where, what);
          if (!e.ok()) return e.status();
          gi.strides.push_back(*std::move(e));
          continue;
        }
        if (st.value() < 0) {
          return Invalid(
              where, absl::StrCat(
                         "stride ", st.value(), " of dim ", d,
                         " is negative (negative strides are not supported)"));
        }
        if (st.value() > kMaxExtent)
          return Invalid(where,
                         absl::StrCat("stride of dim ", d, " exceeds 2^40"));
        SymExpr e(st.value());
        for (const std::string& sym : st.symbols()) {
          auto s = SymbolRef(sym, where);
          if (!s.ok()) return s.status();
          e = e * *s;
        }
        if (st.symbols_size() > limits_.max_rank) {
          return Invalid(where, absl::StrCat("stride of dim ", d,
                                             " has too many symbols"));
        }
        gi.strides.push_back(e);
      }
    }
    if (meta.storage_offset() < 0 || meta.storage_offset() > kMaxExtent) {
      return Invalid(where,
                     absl::StrCat("storage_offset ", meta.storage_offset(),
                                  " is out of range"));
    }
    const int64_t align = meta.alignment();
    if (align < 0 || (align & (align - 1)) != 0 || align > 4096) {
      return Invalid(where,
                     absl::StrCat("alignment ", align,
                                  " is not 0 or a power of two up to 4096"));
    }
    if (meta.device() < 0 || meta.device() > 2) {
      return Invalid(
          where, absl::StrCat("device type ", meta.device(), " is unknown"));
    }
    gi.storage_offset = meta.storage_offset();
    gi.alignment = align;
    gi.device = static_cast<DeviceKind>(meta.device());
    gi.value = AddValue(in.name(), std::move(type), -1, 0);
    graph_.inputs.push_back(std::move(gi));
    return absl::OkStatus();
  }

  // Element count, ignoring dims of size 0 so that strides stay bounded
  // too; symbols count at their minimum (runtime guards check the rest).
  absl::Status CheckElementCount(const std::vector<SymExpr>& sizes,
                                 absl::string_view where) {
    int64_t count = 1;
    for (const SymExpr& s : sizes) {
      int64_t v = s.AsConstant().value_or(kMinSymbolValue);
      if (auto c = s.AsConstant(); !c) {
        // A non-constant size expression: bound it by its constant-free
        // evaluation at the minimum symbol value.
        std::vector<int64_t> mins(graph_.symbols.size(), kMinSymbolValue);
        v = s.Evaluate(mins);
      }
      if (v < 0)
        return Invalid(where, absl::StrCat("a size is negative (", v, ")"));
      if (v == 0) continue;
      if (v > limits_.max_elements || count > limits_.max_elements / v) {
        return Invalid(where,
                       absl::StrCat("element count exceeds the limit of ",
                                    limits_.max_elements));
      }
      count *= v;
    }
    return absl::OkStatus();
  }

  ValueId AddValue(std::string name, TensorType type, int producer,
                   int output_index) {
    const ValueId id = static_cast<ValueId>(graph_.values.size());
    value_ids_[name] = id;
    graph_.values.push_back(
        Value{std::move(type), std::move(name), producer, output_index});
    return id;
  }

  // Resolves a reference made by node `user` (or by the outputs, user =
  // number of nodes).
  absl::StatusOr<ValueId> Resolve(const std::string& name,
                                  absl::string_view where, int user) {
    auto it = value_ids_.find(name);
    if (it != value_ids_.end()) return it->second;
    auto later = defined_by_node_.find(name);
    if (later != defined_by_node_.end() && later->second >= user) {
      return Invalid(
          where, absl::StrCat(
                     "refers to '", name, "', which is defined later, by node ",
                     later->second, " (nodes must be in topological order)"));
    }
    return Invalid(where,
                   absl::StrCat("refers to undefined value '", name, "'"));
  }

  // `name`: the schema argument's, for messages.
  absl::StatusOr<std::vector<SymExpr>> ImportIntList(const v1::Argument& a,
                                                     absl::string_view where,
                                                     absl::string_view name) {
    std::vector<SymExpr> out;
    if (a.kind_case() == v1::Argument::kI) {
      out.push_back(SymExpr(a.i()));
    } else if (a.kind_case() == v1::Argument::kInts) {
      for (int64_t v : a.ints().values()) out.push_back(SymExpr(v));
    } else {
      for (int i = 0; i < a.dims().values_size(); ++i) {
        const v1::Dim& d = a.dims().values(i);
        const std::string what =
            absl::StrCat("argument '", name, "' entry ", i);
        if (d.kind_case() == v1::Dim::kSymbol) {
          auto e = SymbolRef(d.symbol(), where);
          if (!e.ok()) return e.status();
          if (absl::Status s = CheckBound(*e, where, what); !s.ok()) return s;
          out.push_back(*e);
        } else if (d.kind_case() == v1::Dim::kExpr) {
          auto e = ImportSizeExpr(d.expr(), where, what);
          if (!e.ok()) return e.status();
          // A constant keeps the meaning of a static entry (-1: inferred).
          if (!e->IsConstant()) {
            if (absl::Status s = CheckNonNegative(*e, where, what); !s.ok())
              return s;
            if (absl::Status s = CheckBound(*e, where, what); !s.ok()) return s;
          }
          out.push_back(*std::move(e));
        } else {
          out.push_back(SymExpr(d.value()));
        }
      }
    }
    if (static_cast<int>(out.size()) > 64)
      return Invalid(where, "int list has more than 64 entries");
    for (const SymExpr& e : out) {
      if (auto c = e.AsConstant(); c && (*c > kMaxExtent || *c < -kMaxExtent)) {
        return Invalid(where, absl::StrCat("list entry ", *c,
                                           " is out of range (|v| <= 2^40)"));
      }
    }
    return out;
  }

  // Converts one proto argument to the Attr its schema slot wants.
  absl::StatusOr<Attr> Bind(const v1::Argument& a, const ArgSpec& spec,
                            const std::string& where, int node_index) {
    using K = v1::Argument::KindCase;
    const K k = a.kind_case();
    auto mismatch = [&]() {
      return Invalid(where, absl::StrCat("argument '", spec.name, "' expects ",
                                         ArgKindName(spec.kind), ", got ",
                                         ArgumentKindName(a)));
    };
    const bool optional = spec.kind == ArgKind::kOptionalTensor ||
                          spec.kind == ArgKind::kOptionalScalar ||
                          spec.kind == ArgKind::kOptionalInt ||
                          spec.kind == ArgKind::kOptionalSymInt ||
                          spec.kind == ArgKind::kOptionalIntList ||
                          spec.kind == ArgKind::kOptionalFloat ||
                          spec.kind == ArgKind::kOptionalDType ||
                          spec.kind == ArgKind::kOptionalString ||
                          spec.kind == ArgKind::kIgnored;
    if (k == K::kNone) {
      if (optional) return Attr::None();
      return mismatch();
    }
    auto scalar = [&]() -> absl::StatusOr<Attr> {
      if (k == K::kI) return Attr::Int(a.i());
      if (k == K::kF) return Attr::Float(a.f());
      if (k == K::kB) return Attr::Bool(a.b());
      return mismatch();
    };
    switch (spec.kind) {
      case ArgKind::kTensor:
      case ArgKind::kOptionalTensor:
      case ArgKind::kTensorOrScalar: {
        if (k == K::kRef) {
          auto v = Resolve(a.ref(), where, node_index);
          if (!v.ok()) return v.status();
          return Attr::Tensor(*v);
        }
        if (spec.kind == ArgKind::kTensorOrScalar) return scalar();
        return mismatch();
      }
      case ArgKind::kScalar:
      case ArgKind::kOptionalScalar:
        return scalar();
      case ArgKind::kSymScalar:
      case ArgKind::kOptionalSymInt: {
        if (k != K::kDims) {
          if (spec.kind == ArgKind::kSymScalar) return scalar();
          if (k != K::kI) return mismatch();
          return Attr::Int(a.i());
        }
        auto list = ImportIntList(a, where, spec.name);
        if (!list.ok()) return list.status();
        if (list->size() != 1) {
          return Invalid(where, absl::StrCat("argument '", spec.name,
                                             "': a SymInt is a size list of "
                                             "one entry, got ",
                                             list->size()));
        }
        if (auto c = (*list)[0].AsConstant()) return Attr::Int(*c);
        return Attr::Ints(*std::move(list));
      }
      case ArgKind::kInt:
      case ArgKind::kOptionalInt:
        if (k != K::kI) return mismatch();
        return Attr::Int(a.i());
      case ArgKind::kIntList:
      case ArgKind::kOptionalIntList: {
        if (k != K::kI && k != K::kInts && k != K::kDims) return mismatch();
        auto list = ImportIntList(a, where, spec.name);
        if (!list.ok()) return list.status();
        return Attr::Ints(*std::move(list));
      }
      case ArgKind::kBool:
        if (k != K::kB) return mismatch();
        return Attr::Bool(a.b());
      case ArgKind::kFloat:
      case ArgKind::kOptionalFloat:
        if (k == K::kF) return Attr::Float(a.f());
        if (k == K::kI) return Attr::Float(static_cast<double>(a.i()));
        return mismatch();
      case ArgKind::kOptionalDType: {
        if (k != K::kDtype) return mismatch();
        std::optional<DType> d = DTypeFromWire(a.dtype());
        if (!d)
          return Invalid(where,
                         absl::StrCat("argument '", spec.name, "': dtype ",
                                      a.dtype(), " is not a Kiln dtype"));
        return Attr::DTypeAttr(*d);
      }
      case ArgKind::kString:
      case ArgKind::kOptionalString:
        if (k != K::kStr) return mismatch();
        if (a.str().size() > 64)
          return Invalid(
              where, absl::StrCat("argument '", spec.name, "' is too long"));
        return Attr::String(a.str());
      case ArgKind::kTensorList: {
        if (k != K::kRefs) return mismatch();
        Attr list;
        list.kind = Attr::Kind::kTensors;
        for (const std::string& r : a.refs().values()) {
          auto v = Resolve(r, where, node_index);
          if (!v.ok()) return v.status();
          list.tensors.push_back(*v);
        }
        return list;
      }
      case ArgKind::kIgnored:
        if (k == K::kRef || k == K::kRefs) return mismatch();
        return Attr::None();
    }
    return mismatch();
  }

  absl::Status ImportNode(int n) {
    const v1::Node& pn = proto_.nodes(n);
    const std::string where = absl::StrCat("node ", n, " (", pn.op(), ")");
    const OpSignature* op = OpSignatures::Get().Find(pn.op());
    if (op == nullptr) {
      return absl::UnimplementedError(
          absl::StrCat("node ", n, ": op '", pn.op(),
                       "' is not supported by Kiln (run it eagerly and "
                       "partition the graph around it)"));
    }
    // Bind positional arguments, then keyword arguments by name.
    const int num_params = static_cast<int>(op->schema.size());
    int num_positional_params = 0;
    while (num_positional_params < num_params &&
           !op->schema[num_positional_params].kwarg_only) {
      ++num_positional_params;
    }
    std::vector<std::optional<Attr>> bound(num_params);
    int positional = 0;
    bool seen_keyword = false;
    for (const v1::Argument& a : pn.args()) {
      int slot = -1;
      if (a.name().empty()) {
        if (seen_keyword)
          return Invalid(where,
                         "positional argument follows a keyword argument");
        if (positional >= num_positional_params) {
          return Invalid(
              where, absl::StrCat("takes at most ", num_positional_params,
                                  " positional arguments but ", positional + 1,
                                  " or more were given"));
        }
        slot = positional++;
      } else {
        seen_keyword = true;
        for (int s = 0; s < num_params; ++s) {
          if (op->schema[s].name == a.name()) slot = s;
        }
        if (slot < 0)
          return Invalid(
              where, absl::StrCat("has no argument named '", a.name(), "'"));
        if (bound[slot])
          return Invalid(where,
                         absl::StrCat("got multiple values for argument '",
                                      a.name(), "'"));
      }
      auto attr = Bind(a, op->schema[slot], where, n);
      if (!attr.ok()) return attr.status();
      bound[slot] = *std::move(attr);
    }
    Node node;
    node.op = op;
    for (int s = 0; s < num_params; ++s) {
      if (bound[s]) {
        node.args.push_back(*std::move(bound[s]));
      } else if (op->schema[s].default_value) {
        node.args.push_back(*op->schema[s].default_value);
      } else {
        return Invalid(where, absl::StrCat("missing required argument '",
                                           op->schema[s].name, "'"));
      }
    }
    if (op->num_outputs != kVariableOutputs &&
        pn.outputs_size() != op->num_outputs) {
      return Invalid(where,
                     absl::StrCat("defines ", pn.outputs_size(),
                                  " outputs, the op has ", op->num_outputs));
    }
    for (const std::string& out : pn.outputs()) {
      if (out.empty()) return Invalid(where, "an output name is empty");
      if (value_ids_.contains(out) || defined_by_node_.find(out)->second != n ||
          std::count(pn.outputs().begin(), pn.outputs().end(), out) > 1) {
        return Invalid(
            where, absl::StrCat("value '", out, "' is defined more than once"));
      }
    }
    // Infer the outputs' types.
    const int node_index = static_cast<int>(graph_.nodes.size());
    OpContext ctx(graph_, node, node_index);
    auto shapes = op->shape(ctx);
    if (!shapes.ok()) return shapes.status();
    auto dtypes = op->dtype(ctx);
    if (!dtypes.ok()) return dtypes.status();
    const int num_outputs = op->num_outputs == kVariableOutputs
                                ? static_cast<int>(shapes->size())
                                : op->num_outputs;
    if (pn.outputs_size() != num_outputs) {
      return Invalid(where, absl::StrCat("defines ", pn.outputs_size(),
                                         " outputs, the op has ", num_outputs));
    }
    if (static_cast<int>(shapes->size()) != num_outputs ||
        static_cast<int>(dtypes->size()) != num_outputs) {
      return absl::InternalError(absl::StrCat(
          where, ": shape/dtype rule returned the wrong number of outputs"));
    }
    for (int o = 0; o < num_outputs; ++o) {
      std::vector<SymExpr>& sizes = (*shapes)[o];
      if (static_cast<int>(sizes.size()) > limits_.max_rank) {
        return Invalid(
            where, absl::StrCat("result rank ", sizes.size(),
                                " is above the limit of ", limits_.max_rank));
      }
      if (absl::Status s = CheckElementCount(sizes, where); !s.ok()) return s;
      node.outputs.push_back(
          AddValue(pn.outputs(o), TensorType{(*dtypes)[o], std::move(sizes)},
                   node_index, o));
    }
    graph_.nodes.push_back(std::move(node));
    return absl::OkStatus();
  }

  const v1::Graph& proto_;
  const ImportLimits& limits_;
  Graph graph_;
  absl::flat_hash_map<std::string, int> symbol_ids_;
  absl::flat_hash_set<int> bound_symbols_;  // see CollectBoundSymbols
  std::vector<int64_t> max_values_;         // graph_.SymbolMaxValues()
  absl::flat_hash_map<std::string, ValueId> value_ids_;
  absl::flat_hash_map<std::string, int> defined_by_node_;  // first definition
};

}  // namespace

absl::StatusOr<Graph> ImportGraph(const v1::Graph& proto,
                                  const ImportLimits& limits) {
  return Importer(proto, limits).Run();
}

absl::Status ValidateTarget(const v1::Target& target) {
  switch (target.kind_case()) {
    case v1::Target::kCpu:
      if (target.cpu().triple().empty()) {
        return absl::InvalidArgumentError(
            "target: a CPU target needs an LLVM triple");
      }
      return absl::OkStatus();
    case v1::Target::kCuda: {
      const std::string& arch = target.cuda().arch();
      int sm = 0;
      if (!absl::StartsWith(arch, "sm_") ||
          !absl::SimpleAtoi(arch.substr(3), &sm) || sm < 50 || sm > 200) {
        return absl::InvalidArgumentError(
            absl::StrCat("target: CUDA arch '", arch,
                         "' is not of the form sm_XX (sm_50 .. sm_200)"));
      }
      return absl::OkStatus();
    }
    case v1::Target::KIND_NOT_SET:
      return absl::InvalidArgumentError(
          "target: neither a CPU nor a CUDA target is set");
  }
  return absl::InvalidArgumentError("target: unknown kind");
}

}  // namespace kiln
