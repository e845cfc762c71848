#include "runtime/cpu/codegen_llvm.h"

#include <fmt/format.h>
#include <llvm/IR/BasicBlock.h>
#include <llvm/IR/Constants.h>
#include <llvm/IR/DerivedTypes.h>
#include <llvm/IR/Function.h>
#include <llvm/IR/IRBuilder.h>
#include <llvm/IR/Intrinsics.h>
#include <llvm/IR/LLVMContext.h>
#include <llvm/IR/Module.h>
#include <llvm/IR/Verifier.h>
#include <llvm/Support/raw_ostream.h>
#include <llvm/Transforms/Utils/ModuleUtils.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>
#include <set>
#include <stdexcept>
#include <unordered_map>

#include "compiler/ir/ir_printer.h"
#include "compiler/passes/staging.h"
#include "runtime/cpu/mod_abi.h"

namespace flexjit::cpu {

using ir::BinaryOp;
using ir::Expr;
using ir::NodeKind;
using ir::UnaryOp;
using dsl::VarId;

ParamsLayout cpu_params_layout(const SpecIR& ir) { return make_params_layout(ir); }

namespace {

int64_t align_up(int64_t v, int64_t a) { return (v + a - 1) / a * a; }

int64_t type_bytes(ir::Type t) {
  switch (t) {
    case ir::Type::Int: return 8;
    case ir::Type::Float: return 4;
    case ir::Type::Bool: return 1;
  }
  return 8;
}

bool is_int_division(const Expr& e) {
  const ir::Binary* b = e.as<ir::Binary>();
  return b && b->a.type() == ir::Type::Int && (b->op == BinaryOp::FloorDiv || b->op == BinaryOp::Mod);
}

// Where a hoisted value lives in the per-row state.
struct StateSlot {
  int64_t offset = -1;        // value (an array of tile_size entries for Col values)
  int64_t flags_offset = -1;  // uint32 error bits raised computing it; -1 when it cannot raise any
};

}  // namespace

struct CodeGenLLVM::Impl {
  Impl(const SpecIR& spec_ir, const RangeInfo& r, const CodeGenOptions& o) : ir(spec_ir), ranges(r), opt(o) {
    StagingOptions so;
    so.tile_size = o.tile_size;
    so.hoist = o.hoist;
    // Col values cost one array of tile_size entries each in the row state, nothing per
    // thread register as on the GPU, so the CPU keeps more of them.
    so.max_col_values = 8;
    staged = stage_mods(ir.score_mod, ir.mask_mod, so);
    for (size_t i = 0; i < ranges.loads.size(); ++i) load_index.emplace(ranges.loads[i].load.get(), static_cast<int>(i));
    layout = cpu_params_layout(ir);
    const dsl::Spec& spec = ir.spec();
    buf_data.assign(spec.buffers.size(), -1);
    buf_stride.resize(spec.buffers.size());
    buf_extent.resize(spec.buffers.size());
    for (size_t i = 0; i < spec.buffers.size(); ++i) {
      buf_stride[i].assign(spec.buffers[i].shape.size(), -1);
      buf_extent[i].assign(spec.buffers[i].shape.size(), -1);
    }
    sym_slot.assign(ir.checked.symbols.size(), -1);
    param_slot.assign(spec.params.size(), -1);
    for (size_t s = 0; s < layout.slots.size(); ++s) {
      const ParamSlot& ps = layout.slots[s];
      int si = static_cast<int>(s);
      switch (ps.kind) {
        case SlotKind::BufferData: buf_data[ps.index] = si; break;
        case SlotKind::BufferStride: buf_stride[ps.index][ps.dim] = si; break;
        case SlotKind::BufferExtent: buf_extent[ps.index][ps.dim] = si; break;
        case SlotKind::Symbol: sym_slot[ps.index] = si; break;
        case SlotKind::IntParam:
        case SlotKind::FloatParam:
        case SlotKind::BoolParam: param_slot[ps.index] = si; break;
        case SlotKind::FloatParamReciprocal:  // the JIT divides exactly
        case SlotKind::IntParamDivisor:
        case SlotKind::IntParamInt32:  // the JIT compares in 64 bits
        case SlotKind::ErrorFlags: break;
      }
    }
    plan_state();
  }

  Expr origin(const Expr& e) const {
    auto it = staged.origin.find(e.get());
    return it == staged.origin.end() ? e : it->second;
  }

  // RangeInfo::loads index of a (rewritten) load, -1 when it was not analysed.
  int load_site(const Expr& e) const {
    auto it = load_index.find(origin(e).get());
    return it == load_index.end() ? -1 : it->second;
  }

  bool load_checked(const Expr& e) const {
    int i = load_site(e);
    if (i < 0) return true;
    const LoadCheck& c = ranges.loads[i];
    if (c.status == LoadCheck::Status::Proven) return false;
    if (c.status == LoadCheck::Status::Unproven) return true;
    return i >= 64 || ((opt.checked_loads >> i) & 1);
  }

  bool load_may_be_negative(const Expr& e) const {
    int i = load_site(e);
    return i < 0 || ranges.loads[i].may_be_negative;
  }

  // The error bit of a checked load, recording the site for error messages.
  uint32_t load_bit(const Expr& e) {
    int i = load_site(e);
    uint32_t bit = 1u << (i < 0 ? kSharedLoadBit : std::min(i, kSharedLoadBit));
    std::string text = ir::print_inline(origin(e));
    for (const FlagSite& s : sites)
      if (s.expression == text && s.bit == bit) return bit;
    const ir::Load* l = e.as<ir::Load>();
    sites.push_back(FlagSite{l ? l->name : "?", text, bit});
    return bit;
  }

  // A provably non-negative int (from the range analysis of the node it replaces).
  bool nonnegative(const Expr& e) const {
    if (const ir::IntImm* i = e.as<ir::IntImm>()) return i->value >= 0;
    if (const ir::Var* v = e.as<ir::Var>()) return v->var != VarId::Score;
    auto it = ranges.ranges.find(origin(e).get());
    if (it == ranges.ranges.end() || !it->second.lo) return false;
    const ir::IntImm* lo = it->second.lo.as<ir::IntImm>();
    return lo && lo->value >= 0;
  }

  // Whether evaluating e can raise an error bit: a checked load or an int division by a
  // divisor that may be zero somewhere in its subtree (hoisted operands included).
  bool may_flag(const Expr& e) {
    auto it = may_flag_memo.find(e.get());
    if (it != may_flag_memo.end()) return it->second;
    bool r = false;
    if (e.kind() == NodeKind::Load && load_checked(e)) r = true;
    if (is_int_division(e)) {
      const ir::IntImm* d = e.as<ir::Binary>()->b.as<ir::IntImm>();
      if (!d || d->value == 0) r = true;
    }
    for (const Expr& c : ir::children(e)) r = may_flag(c) || r;
    may_flag_memo[e.get()] = r;
    return r;
  }

