// The typed expression IR: immutable, reference-counted nodes forming a DAG, with no source
// locations. Every back end (CUDA, LLVM, the interpreter) consumes this and nothing else.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "dsl/builtins.h"

namespace flexjit::ir {

using dsl::DType;
using dsl::VarId;

// Value types. Int is 64-bit signed in meaning; code generators may narrow it to 32 bits
// where the range analysis proves that cannot change a result.
enum class Type : uint8_t { Bool, Int, Float };
const char* type_name(Type t);

// Node kinds, one X-macro list generating the enum, the visitor and the printer's dispatch.
#define FLEXJIT_IR_NODE_KINDS(X) \
  X(IntImm)                      \
  X(FloatImm)                    \
  X(BoolImm)                     \
  X(Var)                         \
  X(Param)                       \
  X(Symbol)                      \
  X(Unary)                       \
  X(Binary)                      \
  X(Select)                      \
  X(Cast)                        \
  X(Load)

enum class NodeKind : uint8_t {
#define FLEXJIT_IR_KIND_ENUM(name) name,
  FLEXJIT_IR_NODE_KINDS(FLEXJIT_IR_KIND_ENUM)
#undef FLEXJIT_IR_KIND_ENUM
};

// Unary operators, with the operand types they accept: N = int or float (result same
// type), F = number -> float, B = bool, IB = int or bool.
#define FLEXJIT_IR_UNARY_OPS(X)                                                         \
  X(Neg, "-") X(Not, "!") X(BitNot, "~") X(Abs, "abs") X(Sign, "sign") X(Floor, "floor") \
  X(Ceil, "ceil") X(Round, "round") X(Exp, "exp") X(Exp2, "exp2") X(Log, "log")         \
  X(Log2, "log2") X(Log1p, "log1p") X(Sqrt, "sqrt") X(Rsqrt, "rsqrt") X(Tanh, "tanh")    \
  X(Sigmoid, "sigmoid") X(Sin, "sin") X(Cos, "cos")

enum class UnaryOp : uint8_t {
#define FLEXJIT_IR_UOP_ENUM(name, text) name,
  FLEXJIT_IR_UNARY_OPS(FLEXJIT_IR_UOP_ENUM)
#undef FLEXJIT_IR_UOP_ENUM
};
const char* unary_op_name(UnaryOp op);
bool unary_op_is_float_math(UnaryOp op);  // exp .. cos: always float in, float out

// Binary operators. Arithmetic ops take two operands of one numeric type (the front end
// inserts casts); comparisons give bool; And/Or/Xor are logical on bools; Bit* and shifts
// are on ints. Div is true division (float); FloorDiv and Mod follow Python.
#define FLEXJIT_IR_BINARY_OPS(X)                                                            \
  X(Add, "+") X(Sub, "-") X(Mul, "*") X(Div, "/") X(FloorDiv, "//") X(Mod, "%")            \
  X(Min, "min") X(Max, "max") X(Pow, "pow") X(EQ, "==") X(NE, "!=") X(LT, "<") X(LE, "<=") \
  X(GT, ">") X(GE, ">=") X(And, "&&") X(Or, "||") X(Xor, "^^") X(BitAnd, "&")              \
  X(BitOr, "|") X(BitXor, "^") X(Shl, "<<") X(Shr, ">>")

enum class BinaryOp : uint8_t {
#define FLEXJIT_IR_BOP_ENUM(name, text) name,
  FLEXJIT_IR_BINARY_OPS(FLEXJIT_IR_BOP_ENUM)
#undef FLEXJIT_IR_BOP_ENUM
};
const char* binary_op_name(BinaryOp op);
bool binary_op_is_comparison(BinaryOp op);
bool binary_op_is_commutative(BinaryOp op);

struct Node;

// An immutable handle to a node (null when default-constructed).
class Expr {
 public:
  Expr() = default;
  explicit Expr(std::shared_ptr<const Node> n) : node_(std::move(n)) {}

  const Node* get() const { return node_.get(); }
  const Node* operator->() const { return node_.get(); }
  const Node& operator*() const { return *node_; }
  explicit operator bool() const { return node_ != nullptr; }
  bool same_as(const Expr& o) const { return node_ == o.node_; }

  Type type() const;
  NodeKind kind() const;
  // Downcast: nullptr if the node is not a T.
  template <class T>
  const T* as() const;

