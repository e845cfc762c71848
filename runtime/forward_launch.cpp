#include "runtime/forward_launch.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cmath>
#include <cstring>

#include "compiler/interpreter.h"
#include "dsl/error.h"
#include "kernels_templates/flex_int_divisor.cuh"
#include "runtime/device.h"

namespace flexjit::runtime {

namespace {

void check_tensor(const Tensor& t, const char* name, size_t rank) {
  if (!t.data) throw Error(fmt::format("{} has no data pointer", name));
  if (t.shape.size() != rank) throw Error(fmt::format("{} must have {} dimensions, but has {}", name, rank, t.shape.size()));
  if (!t.strides.empty() && t.strides.size() != rank)
    throw Error(fmt::format("{} has {} strides for {} dimensions", name, t.strides.size(), rank));
  for (size_t i = 0; i < rank; ++i)
    if (t.shape[i] < 1) throw Error(fmt::format("{} dimension {} is {}; every dimension must be at least 1", name, i, t.shape[i]));
  check_addressable(t, name);
}

// Every launch runs these checks: they build no vectors or strings unless they throw.
void check_gpu_layout(const Tensor& t, const char* name) {
  const size_t rank = t.shape.size();
  const int64_t last = t.stride(rank - 1);
  if (last != 1) throw Error(fmt::format("{} must be contiguous in its last dimension (stride 1), but its stride is {}", name, last));
  for (size_t i = 0; i + 1 < rank; ++i)
    if (t.stride(i) % 8 != 0)
      throw Error(fmt::format("{} stride {} is {} elements; the GPU kernel needs strides that are multiples of 8 elements (16 bytes)", name,
                              i, t.stride(i)));
  if (reinterpret_cast<uintptr_t>(t.data) % 16 != 0) throw Error(fmt::format("{} must be 16-byte aligned", name));
}

}  // namespace

// Throws when `t`'s elements span more bytes than a pointer offset can hold: such shapes and
// strides come from a caller's bug, and no launch may compute addresses from them. Other
// mistakes (ranks, dims below 1, missing data) are the launch's to report.
bool is_addressable(const Tensor& t) {
  constexpr __int128 kLimit = __int128{1} << 62;
  const size_t rank = t.shape.size();
  if (!t.data || (!t.strides.empty() && t.strides.size() != rank)) return true;
  for (int64_t n : t.shape)
    if (n < 1) return true;
  __int128 contiguous = 1, reach = 0;
  for (size_t i = rank; i-- > 0;) {
    const __int128 s = t.strides.empty() ? contiguous : t.strides[i];
    reach += (s < 0 ? -s : s) * (t.shape[i] - 1);
    if (reach > kLimit / 8) return false;
    contiguous = std::min(contiguous * t.shape[i], kLimit);
  }
  return true;
}

void check_addressable(const Tensor& t, const std::string& name) {
  if (is_addressable(t)) return;
  throw Error(fmt::format("{} has shape [{}] and strides [{}]: its elements lie further apart than any memory; check them", name,
                          fmt::join(t.shape, ", "), t.strides.empty() ? "contiguous" : fmt::format("{}", fmt::join(t.strides, ", "))));
}

LaunchShape validate_operands(const dsl::Spec& spec, const AttentionArgs& a, bool gpu) {
  check_tensor(a.q, "q", 4);
  check_tensor(a.k, "k", 4);
  check_tensor(a.v, "v", 4);
  check_tensor(a.o, "o", 4);
  LaunchShape s{a.q.shape[0], a.q.shape[1], a.k.shape[1], a.q.shape[2], a.k.shape[2], a.q.shape[3], a.v.shape[3]};
  auto expect = [](const Tensor& t, const char* name, std::initializer_list<int64_t> want, const char* layout) {
    if (!std::equal(t.shape.begin(), t.shape.end(), want.begin(), want.end()))
      throw Error(fmt::format("{} has shape [{}] but must be {} = [{}]", name, fmt::join(t.shape, ", "), layout, fmt::join(want, ", ")));
  };
  if (a.k.shape[0] != s.batch) throw Error(fmt::format("k has batch {} but q has {}", a.k.shape[0], s.batch));
  if (s.head_dim != spec.head_dim)
    throw Error(fmt::format("q has head dim {} but the spec was compiled for {}; set head_dim in the spec", s.head_dim, spec.head_dim));
  expect(a.k, "k", {s.batch, s.kv_heads, s.seqlen_kv, s.head_dim}, "[B, Hkv, Skv, D]");
  if (s.head_dim_v != spec.value_head_dim())
    throw Error(fmt::format("v has head dim {} but the spec says {}", s.head_dim_v, spec.value_head_dim()));
  expect(a.v, "v", {s.batch, s.kv_heads, s.seqlen_kv, s.head_dim_v}, "[B, Hkv, Skv, Dv]");
  expect(a.o, "o", {s.batch, s.heads, s.seqlen_q, s.head_dim_v}, "[B, H, Sq, Dv]");
  if (s.heads % s.kv_heads != 0)
    throw Error(fmt::format("q has {} heads and k/v {}: the query heads must be a multiple of the KV heads (GQA)", s.heads, s.kv_heads));
  if (spec.gqa_group && s.heads / s.kv_heads != spec.gqa_group)
    throw Error(fmt::format("the spec fixes gqa_group = {} but the launch has {} / {} heads", spec.gqa_group, s.heads, s.kv_heads));
  for (const auto* t : {&a.q, &a.k, &a.v, &a.o})
    if (t->dtype != spec.dtype)
      throw Error(fmt::format("q, k, v and o must all be {} (the spec's dtype), but one is {}", dsl::dtype_name(spec.dtype),
                              dsl::dtype_name(t->dtype)));
  if (a.lse.data) {
    check_tensor(a.lse, "lse", 3);
    expect(a.lse, "lse", {s.batch, s.heads, s.seqlen_q}, "[B, H, Sq]");
    if (a.lse.dtype != dsl::DType::F32) throw Error("lse must be f32");
    if (a.lse.stride(2) != 1) throw Error("lse must be contiguous in its last dimension");
  }
  for (int64_t v : {s.batch, s.heads, s.seqlen_q, s.seqlen_kv})
    if (v > INT32_MAX) throw Error("B, H, Sq and Skv must each be below 2^31");
  if (gpu) {
    check_gpu_layout(a.q, "q");
    check_gpu_layout(a.k, "k");
    check_gpu_layout(a.v, "v");
    check_gpu_layout(a.o, "o");
  }
  if (!(a.scale >= 0) || std::isinf(a.scale)) throw Error(fmt::format("scale must be a finite number >= 0 (0 means 1/sqrt(D)), got {}", a.scale));
  mods_shape(s, window_of(a));
  return s;
}

SequenceWindow window_of(const AttentionArgs& a) { return {a.q_offset, a.kv_offset, a.seqlen_q, a.seqlen_kv}; }
SequenceWindow window_of(const BackwardArgs& a) { return {a.q_offset, a.kv_offset, a.seqlen_q, a.seqlen_kv}; }

LaunchShape mods_shape(const LaunchShape& local, const SequenceWindow& w) {
  LaunchShape s = local;
  auto side = [](int64_t offset, int64_t length, int64_t rows, const char* offset_name, const char* length_name, const char* tensor) {
    if (offset < 0)
      throw Error(fmt::format("{} is {}; it is the position of {}'s first row in the whole sequence and must be >= 0", offset_name, offset,
                              tensor));
    if (length < 0)
      throw Error(fmt::format("{} is {}; it is the whole sequence's length (0: {}'s own {} rows) and must be >= 0", length_name, length, tensor,
                              rows));
    const int64_t whole = length ? length : rows;
    if (offset > whole - rows)
      throw Error(fmt::format("{} ({}) + the {} rows of {} exceed {} = {}{}: a shard must lie inside the sequence; set {} to the whole "
                              "sequence's length or correct the offset",
                              offset_name, offset, rows, tensor, length_name, whole, length ? "" : fmt::format(" ({}'s own rows)", tensor),
                              length_name));
    if (whole > INT32_MAX) throw Error(fmt::format("{} is {}; the whole sequence's lengths must be below 2^31", length_name, whole));
    return whole;
  };
  s.seqlen_q = side(w.q_offset, w.seqlen_q, local.seqlen_q, "q_offset", "seqlen_q", "q");
  s.seqlen_kv = side(w.kv_offset, w.seqlen_kv, local.seqlen_kv, "kv_offset", "seqlen_kv", "k");
  return s;
}

std::vector<Tensor> collect_buffers(const dsl::Spec& spec, const AttentionArgs& a, const std::vector<Tensor>& bound) {
  std::vector<Tensor> out(spec.buffers.size());
  for (const auto& [name, t] : a.buffers) {
    int idx = -1;
    for (size_t i = 0; i < spec.buffers.size(); ++i)
      if (spec.buffers[i].name == name) idx = static_cast<int>(i);
    if (idx < 0) {
      std::vector<std::string> names;
      for (const auto& b : spec.buffers) names.push_back(b.name);
      auto guess = dsl::closest_name(name, names);
      throw Error(fmt::format("buffer `{}` is not declared by spec `{}`{}", name, spec.name, guess ? fmt::format("; did you mean `{}`?", *guess) : ""));
    }
    out[idx] = t;
  }
  for (size_t i = 0; i < spec.buffers.size(); ++i) {
    const dsl::BufferDecl& d = spec.buffers[i];
    if (!out[i].data && i < bound.size()) out[i] = bound[i];
    if (!out[i].data) throw Error(fmt::format("buffer `{}` ({}) was not given and is not bound for this device", d.name, d.str()));
    if (out[i].dtype != d.dtype)
      throw Error(fmt::format("buffer `{}` is declared {} but the given tensor is {}", d.name, d.str(), dsl::dtype_name(out[i].dtype)));
    if (!out[i].strides.empty() && out[i].strides.size() != out[i].shape.size())
      throw Error(fmt::format("buffer `{}` has {} strides for {} dimensions", d.name, out[i].strides.size(), out[i].shape.size()));
    if (!is_addressable(out[i])) check_addressable(out[i], fmt::format("buffer `{}`", d.name));
  }
  return out;
}

BoundValues bind_launch(const dsl::CheckedSpec& cs, const LaunchShape& s, const std::vector<Tensor>& buffers, const AttentionArgs& a) {
  // The six standard symbols come first in every symbol table (collect_symbols).
  BindingInputs in;
  in.symbols = {s.batch, s.heads, s.kv_heads, s.seqlen_q, s.seqlen_kv, s.head_dim};
  in.symbols.resize(cs.symbols.size());
  in.params.resize(cs.spec.params.size());
  for (const auto& [name, v] : a.params) {
    const dsl::ParamDecl* p = cs.spec.find_param(name);
    if (!p) {
      std::vector<std::string> names;
      for (const auto& q : cs.spec.params) names.push_back(q.name);
      auto guess = dsl::closest_name(name, names);
      throw Error(fmt::format("parameter `{}` is not declared by spec `{}`{}", name, cs.spec.name, guess ? fmt::format("; did you mean `{}`?", *guess) : ""));
    }
    Value val;
    if (p->type == dsl::ValueType::Int) {
      if (v != std::floor(v) || std::abs(v) > 9.0e15) throw Error(fmt::format("parameter `{}` is an int but was given {}", name, v));
      val = Value::of_int(static_cast<int64_t>(v));
    } else if (p->type == dsl::ValueType::Bool) {
      val = Value::of_bool(v != 0);
    } else {
      val = Value::of_float(static_cast<float>(v));
    }
    in.params[static_cast<size_t>(p - cs.spec.params.data())] = val;
  }
  in.buffer_shapes.reserve(buffers.size());
  for (const Tensor& t : buffers) in.buffer_shapes.emplace_back(t.shape);
  BoundValues values = bind_typed(cs, in, /*require_all=*/true);
  for (size_t i = 0; i < buffers.size() && i < 64; ++i) {
    const Tensor& t = buffers[i];
    if (!t.shape.empty() && (t.shape.back() == 1 || t.stride(t.shape.size() - 1) == 1)) values.unit_inner_stride |= 1ull << i;
  }
  return values;
}

std::string VariantChoice::key() const {
  std::string k = fmt::format("i{}_c{:x}_u{:x}{}_s{}{}", int32 ? 32 : 64, checked_loads, unit_inner_stride, tma ? "" : "_notma",
                              static_cast<int>(runtime_split), shard ? "_shard" : "");
  for (const auto& [index, value] : specialized) k += fmt::format("_p{}={}", index, value);
  return k;
}

VariantChoice choose_variant(const RangeInfo& ranges, const dsl::CheckedSpec& cs, const BoundValues& values) {
  VariantChoice c;
  EvalEnv env;
  env.symbols = values.symbols;
  env.params = values.params;
  (void)cs;
  for (size_t i = 0; i < ranges.loads.size() && i < 64; ++i) {
    const LoadCheck& lc = ranges.loads[i];
    if (lc.status != LoadCheck::Status::Conditional) continue;
    if (!evaluate(lc.obligation, env).b) c.checked_loads |= 1ull << i;
  }
  if (ranges.int32_obligation) c.int32 = evaluate(ranges.int32_obligation, env).b;
  c.unit_inner_stride = values.unit_inner_stride;
  return c;
}

void check_packed_operand(const Tensor& t, const char* what, const char* name, int64_t heads, int64_t dim, DType dtype) {
  if (!t.data) throw Error(fmt::format("{}: {} has no data pointer", what, name));
  if (t.shape.size() != 3) throw Error(fmt::format("{}: {} must be [total, heads, dim], but has {} dimensions", what, name, t.shape.size()));
  if (!t.strides.empty() && t.strides.size() != 3) throw Error(fmt::format("{}: {} has {} strides for 3 dimensions", what, name, t.strides.size()));
  if (t.shape[1] != heads || t.shape[2] != dim)
    throw Error(fmt::format("{}: {} has shape [{}] but must be [total, {}, {}]", what, name, fmt::join(t.shape, ", "), heads, dim));
  if (t.dtype != dtype)
    throw Error(fmt::format("{}: {} must be {} ({}), got {}", what, name, dsl::dtype_name(dtype), is_fp8(dtype) ? "the FP8 format of k" : "the spec's dtype",
                            dsl::dtype_name(t.dtype)));
  check_addressable(t, fmt::format("{}: {}", what, name));
  std::vector<int64_t> s = t.effective_strides();
  if (s[2] != 1) throw Error(fmt::format("{}: {} must be contiguous in its last dimension", what, name));
  if (s[0] % 8 != 0 || s[1] % 8 != 0) throw Error(fmt::format("{}: {} strides must be multiples of 8 elements (16 bytes)", what, name));
  if (reinterpret_cast<uintptr_t>(t.data) % 16 != 0) throw Error(fmt::format("{}: {} must be 16-byte aligned", what, name));
}

int64_t check_cu_seqlens(const Tensor& cu_q, const Tensor& cu_kv, const char* what) {
  for (const Tensor* t : {&cu_q, &cu_kv}) {
    const char* name = t == &cu_q ? "cu_seqlens_q" : "cu_seqlens_kv";
    if (!t->data || t->dtype != DType::I32 || t->shape.size() != 1 || t->shape[0] < 2 || (!t->strides.empty() && t->strides[0] != 1))
      throw Error(fmt::format("{}: {} must be a contiguous i32 [B + 1] tensor with B >= 1", what, name));
  }
  if (cu_q.shape[0] != cu_kv.shape[0]) throw Error(fmt::format("{}: cu_seqlens_q and cu_seqlens_kv must have the same length", what));
  return cu_q.shape[0] - 1;
}

int64_t check_kv_scale(const Tensor& t, const char* what, const char* name, int64_t kv_heads, int device) {
  if (t.dtype != DType::F32 || t.shape.size() != 1 || (t.shape[0] != kv_heads && t.shape[0] != 1))
    throw Error(fmt::format("{}: {} must be an f32 tensor of shape [{}] (one scale per KV head) or [1], got {} [{}]", what, name, kv_heads,
                            dsl::dtype_name(t.dtype), fmt::join(t.shape, ", ")));
  if (!t.strides.empty() && t.shape[0] > 1 && t.strides[0] != 1) throw Error(fmt::format("{}: {} must be contiguous", what, name));
  if (device >= 0 && pointer_device(t.data) != device)
    throw Error(fmt::format("{}: {} is not memory of cuda:{} (the launch's device)", what, name, device));
  return t.shape[0] == 1 ? 0 : 1;
}

std::vector<uint64_t> fill_variant_params(const ParamsLayout& layout, const std::vector<Tensor>& buffers, const BoundValues& values,
                                          unsigned int* error_word) {
  std::vector<uint64_t> slots(layout.slots.size(), 0);
  for (size_t i = 0; i < layout.slots.size(); ++i) {
    const ParamSlot& s = layout.slots[i];
    uint64_t& out = slots[i];
    switch (s.kind) {
      case SlotKind::ErrorFlags: out = reinterpret_cast<uint64_t>(error_word); break;
      case SlotKind::BufferData: out = reinterpret_cast<uint64_t>(buffers[s.index].data); break;
      case SlotKind::BufferStride: out = static_cast<uint64_t>(buffers[s.index].effective_strides()[s.dim]); break;
      case SlotKind::BufferExtent: out = static_cast<uint64_t>(buffers[s.index].shape[s.dim]); break;
      case SlotKind::Symbol: out = static_cast<uint64_t>(values.symbols[s.index]); break;
      case SlotKind::IntParam: out = static_cast<uint64_t>(values.params[s.index].i); break;
      case SlotKind::IntParamDivisor: out = fj::divisor_magic(values.params[s.index].i); break;
      case SlotKind::IntParamInt32: {
        const int64_t v = std::clamp<int64_t>(values.params[s.index].i, INT32_MIN, INT32_MAX);
        out = static_cast<uint32_t>(static_cast<int32_t>(v));
        break;
      }
      case SlotKind::BoolParam: out = values.params[s.index].b ? 1 : 0; break;
      case SlotKind::FloatParam:
      case SlotKind::FloatParamReciprocal: {
        float f = s.kind == SlotKind::FloatParam ? values.params[s.index].f : 1.f / values.params[s.index].f;
        uint32_t bits;
        std::memcpy(&bits, &f, 4);
        out = bits;
        break;
      }
    }
  }
  return slots;
}

}  // namespace flexjit::runtime