  void plan_state() {
    int64_t off = 0;
    slots.resize(staged.values.size());
    for (size_t i = 0; i < staged.values.size(); ++i) {
      const HoistedValue& v = staged.values[i];
      int64_t count = v.stage == Stage::Col ? opt.tile_size : 1;
      int64_t bytes = type_bytes(v.expr.type());
      off = align_up(off, v.stage == Stage::Col ? 64 : 8);
      slots[i].offset = off;
      off += bytes * count;
      if (may_flag(v.expr)) {
        off = align_up(off, v.stage == Stage::Col ? 64 : 4);
        slots[i].flags_offset = off;
        off += 4 * count;
      }
    }
    state_bytes = static_cast<size_t>(align_up(off, 64));
  }

  const SpecIR& ir;
  const RangeInfo& ranges;
  CodeGenOptions opt;
  StagedMods staged;
  ParamsLayout layout;
  std::unordered_map<const ir::Node*, int> load_index;
  std::vector<int> buf_data, sym_slot, param_slot;
  std::vector<std::vector<int>> buf_stride, buf_extent;
  std::vector<StateSlot> slots;  // by StagedMods::values index
  size_t state_bytes = 0;
  std::unordered_map<const ir::Node*, bool> may_flag_memo;
  std::vector<FlagSite> sites;
};

namespace {

// Emits the body of one generated function: the IR values of one stage, their error bits
// and the reads of earlier stages' values from the row state.
class FnEmitter {
 public:
  FnEmitter(CodeGenLLVM::Impl& g, llvm::Module& m, Stage stage, llvm::Instruction* entry_end, llvm::BasicBlock* body_block)
      : g_(g), m_(m), ctx_(m.getContext()), stage_(stage), entry_(entry_end), body_(body_block) {
    i1_ = llvm::Type::getInt1Ty(ctx_);
    i8_ = llvm::Type::getInt8Ty(ctx_);
    i16_ = llvm::Type::getInt16Ty(ctx_);
    i32_ = llvm::Type::getInt32Ty(ctx_);
    i64_ = llvm::Type::getInt64Ty(ctx_);
    f32_ = llvm::Type::getFloatTy(ctx_);
    ptr_ = llvm::PointerType::getUnqual(ctx_);
  }

  llvm::Value *p = nullptr, *b = nullptr, *h = nullptr, *hkv = nullptr, *q = nullptr, *k0 = nullptr, *j = nullptr, *score = nullptr,
              *state = nullptr;

  llvm::IRBuilder<>& body() { return body_; }
  llvm::IRBuilder<>& entry() { return entry_; }

  // The value of e at the current point (memoized: each node is emitted once per function).
  llvm::Value* value(const Expr& e) {
    auto it = vals_.find(e.get());
    if (it != vals_.end()) return it->second;
    llvm::Value* v = nullptr;
    auto hv = g_.staged.value_of.find(e.get());
    if (hv != g_.staged.value_of.end() && static_cast<int>(g_.staged.values[hv->second].stage) < static_cast<int>(stage_)) {
      v = load_hoisted(e, hv->second);
    } else {
      v = compute(e);
    }
    vals_[e.get()] = v;
    return v;
  }

  // The error bits raised evaluating `root` here (i32), honouring what the interpreter leaves
  // unevaluated: the untaken operand of a select and the right operand of && / || when the
  // left one decides. Everything is computed eagerly (so the loop stays one basic block);
  // each bit is gated by the condition under which the interpreter would reach the node.
  llvm::Value* flags(const Expr& root) {
    llvm::Value* zero = llvm::ConstantInt::get(i32_, 0);
    if (!g_.may_flag(root)) return zero;
    std::vector<Expr> order;
    std::unordered_map<const ir::Node*, bool> seen;
    std::function<void(const Expr&)> dfs = [&](const Expr& e) {
      if (seen[e.get()]) return;
      seen[e.get()] = true;
      if (!(is_leaf(e, root)))
        for (const Expr& c : ir::children(e))
          if (g_.may_flag(c)) dfs(c);
      order.push_back(e);
    };
    dfs(root);
    std::reverse(order.begin(), order.end());  // users before operands
    std::unordered_map<const ir::Node*, llvm::Value*> reach;
    reach[root.get()] = body_.getTrue();
    llvm::Value* acc = zero;
    auto add_bits = [&](llvm::Value* cond, llvm::Value* bits) {
      acc = or_(acc, body_.CreateSelect(cond, bits, zero));
    };
    for (const Expr& n : order) {
      llvm::Value* rc = reach.at(n.get());
      if (is_leaf(n, root)) {
        auto lf = leaf_flags_.find(n.get());
        if (lf != leaf_flags_.end()) add_bits(rc, lf->second);
        continue;
      }
      auto lb = load_bad_.find(n.get());
      if (lb != load_bad_.end()) add_bits(and_(rc, lb->second), llvm::ConstantInt::get(i32_, lb_bits_.at(n.get())));
      auto dz = div_zero_.find(n.get());
      if (dz != div_zero_.end()) add_bits(and_(rc, dz->second), llvm::ConstantInt::get(i32_, kZeroDivisorBit));
      std::vector<Expr> kids = ir::children(n);
      std::vector<llvm::Value*> conds(kids.size(), rc);
      if (const ir::Select* s = n.as<ir::Select>()) {
        llvm::Value* c = value(s->cond);
        conds[1] = and_(rc, c);
        conds[2] = and_(rc, body_.CreateNot(c));
      } else if (const ir::Binary* bin = n.as<ir::Binary>(); bin && bin->a.type() == ir::Type::Bool) {
        if (bin->op == BinaryOp::And) conds[1] = and_(rc, value(bin->a));
        if (bin->op == BinaryOp::Or) conds[1] = and_(rc, body_.CreateNot(value(bin->a)));
      }
      for (size_t i = 0; i < kids.size(); ++i) {
        if (!g_.may_flag(kids[i])) continue;
        llvm::Value*& r = reach[kids[i].get()];
        r = r ? or_(r, conds[i]) : conds[i];
      }
    }
    return acc;
  }

  // Records the error bits of a value this function computed (a hoisted value of its stage),
  // so later roots that use it pick them up.
  void set_leaf_flags(const Expr& e, llvm::Value* bits) { leaf_flags_[e.get()] = bits; }

  // The libmvec ABI letters calls may name variants for (TargetInfo::vector_math_isas).
  void set_vector_isas(const std::string& isas) { vector_isas_ = isas; }

  llvm::Value* state_ptr(llvm::IRBuilder<>& bld, int64_t offset, llvm::Value* index, int64_t elem_bytes) {
    llvm::Value* off = llvm::ConstantInt::get(i64_, offset);
    if (index) off = bld.CreateAdd(off, bld.CreateMul(index, llvm::ConstantInt::get(i64_, elem_bytes)));
    return bld.CreateGEP(i8_, state, off);
  }

  // Stores a value into its state slot (Col values at column j).
  void store_value(llvm::IRBuilder<>& bld, const Expr& e, llvm::Value* v, const StateSlot& slot, llvm::Value* index) {
    llvm::Value* stored = e.type() == ir::Type::Bool ? bld.CreateZExt(v, i8_) : v;
    bld.CreateStore(stored, state_ptr(bld, slot.offset, index, type_bytes(e.type())));
  }
  void store_flags(llvm::IRBuilder<>& bld, llvm::Value* bits, const StateSlot& slot, llvm::Value* index) {
    bld.CreateStore(bits, state_ptr(bld, slot.flags_offset, index, 4));
  }

  llvm::Type* llvm_type(ir::Type t) const { return t == ir::Type::Bool ? i1_ : t == ir::Type::Int ? i64_ : f32_; }

