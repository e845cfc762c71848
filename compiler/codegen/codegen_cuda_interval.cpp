#include "compiler/codegen/codegen_cuda_interval.h"

#include <fmt/format.h>

#include <cmath>
#include <stdexcept>
#include <unordered_map>

#include "compiler/ir/ir_mutator.h"
#include "compiler/ir/ir_printer.h"

namespace flexjit {

using namespace ir;

bool mask_is_interval_classifiable(const SpecIR& ir) {
  if (!ir.mask_mod) return false;
  bool loads = false;
  for_each_node(ir.mask_mod, [&](const Expr& e) { loads |= e.kind() == NodeKind::Load; });
  return !loads;
}

bool mask_is_data_dependent(const SpecIR& ir) { return ir.mask_mod && !mask_is_interval_classifiable(ir); }

namespace {

std::string point(const Expr& e) {
  switch (e.kind()) {
    case NodeKind::IntImm: return fmt::format("fji::pt((long long){}ll)", e.as<IntImm>()->value == INT64_MIN ? INT64_MIN + 1 : e.as<IntImm>()->value);
    case NodeKind::FloatImm: {
      float v = e.as<FloatImm>()->value;
      if (std::isnan(v)) return "fji::pt(__int_as_float(0x7fffffff))";
      if (std::isinf(v)) return v > 0 ? "fji::pt(__int_as_float(0x7f800000))" : "fji::pt(__int_as_float(0xff800000))";
      return fmt::format("fji::pt({}f)", float_literal(v));
    }
    case NodeKind::BoolImm: return e.as<BoolImm>()->value ? "fji::pt(true)" : "fji::pt(false)";
    case NodeKind::Symbol: return fmt::format("fji::pt((long long)p.sym_{})", e.as<Symbol>()->name);
    case NodeKind::Param: {
      const Param* p = e.as<Param>();
      if (e.type() == Type::Float) return fmt::format("fji::pt(p.param_{})", p->name);
      if (e.type() == Type::Bool) return fmt::format("fji::pt(p.param_{} != 0)", p->name);
      return fmt::format("fji::pt((long long)p.param_{})", p->name);
    }
    default: return "";
  }
}

const char* var_interval(VarId v) {
  switch (v) {
    case VarId::B: return "b";
    case VarId::H: return "h";
    case VarId::KvHead: return "hkv";
    case VarId::Q: return "q";
    case VarId::KV: return "kv";
    default: throw std::logic_error("flexjit internal error: interval classifier over a non-index variable");
  }
}

}  // namespace

std::string generate_cuda_interval_classifier(const SpecIR& ir, const std::string& variant_name, const std::string& name) {
  if (!mask_is_interval_classifiable(ir)) throw std::logic_error("flexjit internal error: interval classifier for a mask with loads");
  std::unordered_map<const Node*, std::string> names;
  std::string body;
  int counter = 0;
  for_each_node(ir.mask_mod, [&](const Expr& e) {
    std::string text;
    if (const Var* v = e.as<Var>()) {
      names[e.get()] = var_interval(v->var);
      return;
    }
    text = point(e);
    if (text.empty()) {
      std::vector<std::string> k;
      for (const Expr& c : children(e)) k.push_back(names.at(c.get()));
      switch (e.kind()) {
        case NodeKind::Unary: {
          static const std::unordered_map<int, const char*> fn = {
              {int(UnaryOp::Neg), "neg"}, {int(UnaryOp::Not), "not_"}, {int(UnaryOp::BitNot), "bitnot_"}, {int(UnaryOp::Abs), "abs_"},
              {int(UnaryOp::Sign), "sign"}, {int(UnaryOp::Floor), "floor_"}, {int(UnaryOp::Ceil), "ceil_"}, {int(UnaryOp::Round), "round_"},
              {int(UnaryOp::Exp), "exp_"}, {int(UnaryOp::Exp2), "exp2_"}, {int(UnaryOp::Log), "log_"}, {int(UnaryOp::Log2), "log2_"},
              {int(UnaryOp::Log1p), "log1p_"}, {int(UnaryOp::Sqrt), "sqrt_"}, {int(UnaryOp::Rsqrt), "rsqrt_"}, {int(UnaryOp::Tanh), "tanh_"},
              {int(UnaryOp::Sigmoid), "sigmoid_"}, {int(UnaryOp::Sin), "sin_"}, {int(UnaryOp::Cos), "cos_"}};
          text = fmt::format("fji::{}({})", fn.at(int(e.as<Unary>()->op)), k[0]);
          break;
        }
        case NodeKind::Binary: {
          static const std::unordered_map<int, const char*> fn = {
              {int(BinaryOp::Add), "add"}, {int(BinaryOp::Sub), "sub"}, {int(BinaryOp::Mul), "mul"}, {int(BinaryOp::Div), "div"},
              {int(BinaryOp::FloorDiv), "floordiv"}, {int(BinaryOp::Mod), "mod"}, {int(BinaryOp::Min), "min_"}, {int(BinaryOp::Max), "max_"},
              {int(BinaryOp::Pow), "pow_"}, {int(BinaryOp::EQ), "eq"}, {int(BinaryOp::NE), "ne"}, {int(BinaryOp::LT), "lt"},
              {int(BinaryOp::LE), "le"}, {int(BinaryOp::GT), "gt"}, {int(BinaryOp::GE), "ge"}, {int(BinaryOp::And), "and_"},
              {int(BinaryOp::Or), "or_"}, {int(BinaryOp::Xor), "xor_"}, {int(BinaryOp::BitAnd), "bitand_"}, {int(BinaryOp::BitOr), "bitor_"},
              {int(BinaryOp::BitXor), "bitxor_"}, {int(BinaryOp::Shl), "shl"}, {int(BinaryOp::Shr), "shr"}};
          text = fmt::format("fji::{}({}, {})", fn.at(int(e.as<Binary>()->op)), k[0], k[1]);
          break;
        }
        case NodeKind::Select: text = fmt::format("fji::select({}, {}, {})", k[0], k[1], k[2]); break;
        case NodeKind::Cast: text = fmt::format("fji::{}({})", e.type() == Type::Float ? "to_float" : "to_int", k[0]); break;
        default: throw std::logic_error("flexjit internal error: unexpected node in an interval classifier");
      }
    }
    const char* type = e.type() == Type::Int ? "fji::I" : e.type() == Type::Float ? "fji::F" : "fji::B";
    std::string n = fmt::format("i{}", counter++);
    body += fmt::format("    const {} {} = {};\n", type, n, text);
    names[e.get()] = n;
  });
  return fmt::format(
      "// Interval classification of the mask over a box of indices (spec `{}`).\n"
      "struct {} {{\n"
      "  __device__ static __forceinline__ int classify(const {}::Params& p, fji::I b, fji::I h, fji::I hkv, fji::I q, fji::I kv) {{\n"
      "{}    return fji::classify({});\n"
      "  }}\n"
      "}};\n",
      ir.spec().name, name, variant_name, body, names.at(ir.mask_mod.get()));
}

}  // namespace flexjit