 private:
  std::shared_ptr<const Node> node_;
};

struct Node {
  NodeKind kind;
  Type type;
  Node(NodeKind k, Type t) : kind(k), type(t) {}
  virtual ~Node() = default;
};

inline Type Expr::type() const { return node_->type; }
inline NodeKind Expr::kind() const { return node_->kind; }

struct IntImm : Node {
  static constexpr NodeKind kKind = NodeKind::IntImm;
  int64_t value;
  IntImm(int64_t v) : Node(kKind, Type::Int), value(v) {}
  static Expr make(int64_t v);
};

struct FloatImm : Node {
  static constexpr NodeKind kKind = NodeKind::FloatImm;
  float value;  // fp32: the language's float
  FloatImm(float v) : Node(kKind, Type::Float), value(v) {}
  static Expr make(float v);
};

struct BoolImm : Node {
  static constexpr NodeKind kKind = NodeKind::BoolImm;
  bool value;
  BoolImm(bool v) : Node(kKind, Type::Bool), value(v) {}
  static Expr make(bool v);
};

// An index variable: b, h, q, kv, kv_head (ints) or score (float); k0 and j after the
// tile rewrite.
struct Var : Node {
  static constexpr NodeKind kKind = NodeKind::Var;
  VarId var;
  Var(VarId v) : Node(kKind, v == VarId::Score ? Type::Float : Type::Int), var(v) {}
  static Expr make(VarId v);
};

// A runtime scalar parameter, given at launch (const parameters are folded to immediates).
struct Param : Node {
  static constexpr NodeKind kKind = NodeKind::Param;
  int index;         // position in the spec's params
  std::string name;
  Param(int i, std::string n, Type t) : Node(kKind, t), index(i), name(std::move(n)) {}
  static Expr make(int index, const std::string& name, Type t);
};

// A shape symbol used as a value (e.g. Skv), bound at launch; always >= 1.
struct Symbol : Node {
  static constexpr NodeKind kKind = NodeKind::Symbol;
  int index;  // position in the spec's symbol table
  std::string name;
  Symbol(int i, std::string n) : Node(kKind, Type::Int), index(i), name(std::move(n)) {}
  static Expr make(int index, const std::string& name);
};

struct Unary : Node {
  static constexpr NodeKind kKind = NodeKind::Unary;
  UnaryOp op;
  Expr a;
  Unary(UnaryOp o, Expr x, Type t) : Node(kKind, t), op(o), a(std::move(x)) {}
  // Checks operand types; throws std::logic_error on a malformed node (a compiler bug).
  static Expr make(UnaryOp op, Expr a);
};

struct Binary : Node {
  static constexpr NodeKind kKind = NodeKind::Binary;
  BinaryOp op;
  Expr a, b;
  Binary(BinaryOp o, Expr x, Expr y, Type t) : Node(kKind, t), op(o), a(std::move(x)), b(std::move(y)) {}
  static Expr make(BinaryOp op, Expr a, Expr b);
};

struct Select : Node {
  static constexpr NodeKind kKind = NodeKind::Select;
  Expr cond, t, f;
  Select(Expr c, Expr x, Expr y) : Node(kKind, x.type()), cond(std::move(c)), t(std::move(x)), f(std::move(y)) {}
  static Expr make(Expr cond, Expr t, Expr f);
};

// Conversions: int/bool -> float, bool/float -> int (float truncates toward zero, as Python's
// int(); NaN and out-of-range values saturate), int -> bool (x != 0) is not a language
// feature and not used.
struct Cast : Node {
  static constexpr NodeKind kKind = NodeKind::Cast;
  Expr a;
  Cast(Type to, Expr x) : Node(kKind, to), a(std::move(x)) {}
  static Expr make(Type to, Expr a);
};

// One element of a captured buffer. Indices are ints, one per dimension; negative indices
// in [-n, -1] wrap; the result converts to float (f32/f16/bf16), int or bool.
struct Load : Node {
  static constexpr NodeKind kKind = NodeKind::Load;
  int buffer;        // position in the spec's buffers
  std::string name;  // the buffer's name, for printing and messages
  DType dtype;
  std::vector<Expr> indices;
  Load(int buf, std::string n, DType dt, std::vector<Expr> idx, Type t)
      : Node(kKind, t), buffer(buf), name(std::move(n)), dtype(dt), indices(std::move(idx)) {}
  static Expr make(int buffer, const std::string& name, DType dtype, std::vector<Expr> indices);
};

template <class T>
const T* Expr::as() const {
  return node_ && node_->kind == T::kKind ? static_cast<const T*>(node_.get()) : nullptr;
}

// The operands of a node in order (empty for leaves).
std::vector<Expr> children(const Expr& e);
// Whether e is the variable v; whether e is the float constant c (compared exactly).
bool is_var(const Expr& e, VarId v);
bool is_float_const(const Expr& e, float c);
// A copy of `e` with new operands (same count and order as children()).
Expr with_children(const Expr& e, const std::vector<Expr>& kids);

// Convenience constructors used by the front end and the passes.
Expr make_int(int64_t v);
Expr make_float(float v);
Expr make_bool(bool v);
Expr to_float(const Expr& e);  // identity on floats

}  // namespace flexjit::ir