  // The element a load of `buffer` at `indices` reads, as an offset into a contiguous array
  // of the buffer's shape: each index in [-n, -1] wraps, anything else clamps to [0, n - 1]
  // (the forward load's rule, so a gradient lands where the value came from).
  llvm::Value* resolved_offset(int buffer, const std::vector<Expr>& indices) {
    llvm::Value* offset = iconst(0);
    for (size_t d = 0; d < indices.size(); ++d) {
      llvm::Value* i = value(indices[d]);
      llvm::Value* n = slot_i64(g_.buf_extent[buffer][d]);
      i = body_.CreateSelect(body_.CreateICmpSLT(i, iconst(0)), body_.CreateAdd(i, n), i);
      i = body_.CreateBinaryIntrinsic(llvm::Intrinsic::smin, i, entry_.CreateSub(n, iconst(1)));
      i = body_.CreateBinaryIntrinsic(llvm::Intrinsic::smax, i, iconst(0));
      offset = d == 0 ? i : body_.CreateAdd(body_.CreateMul(offset, n), i);
    }
    return offset;
  }

 private:
  // A hoisted value whose error bits come precomputed: any hoisted node below the root, and
  // the root itself when this function reads it from the state of an earlier stage.
  bool is_leaf(const Expr& e, const Expr& root) const {
    auto it = g_.staged.value_of.find(e.get());
    if (it == g_.staged.value_of.end()) return false;
    return !e.same_as(root) || static_cast<int>(g_.staged.values[it->second].stage) < static_cast<int>(stage_);
  }

  llvm::Value* and_(llvm::Value* a, llvm::Value* c) {
    if (auto* k = llvm::dyn_cast<llvm::ConstantInt>(a)) return k->isOne() ? c : a;
    if (auto* k = llvm::dyn_cast<llvm::ConstantInt>(c)) return k->isOne() ? a : c;
    return body_.CreateAnd(a, c);
  }
  llvm::Value* or_(llvm::Value* a, llvm::Value* c) {
    if (auto* k = llvm::dyn_cast<llvm::ConstantInt>(a); k && k->isZero()) return c;
    if (auto* k = llvm::dyn_cast<llvm::ConstantInt>(c); k && k->isZero()) return a;
    return body_.CreateOr(a, c);
  }

  // A slot of the parameter array, loaded once in the entry block.
  llvm::Value* slot_i64(int slot) {
    auto it = slot_vals_.find(slot);
    if (it != slot_vals_.end()) return it->second;
    llvm::Value* ptr = entry_.CreateConstInBoundsGEP1_64(i64_, p, static_cast<uint64_t>(slot));
    llvm::Value* v = entry_.CreateLoad(i64_, ptr);
    slot_vals_[slot] = v;
    return v;
  }
  llvm::Value* slot_ptr(int slot) {
    auto it = slot_ptrs_.find(slot);
    if (it != slot_ptrs_.end()) return it->second;
    llvm::Value* ptr = entry_.CreateConstInBoundsGEP1_64(i64_, p, static_cast<uint64_t>(slot));
    llvm::Value* v = entry_.CreateLoad(ptr_, ptr);
    slot_ptrs_[slot] = v;
    return v;
  }
  llvm::Value* slot_f32(int slot) {
    llvm::Value* ptr = entry_.CreateConstInBoundsGEP1_64(i64_, p, static_cast<uint64_t>(slot));
    return entry_.CreateLoad(f32_, ptr);
  }

  llvm::Value* load_hoisted(const Expr& e, int index) {
    const HoistedValue& hv = g_.staged.values[index];
    const StateSlot& slot = g_.slots[index];
    bool per_col = hv.stage == Stage::Col;
    if (per_col && !j) throw std::logic_error("flexjit internal error: a column value read outside a column loop");
    llvm::IRBuilder<>& bld = per_col ? body_ : entry_;
    llvm::Value* idx = per_col ? j : nullptr;
    llvm::Type* mem_t = e.type() == ir::Type::Bool ? i8_ : llvm_type(e.type());
    llvm::Value* v = bld.CreateLoad(mem_t, state_ptr(bld, slot.offset, idx, type_bytes(e.type())));
    if (e.type() == ir::Type::Bool) v = bld.CreateICmpNE(v, llvm::ConstantInt::get(i8_, 0));
    if (slot.flags_offset >= 0) leaf_flags_[e.get()] = bld.CreateLoad(i32_, state_ptr(bld, slot.flags_offset, idx, 4));
    return v;
  }

  llvm::Value* var(VarId v) {
    llvm::Value* r = nullptr;
    switch (v) {
      case VarId::B: r = b; break;
      case VarId::H: r = h; break;
      case VarId::KvHead: r = hkv; break;
      case VarId::Q: r = q; break;
      case VarId::TileStart: r = k0; break;
      case VarId::TileCol: r = j; break;
      case VarId::Score: r = score; break;
      case VarId::KV: r = k0 && j ? body_.CreateAdd(k0, j) : nullptr; break;
    }
    if (!r) throw std::logic_error(fmt::format("flexjit internal error: variable `{}` is not available in the {} stage function", dsl::var_name(v),
                                               stage_name(stage_)));
    return r;
  }

  llvm::Value* call_intrinsic(llvm::Intrinsic::ID id, llvm::Type* t, std::initializer_list<llvm::Value*> args) {
    return body_.CreateIntrinsic(id, {t}, std::vector<llvm::Value*>(args));
  }

  // libm functions LLVM has no intrinsic for (or whose intrinsic it may rewrite inexactly:
  // pow(x, -1) -> 1 / x), called under private names the JIT binds to the C library, so
  // the results are the C library's bit for bit, as in the interpreter. With vector_math,
  // the call also names libmvec's variants (`_ZGVdN8v_tanhf` ...) through the vector
  // function ABI attribute, so the loop vectoriser can widen loops that contain it.
  llvm::Value* call_libm(const char* name, const char* libm_name, std::initializer_list<llvm::Value*> args) {
    std::vector<llvm::Type*> params(args.size(), f32_);
    llvm::FunctionCallee f = m_.getOrInsertFunction(name, llvm::FunctionType::get(f32_, params, false));
    if (auto* fn = llvm::dyn_cast<llvm::Function>(f.getCallee())) {
      fn->setDoesNotThrow();
      fn->setDoesNotAccessMemory();
      fn->addFnAttr(llvm::Attribute::WillReturn);
    }
    llvm::CallInst* c = body_.CreateCall(f, std::vector<llvm::Value*>(args));
    c->setDoesNotAccessMemory();
    c->setDoesNotThrow();
    if (g_.opt.vector_math && !vector_isas_.empty()) {
      std::string variants;
      std::string kinds(args.size(), 'v');
      for (char isa : vector_isas_) {
        unsigned lanes = isa == 'b' ? 4 : isa == 'e' ? 16 : 8;
        std::string vector_name = fmt::format("_ZGV{}N{}{}_{}", isa, lanes, kinds, libm_name);
        llvm::Type* vt = llvm::FixedVectorType::get(f32_, lanes);
        std::vector<llvm::Type*> vparams(args.size(), vt);
        llvm::FunctionCallee vf = m_.getOrInsertFunction(vector_name, llvm::FunctionType::get(vt, vparams, false));
        if (auto* fn = llvm::dyn_cast<llvm::Function>(vf.getCallee())) {
          fn->setDoesNotThrow();
          fn->setDoesNotAccessMemory();
          fn->addFnAttr(llvm::Attribute::WillReturn);
          // Unused until the vectoriser calls it: keep global DCE from deleting the
          // declaration the mapping refers to (as LLVM's InjectTLIMappings does).
          if (kept_.insert(fn).second) llvm::appendToCompilerUsed(m_, {fn});
        }
        variants += fmt::format("{}_ZGV{}N{}{}_{}({})", variants.empty() ? "" : ",", isa, lanes, kinds, name, vector_name);
      }
      c->addFnAttr(llvm::Attribute::get(ctx_, "vector-function-abi-variant", variants));
    }
    return c;
  }
  llvm::Value* fconst(float v) { return llvm::ConstantFP::get(f32_, static_cast<double>(v)); }
  llvm::Value* iconst(int64_t v) { return llvm::ConstantInt::get(i64_, static_cast<uint64_t>(v), true); }

  llvm::Value* compute(const Expr& e) {
    switch (e.kind()) {
      case NodeKind::IntImm: return iconst(e.as<ir::IntImm>()->value);
      case NodeKind::FloatImm: return fconst(e.as<ir::FloatImm>()->value);
      case NodeKind::BoolImm: return e.as<ir::BoolImm>()->value ? body_.getTrue() : body_.getFalse();
      case NodeKind::Var: return var(e.as<ir::Var>()->var);
      case NodeKind::Param: return param(e);
      case NodeKind::Symbol: {
        const ir::Symbol* s = e.as<ir::Symbol>();
        int slot = s->index >= 0 && static_cast<size_t>(s->index) < g_.sym_slot.size() ? g_.sym_slot[s->index] : -1;
        if (slot < 0) throw std::logic_error(fmt::format("flexjit internal error: no slot for symbol `{}`", s->name));
        return slot_i64(slot);
      }
      case NodeKind::Unary: return unary(e.as<ir::Unary>());
      case NodeKind::Binary: return binary(e, e.as<ir::Binary>());
      case NodeKind::Select: {
        const ir::Select* s = e.as<ir::Select>();
        llvm::Value* c = value(s->cond);
        llvm::Value* t = value(s->t);
        llvm::Value* f = value(s->f);
        return body_.CreateSelect(c, t, f);
      }
      case NodeKind::Cast: return cast(e.type(), value(e.as<ir::Cast>()->a), e.as<ir::Cast>()->a.type());
      case NodeKind::Load: return load(e, e.as<ir::Load>());
    }
    throw std::logic_error("flexjit internal error: unknown IR node kind");
  }

  llvm::Value* cast(ir::Type to, llvm::Value* v, ir::Type from) {
    if (to == from) return v;
    if (to == ir::Type::Float) return from == ir::Type::Int ? body_.CreateSIToFP(v, f32_) : body_.CreateUIToFP(v, f32_);
    if (to == ir::Type::Int) {
      if (from == ir::Type::Bool) return body_.CreateZExt(v, i64_);
      // Truncation toward zero, NaN -> 0, saturating: exactly fptosi.sat.
      return body_.CreateIntrinsic(llvm::Intrinsic::fptosi_sat, {i64_, f32_}, {v});
    }
    throw std::logic_error("flexjit internal error: cast to bool");
  }

  llvm::Value* param(const Expr& e) {
    const ir::Param* pr = e.as<ir::Param>();
    if (pr->index < 0 || static_cast<size_t>(pr->index) >= g_.param_slot.size() || g_.param_slot[pr->index] < 0)
      throw std::logic_error(fmt::format("flexjit internal error: no slot for parameter `{}`", pr->name));
    int slot = g_.param_slot[pr->index];
    dsl::ValueType declared = g_.ir.spec().params[pr->index].type;
    llvm::Value* v;
    ir::Type from;
    if (declared == dsl::ValueType::Float) {
      v = slot_f32(slot);
      from = ir::Type::Float;
    } else if (declared == dsl::ValueType::Bool) {
      v = entry_.CreateICmpNE(slot_i64(slot), iconst(0));
      from = ir::Type::Bool;
    } else {
      v = slot_i64(slot);
      from = ir::Type::Int;
    }
    return cast(e.type(), v, from);
  }

  llvm::Value* unary(const ir::Unary* u) {
    llvm::Value* a = value(u->a);
    ir::Type t = u->a.type();
    if (t == ir::Type::Bool) return body_.CreateNot(a);
    if (t == ir::Type::Int) {
      switch (u->op) {
        case UnaryOp::Neg: return body_.CreateSub(iconst(0), a);
        case UnaryOp::BitNot: return body_.CreateNot(a);
        case UnaryOp::Abs: return body_.CreateSelect(body_.CreateICmpSLT(a, iconst(0)), body_.CreateSub(iconst(0), a), a);
        case UnaryOp::Sign:
          return body_.CreateSub(body_.CreateZExt(body_.CreateICmpSGT(a, iconst(0)), i64_), body_.CreateZExt(body_.CreateICmpSLT(a, iconst(0)), i64_));
        case UnaryOp::Floor:
        case UnaryOp::Ceil:
        case UnaryOp::Round: return a;
        default: break;
      }
      throw std::logic_error("flexjit internal error: float-only unary op on an int");
    }
    switch (u->op) {
      case UnaryOp::Neg: return body_.CreateFNeg(a);
      case UnaryOp::Abs: return call_intrinsic(llvm::Intrinsic::fabs, f32_, {a});
      case UnaryOp::Sign: {
        llvm::Value* s = body_.CreateSelect(body_.CreateFCmpOGT(a, fconst(0)), fconst(1),
                                            body_.CreateSelect(body_.CreateFCmpOLT(a, fconst(0)), fconst(-1), fconst(0)));
        return body_.CreateSelect(body_.CreateFCmpUNO(a, a), a, s);
      }
      case UnaryOp::Floor: return call_intrinsic(llvm::Intrinsic::floor, f32_, {a});
      case UnaryOp::Ceil: return call_intrinsic(llvm::Intrinsic::ceil, f32_, {a});
      case UnaryOp::Round: return call_intrinsic(llvm::Intrinsic::roundeven, f32_, {a});
      case UnaryOp::Exp: return call_intrinsic(llvm::Intrinsic::exp, f32_, {a});
      case UnaryOp::Exp2: return call_intrinsic(llvm::Intrinsic::exp2, f32_, {a});
      case UnaryOp::Log: return call_intrinsic(llvm::Intrinsic::log, f32_, {a});
      case UnaryOp::Log2: return call_intrinsic(llvm::Intrinsic::log2, f32_, {a});
      case UnaryOp::Log1p: return call_libm("flexjit_log1pf", "log1pf", {a});
      case UnaryOp::Sqrt: return call_intrinsic(llvm::Intrinsic::sqrt, f32_, {a});
      case UnaryOp::Rsqrt: return body_.CreateFDiv(fconst(1), call_intrinsic(llvm::Intrinsic::sqrt, f32_, {a}));
      case UnaryOp::Tanh: return call_libm("flexjit_tanhf", "tanhf", {a});
      case UnaryOp::Sigmoid: {
        llvm::Value* ex = call_intrinsic(llvm::Intrinsic::exp, f32_, {body_.CreateFNeg(a)});
        return body_.CreateFDiv(fconst(1), body_.CreateFAdd(fconst(1), ex));
      }
      case UnaryOp::Sin: return call_intrinsic(llvm::Intrinsic::sin, f32_, {a});
      case UnaryOp::Cos: return call_intrinsic(llvm::Intrinsic::cos, f32_, {a});
      case UnaryOp::Not:
      case UnaryOp::BitNot: break;
    }
    throw std::logic_error("flexjit internal error: int/bool-only unary op on a float");
  }

  llvm::Value* sign_bit(llvm::Value* f) { return body_.CreateICmpSLT(body_.CreateBitCast(f, i32_), llvm::ConstantInt::get(i32_, 0)); }

  llvm::Value* binary(const Expr& e, const ir::Binary* bin) {
    llvm::Value* x = value(bin->a);
    llvm::Value* y = value(bin->b);
    ir::Type t = bin->a.type();
    if (t == ir::Type::Bool) {
      switch (bin->op) {
        case BinaryOp::And: return body_.CreateAnd(x, y);
        case BinaryOp::Or: return body_.CreateOr(x, y);
        case BinaryOp::Xor:
        case BinaryOp::NE: return body_.CreateXor(x, y);
        case BinaryOp::EQ: return body_.CreateICmpEQ(x, y);
        default: break;
      }
      throw std::logic_error("flexjit internal error: arithmetic on bools");
    }
    if (t == ir::Type::Float) {
      switch (bin->op) {
        case BinaryOp::Add: return body_.CreateFAdd(x, y);
        case BinaryOp::Sub: return body_.CreateFSub(x, y);
        case BinaryOp::Mul: return body_.CreateFMul(x, y);
        case BinaryOp::Div: return body_.CreateFDiv(x, y);
        case BinaryOp::FloorDiv: return call_intrinsic(llvm::Intrinsic::floor, f32_, {body_.CreateFDiv(x, y)});
        case BinaryOp::Mod: {
          // fmodf, then + b when the remainder is non-zero and its sign differs from b's.
          llvm::Value* r = body_.CreateFRem(x, y);
          llvm::Value* fix = body_.CreateAnd(body_.CreateFCmpUNE(r, fconst(0)), body_.CreateXor(sign_bit(r), sign_bit(y)));
          return body_.CreateSelect(fix, body_.CreateFAdd(r, y), r);
        }
        case BinaryOp::Min: return call_intrinsic(llvm::Intrinsic::minnum, f32_, {x, y});
        case BinaryOp::Max: return call_intrinsic(llvm::Intrinsic::maxnum, f32_, {x, y});
        case BinaryOp::Pow: return call_libm("flexjit_powf", "powf", {x, y});
        case BinaryOp::EQ: return body_.CreateFCmpOEQ(x, y);
        case BinaryOp::NE: return body_.CreateFCmpUNE(x, y);
        case BinaryOp::LT: return body_.CreateFCmpOLT(x, y);
        case BinaryOp::LE: return body_.CreateFCmpOLE(x, y);
        case BinaryOp::GT: return body_.CreateFCmpOGT(x, y);
        case BinaryOp::GE: return body_.CreateFCmpOGE(x, y);
        default: break;
      }
      throw std::logic_error("flexjit internal error: int/bool-only binary op on floats");
    }
    switch (bin->op) {
      case BinaryOp::Add: return body_.CreateAdd(x, y);
      case BinaryOp::Sub: return body_.CreateSub(x, y);
      case BinaryOp::Mul: return body_.CreateMul(x, y);
      case BinaryOp::FloorDiv:
      case BinaryOp::Mod: return int_division(e, bin, x, y);
      case BinaryOp::Min: return body_.CreateBinaryIntrinsic(llvm::Intrinsic::smin, x, y);
      case BinaryOp::Max: return body_.CreateBinaryIntrinsic(llvm::Intrinsic::smax, x, y);
      case BinaryOp::EQ: return body_.CreateICmpEQ(x, y);
      case BinaryOp::NE: return body_.CreateICmpNE(x, y);
      case BinaryOp::LT: return body_.CreateICmpSLT(x, y);
      case BinaryOp::LE: return body_.CreateICmpSLE(x, y);
      case BinaryOp::GT: return body_.CreateICmpSGT(x, y);
      case BinaryOp::GE: return body_.CreateICmpSGE(x, y);
      case BinaryOp::BitAnd: return body_.CreateAnd(x, y);
      case BinaryOp::BitOr: return body_.CreateOr(x, y);
      case BinaryOp::BitXor: return body_.CreateXor(x, y);
      case BinaryOp::Shl: {
        // n outside [0, 63] gives 0; the shift amount is masked so the shift is never poison.
        llvm::Value* sh = body_.CreateShl(x, body_.CreateAnd(y, iconst(63)));
        return body_.CreateSelect(body_.CreateICmpULT(y, iconst(64)), sh, iconst(0));
      }
      case BinaryOp::Shr: {
        llvm::Value* sh = body_.CreateAShr(x, body_.CreateAnd(y, iconst(63)));
        llvm::Value* big = body_.CreateAShr(x, iconst(63));
        return body_.CreateSelect(body_.CreateICmpSLT(y, iconst(0)), iconst(0), body_.CreateSelect(body_.CreateICmpSGT(y, iconst(63)), big, sh));
      }
      default: break;
    }
    throw std::logic_error("flexjit internal error: float/bool-only binary op on ints");
  }

  // Python floor division / modulo without undefined behaviour: the divisor is made safe
  // (0 and -1 replaced by 1) and the special cases selected afterwards.
  llvm::Value* int_division(const Expr& e, const ir::Binary* bin, llvm::Value* x, llvm::Value* y) {
    bool div = bin->op == BinaryOp::FloorDiv;
    const ir::IntImm* c = bin->b.as<ir::IntImm>();
    if (c && c->value > 0 && g_.nonnegative(bin->a)) return div ? body_.CreateUDiv(x, y) : body_.CreateURem(x, y);
    if (c && c->value == -1) return div ? body_.CreateSub(iconst(0), x) : iconst(0);
    llvm::Value* zero = nullptr;
    llvm::Value* safe = y;
    llvm::Value* minus1 = nullptr;
    if (!c || c->value == 0) {
      zero = body_.CreateICmpEQ(y, iconst(0));
      minus1 = body_.CreateICmpEQ(y, iconst(-1));
      safe = body_.CreateSelect(body_.CreateOr(zero, minus1), iconst(1), y);
    }
    llvm::Value* qt = body_.CreateSDiv(x, safe);
    llvm::Value* rm = body_.CreateSRem(x, safe);
    llvm::Value* adjust = body_.CreateAnd(body_.CreateICmpNE(rm, iconst(0)), body_.CreateICmpSLT(body_.CreateXor(rm, safe), iconst(0)));
    llvm::Value* r = div ? body_.CreateSelect(adjust, body_.CreateSub(qt, iconst(1)), qt) : body_.CreateSelect(adjust, body_.CreateAdd(rm, safe), rm);
    if (zero) {
      r = body_.CreateSelect(minus1, div ? body_.CreateSub(iconst(0), x) : iconst(0), r);
      r = body_.CreateSelect(zero, iconst(0), r);
      div_zero_[e.get()] = zero;
    }
    return r;
  }

  // fp16 bits -> fp32, exactly, in integer arithmetic (no F16C or libgcc helper needed).
  llvm::Value* half_to_float(llvm::Value* h16) {
    llvm::Value* h = body_.CreateZExt(h16, i32_);
    auto k = [&](uint32_t v) { return llvm::ConstantInt::get(i32_, v); };
    llvm::Value* sign = body_.CreateShl(body_.CreateAnd(h, k(0x8000)), k(16));
    llvm::Value* ex = body_.CreateAnd(body_.CreateLShr(h, k(10)), k(0x1f));
    llvm::Value* man = body_.CreateAnd(h, k(0x3ff));
    llvm::Value* normal = body_.CreateOr(sign, body_.CreateOr(body_.CreateShl(body_.CreateAdd(ex, k(112)), k(23)), body_.CreateShl(man, k(13))));
    llvm::Value* special = body_.CreateOr(sign, body_.CreateOr(k(0x7f800000u), body_.CreateShl(man, k(13))));
    // Zero and subnormals: mantissa * 2^-24 is exact in fp32.
    llvm::Value* sub = body_.CreateFMul(body_.CreateUIToFP(man, f32_), fconst(5.9604644775390625e-08f));
    llvm::Value* sub_bits = body_.CreateOr(body_.CreateBitCast(sub, i32_), sign);
    llvm::Value* bits = body_.CreateSelect(body_.CreateICmpEQ(ex, k(0x1f)), special, body_.CreateSelect(body_.CreateICmpEQ(ex, k(0)), sub_bits, normal));
    return body_.CreateBitCast(bits, f32_);
  }

  llvm::Value* load(const Expr& e, const ir::Load* l) {
    if (l->buffer < 0 || static_cast<size_t>(l->buffer) >= g_.buf_data.size())
      throw std::logic_error(fmt::format("flexjit internal error: load from undeclared buffer `{}`", l->name));
    bool checked = g_.load_checked(e);
    bool may_neg = g_.load_may_be_negative(e);
    llvm::Value* offset = iconst(0);
    llvm::Value* bad = nullptr;
    for (size_t d = 0; d < l->indices.size(); ++d) {
      llvm::Value* i = value(l->indices[d]);
      llvm::Value* stride = slot_i64(g_.buf_stride[l->buffer][d]);
      if (checked) {
        llvm::Value* n = slot_i64(g_.buf_extent[l->buffer][d]);
        if (may_neg) i = body_.CreateSelect(body_.CreateICmpSLT(i, iconst(0)), body_.CreateAdd(i, n), i);
        // Out of [0, n): unsigned compare catches the negative side too.
        llvm::Value* out = body_.CreateICmpUGE(i, n);
        bad = bad ? body_.CreateOr(bad, out) : out;
        // Clamp to [0, n - 1] (to 0 when n is 0: the driver then points the buffer at zeros).
        i = body_.CreateBinaryIntrinsic(llvm::Intrinsic::smin, i, entry_.CreateSub(n, iconst(1)));
        i = body_.CreateBinaryIntrinsic(llvm::Intrinsic::smax, i, iconst(0));
      }
      offset = d == 0 ? body_.CreateMul(i, stride) : body_.CreateAdd(offset, body_.CreateMul(i, stride));
    }
    if (checked && bad) {
      load_bad_[e.get()] = bad;
      lb_bits_[e.get()] = g_.load_bit(e);
    }
    llvm::Value* base = slot_ptr(g_.buf_data[l->buffer]);
    auto elem = [&](llvm::Type* t) {
      llvm::Value* ptr = body_.CreateGEP(t, base, offset);
      llvm::LoadInst* ld = body_.CreateLoad(t, ptr);
      ld->setAlignment(llvm::Align(1));
      return ld;
    };
    switch (l->dtype) {
      case dsl::DType::F32: return elem(f32_);
      case dsl::DType::F16: return half_to_float(elem(i16_));
      case dsl::DType::BF16:
        return body_.CreateBitCast(body_.CreateShl(body_.CreateZExt(elem(i16_), i32_), llvm::ConstantInt::get(i32_, 16)), f32_);
      case dsl::DType::I32: return body_.CreateSExt(elem(i32_), i64_);
      case dsl::DType::I64: return elem(i64_);
      case dsl::DType::U8: return body_.CreateZExt(elem(i8_), i64_);
      case dsl::DType::Bool: return body_.CreateICmpNE(elem(i8_), llvm::ConstantInt::get(i8_, 0));
      case dsl::DType::F8E4M3: case dsl::DType::F8E5M2: break;  // KV-cache types, never a buffer's
    }
    throw std::logic_error("flexjit internal error: unknown buffer dtype");
  }

  CodeGenLLVM::Impl& g_;
  llvm::Module& m_;
  llvm::LLVMContext& ctx_;
  Stage stage_;
  llvm::IRBuilder<> entry_;
  llvm::IRBuilder<> body_;
  llvm::Type *i1_, *i8_, *i16_, *i32_, *i64_, *f32_, *ptr_;
  std::unordered_map<const ir::Node*, llvm::Value*> vals_;
  std::unordered_map<const ir::Node*, llvm::Value*> leaf_flags_;
  std::unordered_map<const ir::Node*, llvm::Value*> load_bad_;
  std::unordered_map<const ir::Node*, uint32_t> lb_bits_;
  std::unordered_map<const ir::Node*, llvm::Value*> div_zero_;
  std::unordered_map<int, llvm::Value*> slot_vals_, slot_ptrs_;
  std::string vector_isas_;
  std::set<llvm::Function*> kept_;
};

// One generated function: its signature, attributes and (for row segments) the loop.
struct FnShape {
  llvm::Function* fn = nullptr;
  llvm::Instruction* entry_end = nullptr;  // the entry block's terminator
  llvm::BasicBlock* body = nullptr;        // where per-element code goes
  llvm::PHINode* j = nullptr;              // loop index (null without a loop)
  llvm::PHINode* acc = nullptr;            // error bits accumulated over the loop
};

enum class ArgKind { Params, Index, Count, State, StateOut, Scores, KeepIn, KeepOut, ScoresIn, Out };

llvm::Function* make_function(llvm::Module& m, const TargetInfo& target, const std::string& name, llvm::Type* ret,
                              const std::vector<std::pair<const char*, ArgKind>>& args) {
  llvm::LLVMContext& ctx = m.getContext();
  std::vector<llvm::Type*> types;
  for (const auto& [n, k] : args) {
    (void)n;
    bool ptr = k != ArgKind::Index && k != ArgKind::Count;
    types.push_back(ptr ? static_cast<llvm::Type*>(llvm::PointerType::getUnqual(ctx)) : llvm::Type::getInt64Ty(ctx));
  }
  llvm::Function* f = llvm::Function::Create(llvm::FunctionType::get(ret, types, false), llvm::Function::ExternalLinkage, name, m);
  f->setDoesNotThrow();
  f->addFnAttr(llvm::Attribute::WillReturn);
  f->addFnAttr(llvm::Attribute::MustProgress);
  if (!target.cpu.empty()) f->addFnAttr("target-cpu", target.cpu);
  if (!target.features.empty()) f->addFnAttr("target-features", target.features);
  for (size_t i = 0; i < args.size(); ++i) {
    f->getArg(static_cast<unsigned>(i))->setName(args[i].first);
    ArgKind k = args[i].second;
    if (k == ArgKind::Index || k == ArgKind::Count) continue;
    f->addParamAttr(static_cast<unsigned>(i), llvm::Attribute::NoAlias);
    f->addParamAttr(static_cast<unsigned>(i), llvm::Attribute::NoCapture);
    if (k == ArgKind::Params || k == ArgKind::KeepIn || k == ArgKind::State || k == ArgKind::ScoresIn) f->addParamAttr(static_cast<unsigned>(i), llvm::Attribute::ReadOnly);
  }
  return f;
}

// entry: [invariants] br (n > 0) loop, exit;  loop: j, acc phis, body, latch;  exit: ret acc.
FnShape make_loop(llvm::Function* f, llvm::Value* n, bool returns_bits) {
  llvm::LLVMContext& ctx = f->getContext();
  FnShape s;
  s.fn = f;
  llvm::BasicBlock* entry = llvm::BasicBlock::Create(ctx, "entry", f);
  llvm::BasicBlock* loop = llvm::BasicBlock::Create(ctx, "loop", f);
  llvm::BasicBlock* exit = llvm::BasicBlock::Create(ctx, "exit", f);
  llvm::IRBuilder<> eb(entry);
  llvm::Type* i64 = llvm::Type::getInt64Ty(ctx);
  llvm::Type* i32 = llvm::Type::getInt32Ty(ctx);
  s.entry_end = eb.CreateCondBr(eb.CreateICmpSGT(n, llvm::ConstantInt::get(i64, 0)), loop, exit);
  llvm::IRBuilder<> lb(loop);
  s.j = lb.CreatePHI(i64, 2, "j");
  s.j->addIncoming(llvm::ConstantInt::get(i64, 0), entry);
  if (returns_bits) {
    s.acc = lb.CreatePHI(i32, 2, "errors");
    s.acc->addIncoming(llvm::ConstantInt::get(i32, 0), entry);
  }
  s.body = loop;
  return s;
}

// Closes the loop made by make_loop: `acc_next` is the accumulated error word after this column.
void finish_loop(FnShape& s, llvm::IRBuilder<>& body, llvm::Value* n, llvm::Value* acc_next) {
  llvm::LLVMContext& ctx = s.fn->getContext();
  llvm::Type* i64 = llvm::Type::getInt64Ty(ctx);
  llvm::BasicBlock* loop = body.GetInsertBlock();
  llvm::BasicBlock* exit = &s.fn->back();
  llvm::Value* next = body.CreateAdd(s.j, llvm::ConstantInt::get(i64, 1), "j.next", /*HasNUW=*/true, /*HasNSW=*/true);
  s.j->addIncoming(next, loop);
  if (s.acc) s.acc->addIncoming(acc_next, loop);
  body.CreateCondBr(body.CreateICmpEQ(next, n), exit, loop);
  llvm::IRBuilder<> xb(exit);
  if (s.acc) {
    llvm::PHINode* r = xb.CreatePHI(llvm::Type::getInt32Ty(ctx), 2, "errors.out");
    r->addIncoming(llvm::ConstantInt::get(llvm::Type::getInt32Ty(ctx), 0), &s.fn->getEntryBlock());
    r->addIncoming(acc_next, loop);
    xb.CreateRet(r);
  } else {
    xb.CreateRetVoid();
  }
}

}  // namespace

CodeGenLLVM::CodeGenLLVM(const SpecIR& ir, const RangeInfo& ranges, const CodeGenOptions& options)
    : impl_(std::make_unique<Impl>(ir, ranges, options)) {
  info_.params = impl_->layout;
  info_.tile_size = options.tile_size;
  info_.state_bytes = impl_->state_bytes;
  info_.row_values = impl_->staged.count(Stage::Row);
  info_.col_values = impl_->staged.count(Stage::Col);
  info_.tile_values = impl_->staged.count(Stage::Tile);
  info_.has_score_mod = static_cast<bool>(ir.score_mod);
  info_.has_mask_mod = static_cast<bool>(ir.mask_mod);
  if (options.gradient) {
    info_.has_grad = true;
    for (const GradScatter& sc : options.gradient->scatters) info_.scatter_buffers.push_back(sc.buffer);
  }
}

CodeGenLLVM::~CodeGenLLVM() = default;

std::unique_ptr<llvm::Module> CodeGenLLVM::generate(llvm::LLVMContext& ctx, const TargetInfo& target, const std::string& prefix) {
  Impl& g = *impl_;
  auto m = std::make_unique<llvm::Module>(prefix, ctx);
  if (!target.triple.empty()) m->setTargetTriple(target.triple);
  if (!target.data_layout.empty()) m->setDataLayout(target.data_layout);
  llvm::Type* void_t = llvm::Type::getVoidTy(ctx);
  llvm::Type* i32 = llvm::Type::getInt32Ty(ctx);
  llvm::Type* i8 = llvm::Type::getInt8Ty(ctx);
  llvm::Type* f32 = llvm::Type::getFloatTy(ctx);
  const std::vector<std::pair<const char*, ArgKind>> row_args = {
      {"p", ArgKind::Params}, {"b", ArgKind::Index}, {"h", ArgKind::Index}, {"hkv", ArgKind::Index}, {"q", ArgKind::Index}};
  auto with = [&](std::vector<std::pair<const char*, ArgKind>> extra) {
    std::vector<std::pair<const char*, ArgKind>> a = row_args;
    a.insert(a.end(), extra.begin(), extra.end());
    return a;
  };
  auto bind_row = [&](FnEmitter& em, llvm::Function* f) {
    em.p = f->getArg(0);
    em.b = f->getArg(1);
    em.h = f->getArg(2);
    em.hkv = f->getArg(3);
    em.q = f->getArg(4);
  };
  std::vector<std::string> names;

  // Row and tile stage functions: straight-line code filling their slots.
  for (Stage stage : {Stage::Row, Stage::Tile}) {
    bool tile = stage == Stage::Tile;
    std::string name = prefix + (tile ? "_tile" : "_row");
    llvm::Function* f = make_function(*m, target, name, void_t,
                                      tile ? with({{"k0", ArgKind::Index}, {"state", ArgKind::StateOut}}) : with({{"state", ArgKind::StateOut}}));
    llvm::BasicBlock* entry = llvm::BasicBlock::Create(ctx, "entry", f);
    llvm::IRBuilder<> eb(entry);
    llvm::Instruction* ret = eb.CreateRetVoid();
    FnEmitter em(g, *m, stage, ret, entry);
    em.set_vector_isas(target.vector_math_isas);
    em.body().SetInsertPoint(ret);
    bind_row(em, f);
    if (tile) em.k0 = f->getArg(5);
    em.state = f->getArg(tile ? 6 : 5);
    for (size_t i = 0; i < g.staged.values.size(); ++i) {
      const HoistedValue& v = g.staged.values[i];
      if (v.stage != stage) continue;
      llvm::Value* val = em.value(v.expr);
      em.store_value(em.body(), v.expr, val, g.slots[i], nullptr);
      if (g.slots[i].flags_offset >= 0) {
        llvm::Value* bits = em.flags(v.expr);
        em.set_leaf_flags(v.expr, bits);
        em.store_flags(em.body(), bits, g.slots[i], nullptr);
      }
    }
    names.push_back(name);
  }

  // Column stage: a loop over j in [0, ncols).
  {
    std::string name = prefix + "_col";
    llvm::Function* f = make_function(*m, target, name, void_t, with({{"ncols", ArgKind::Count}, {"state", ArgKind::StateOut}}));
    FnShape s = make_loop(f, f->getArg(5), /*returns_bits=*/false);
    FnEmitter em(g, *m, Stage::Col, s.entry_end, s.body);
    em.set_vector_isas(target.vector_math_isas);
    bind_row(em, f);
    em.j = s.j;
    em.state = f->getArg(6);
    for (size_t i = 0; i < g.staged.values.size(); ++i) {
      const HoistedValue& v = g.staged.values[i];
      if (v.stage != Stage::Col) continue;
      em.store_value(em.body(), v.expr, em.value(v.expr), g.slots[i], s.j);
      if (g.slots[i].flags_offset >= 0) {
        llvm::Value* bits = em.flags(v.expr);
        em.set_leaf_flags(v.expr, bits);
        em.store_flags(em.body(), bits, g.slots[i], s.j);
      }
    }
    finish_loop(s, em.body(), f->getArg(5), nullptr);
    names.insert(names.begin() + 1, name);
  }

  // score: scores[j] = keep[j] ? score_mod(scores[j]) : -inf.
  {
    std::string name = prefix + "_score";
    llvm::Function* f = make_function(*m, target, name, i32,
                                      with({{"k0", ArgKind::Index}, {"n", ArgKind::Count}, {"scores", ArgKind::Scores}, {"keep", ArgKind::KeepIn},
                                            {"state", ArgKind::State}}));
    FnShape s = make_loop(f, f->getArg(6), /*returns_bits=*/true);
    FnEmitter em(g, *m, Stage::Element, s.entry_end, s.body);
    em.set_vector_isas(target.vector_math_isas);
    bind_row(em, f);
    em.k0 = f->getArg(5);
    em.j = s.j;
    em.state = f->getArg(9);
    llvm::IRBuilder<>& bb = em.body();
    llvm::Value* sp = bb.CreateGEP(f32, f->getArg(7), s.j);
    em.score = bb.CreateLoad(f32, sp);
    llvm::Value* keep = bb.CreateICmpNE(bb.CreateLoad(i8, bb.CreateGEP(i8, f->getArg(8), s.j)), llvm::ConstantInt::get(i8, 0));
    llvm::Value* out = em.score;
    llvm::Value* bits = llvm::ConstantInt::get(i32, 0);
    if (g.staged.score_mod) {
      out = em.value(g.staged.score_mod);
      bits = em.flags(g.staged.score_mod);
    }
    bb.CreateStore(bb.CreateSelect(keep, out, llvm::ConstantFP::getInfinity(f32, /*Negative=*/true)), sp);
    llvm::Value* acc = s.acc;
    if (!llvm::isa<llvm::Constant>(bits)) acc = bb.CreateOr(acc, bb.CreateSelect(keep, bits, llvm::ConstantInt::get(i32, 0)));
    finish_loop(s, bb, f->getArg(6), acc);
    names.push_back(name);
  }

  // mask: keep[j] = mask_mod(k0 + j).
  {
    std::string name = prefix + "_mask";
    llvm::Function* f = make_function(*m, target, name, i32,
                                      with({{"k0", ArgKind::Index}, {"n", ArgKind::Count}, {"keep", ArgKind::KeepOut}, {"state", ArgKind::State}}));
    FnShape s = make_loop(f, f->getArg(6), /*returns_bits=*/true);
    FnEmitter em(g, *m, Stage::Element, s.entry_end, s.body);
    em.set_vector_isas(target.vector_math_isas);
    bind_row(em, f);
    em.k0 = f->getArg(5);
    em.j = s.j;
    em.state = f->getArg(8);
    llvm::IRBuilder<>& bb = em.body();
    llvm::Value* keep = bb.getTrue();
    llvm::Value* bits = llvm::ConstantInt::get(i32, 0);
    if (g.staged.mask_mod) {
      keep = em.value(g.staged.mask_mod);
      bits = em.flags(g.staged.mask_mod);
    }
    bb.CreateStore(bb.CreateZExt(keep, i8), bb.CreateGEP(i8, f->getArg(7), s.j));
    llvm::Value* acc = s.acc;
    if (!llvm::isa<llvm::Constant>(bits) || !llvm::cast<llvm::Constant>(bits)->isNullValue()) acc = bb.CreateOr(acc, bits);
    finish_loop(s, bb, f->getArg(6), acc);
    names.push_back(name);
  }

  // grad: d_score[j] = d score_mod / d score, coef[s * tile + j] and offset[s * tile + j] for
  // scatter s, at the pre-mod scores[j] (mod_abi.h).
  if (const ScoreModGradient* grad = g.opt.gradient) {
    std::string name = prefix + "_grad";
    llvm::Type* i64 = llvm::Type::getInt64Ty(ctx);
    llvm::Function* f = make_function(*m, target, name, void_t,
                                      with({{"k0", ArgKind::Index}, {"n", ArgKind::Count}, {"scores", ArgKind::ScoresIn}, {"state", ArgKind::State},
                                            {"d_score", ArgKind::Out}, {"coef", ArgKind::Out}, {"offset", ArgKind::Out}}));
    FnShape s = make_loop(f, f->getArg(6), /*returns_bits=*/false);
    FnEmitter em(g, *m, Stage::Element, s.entry_end, s.body);
    em.set_vector_isas(target.vector_math_isas);
    bind_row(em, f);
    em.k0 = f->getArg(5);
    em.j = s.j;
    em.state = f->getArg(8);
    llvm::IRBuilder<>& bb = em.body();
    em.score = bb.CreateLoad(f32, bb.CreateGEP(f32, f->getArg(7), s.j));
    bb.CreateStore(em.value(grad->d_score), bb.CreateGEP(f32, f->getArg(9), s.j));
    const int64_t tile = g.opt.tile_size;
    for (size_t i = 0; i < grad->scatters.size(); ++i) {
      const GradScatter& sc = grad->scatters[i];
      llvm::Value* at = bb.CreateAdd(s.j, llvm::ConstantInt::get(i64, static_cast<uint64_t>(i) * static_cast<uint64_t>(tile)));
      bb.CreateStore(em.value(sc.coefficient), bb.CreateGEP(f32, f->getArg(10), at));
      bb.CreateStore(em.resolved_offset(sc.buffer, sc.indices), bb.CreateGEP(i64, f->getArg(11), at));
    }
    finish_loop(s, bb, f->getArg(6), nullptr);
    names.push_back(name);
  }

  std::string err;
  llvm::raw_string_ostream os(err);
  if (llvm::verifyModule(*m, &os)) throw std::logic_error("flexjit internal error: generated LLVM IR does not verify: " + os.str());
  info_.function_names = names;  // row, col, tile, score, mask[, grad]
  info_.loads = g.sites;
  return m;
}

}  // namespace flexjit::cpu
