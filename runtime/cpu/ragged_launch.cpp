#include "runtime/cpu/ragged_launch.h"

#include <fmt/format.h>

#include <array>
#include <cmath>
#include <cstring>

#include "dsl/error.h"
#include "runtime/cpu/backward_launch.h"
#include "runtime/forward_launch.h"
#include "runtime/npy.h"

namespace flexjit::cpu {

namespace {

const char* byte_at(const void* base, int64_t elements, dsl::DType t) {
  return static_cast<const char*>(base) + elements * static_cast<int64_t>(dsl::dtype_size(t));
}

void require(bool ok, const std::string& what, const std::string& message) {
  if (!ok) throw Error(fmt::format("{} (CPU): {}", what, message));
}

// A tensor of the given rank and dtype with data and one stride per dimension (or none).
void check_tensor(const std::string& what, const Tensor& t, const char* name, size_t rank, dsl::DType dtype) {
  require(t.data != nullptr, what, fmt::format("`{}` has no data; pass a host-memory tensor", name));
  require(t.shape.size() == rank, what, fmt::format("`{}` has {} dimensions but must have {}", name, t.shape.size(), rank));
  require(t.strides.empty() || t.strides.size() == t.shape.size(), what,
          fmt::format("`{}` has {} strides for {} dimensions; give one per dimension or none (contiguous)", name, t.strides.size(), t.shape.size()));
  runtime::check_addressable(t, fmt::format("{}: `{}`", what, name));
  require(t.dtype == dtype, what, fmt::format("`{}` is {} but must be {}", name, dsl::dtype_name(t.dtype), dsl::dtype_name(dtype)));
  for (int64_t e : t.shape) require(e >= 0, what, fmt::format("`{}` has a negative extent", name));
}

void expect_shape(const std::string& what, const Tensor& t, const char* name, const std::vector<int64_t>& want, const char* layout) {
  require(t.shape == want, what, fmt::format("`{}` has shape [{}] but must be {} = [{}]", name, fmt::join(t.shape, ", "), layout, fmt::join(want, ", ")));
}

// The values of a host vector of `n` entries of type T (any stride).
template <class T, class Out = int64_t>
std::vector<Out> read_vector(const Tensor& t, int64_t n) {
  std::vector<Out> out(static_cast<size_t>(n));
  int64_t st = t.effective_strides().empty() ? 1 : t.effective_strides()[0];
  for (int64_t i = 0; i < n; ++i) out[static_cast<size_t>(i)] = static_cast<const T*>(t.data)[i * st];
  return out;
}
std::vector<int64_t> read_i32(const Tensor& t, int64_t n) { return read_vector<int32_t>(t, n); }

bool is_fp8(dsl::DType t) { return t == dsl::DType::F8E4M3 || t == dsl::DType::F8E5M2; }

// The plan's KV cache element type, checked as the GPU's plan_decode does: the spec's dtype
// (the default), or an FP8 type.
dsl::DType plan_kv_dtype(const std::string& what, const DecodePlanOptions& plan, dsl::DType spec_dtype) {
  if (!plan.kv_dtype) return spec_dtype;
  require(is_fp8(*plan.kv_dtype) || *plan.kv_dtype == spec_dtype, what,
          fmt::format("the plan's kv_dtype {} is not supported for a {} spec; use {} (the spec's dtype), f8e4m3 or f8e5m2",
                      dsl::dtype_name(*plan.kv_dtype), dsl::dtype_name(spec_dtype), dsl::dtype_name(spec_dtype)));
  return *plan.kv_dtype;
}

// One dequantisation scale per KV head for K and for V.
struct KvScales {
  std::vector<float> k, v;
};

// An FP8 launch's optional k_scale and v_scale (f32 [Hkv] or [1], both the same shape; absent =
// 1), one entry per KV head. Empty when K and V are not FP8: they take no scales, and `no_scales`
// says why (after "`k_scale` is only for ").
KvScales kv_scales(const std::string& what, const Tensor& k_scale, const Tensor& v_scale, dsl::DType kv_dtype, int64_t Hkv,
                   const std::string& no_scales) {
  auto per_head = [&](const Tensor& t, const char* name) {
    if (!t.data) return is_fp8(kv_dtype) ? std::vector<float>(static_cast<size_t>(Hkv), 1.0f) : std::vector<float>{};
    require(is_fp8(kv_dtype), what, fmt::format("`{}` is only for {}", name, no_scales));
    require(t.dtype == dsl::DType::F32 && t.shape.size() == 1 && (t.shape[0] == Hkv || t.shape[0] == 1), what,
            fmt::format("`{}` must be an f32 tensor of shape [{}] (one scale per KV head) or [1], got {} [{}]", name, Hkv, dsl::dtype_name(t.dtype),
                        fmt::join(t.shape, ", ")));
    check_tensor(what, t, name, 1, dsl::DType::F32);
    std::vector<float> s = read_vector<float, float>(t, t.shape[0]);
    return t.shape[0] == Hkv ? s : std::vector<float>(static_cast<size_t>(Hkv), s[0]);
  };
  KvScales out{per_head(k_scale, "k_scale"), per_head(v_scale, "v_scale")};
  require(!k_scale.data || !v_scale.data || k_scale.shape == v_scale.shape, what,
          fmt::format("k_scale has shape [{}] and v_scale [{}]: they must have the same shape ([Hkv] or [1])", fmt::join(k_scale.shape, ", "),
                      fmt::join(v_scale.shape, ", ")));
  return out;
}

// How a launch reads K and V: their element type and, for FP8, the value of every bit pattern.
struct KvFormat {
  explicit KvFormat(dsl::DType t) : dtype(t), fp8(is_fp8(t)) {
    if (fp8)
      for (int i = 0; i < 256; ++i) values[static_cast<size_t>(i)] = fp8_to_float(static_cast<uint8_t>(i), t);
  }
  dsl::DType dtype;
  bool fp8;
  std::array<float, 256> values{};
};

// Copies rows [0, len) of every KV head of one sequence into dense [Hkv, len, d]: the elements as
// they are, or FP8 ones dequantised to f32 (scale[h] * value), the one place the CPU reads FP8 K
// and V. Row p of head h starts at element row_start(p, h) of t; its d elements are `elem_stride` apart.
template <class RowStart>
void gather_rows(const KvFormat& f, const Tensor& t, const std::vector<float>& scale, int64_t Hkv, int64_t len, int64_t d, int64_t elem_stride,
                 RowStart&& row_start, std::vector<char>& out) {
  const size_t esize = static_cast<size_t>(dsl::dtype_size(f.dtype)), out_size = f.fp8 ? sizeof(float) : esize;
  out.resize(static_cast<size_t>(Hkv * len * d) * out_size);
  for (int64_t p = 0; p < len; ++p)
    for (int64_t h = 0; h < Hkv; ++h) {
      const int64_t base = row_start(p, h);
      char* dst = out.data() + static_cast<size_t>((h * len + p) * d) * out_size;
      if (f.fp8) {
        const uint8_t* src = static_cast<const uint8_t*>(t.data) + base;
        for (int64_t c = 0; c < d; ++c) reinterpret_cast<float*>(dst)[c] = scale[static_cast<size_t>(h)] * f.values[src[c * elem_stride]];
      } else {
        for (int64_t c = 0; c < d; ++c) std::memcpy(dst + static_cast<size_t>(c) * esize, byte_at(t.data, base + c * elem_stride, f.dtype), esize);
      }
    }
}

void check_head_dims(const std::string& what, const dsl::Spec& spec, int64_t H, int64_t Hkv, int64_t D, int64_t Dv) {
  require(D == spec.head_dim, what, fmt::format("q has head dim {} but the spec was compiled for {}; set head_dim in the spec", D, spec.head_dim));
  require(Dv == spec.value_head_dim(), what, fmt::format("v has head dim {} but the spec says {}", Dv, spec.value_head_dim()));
  require(Hkv > 0 && H % Hkv == 0, what,
          fmt::format("q has {} heads and k/v {}: the query heads must be a multiple of the KV heads (GQA)", H, Hkv));
  require(!spec.gqa_group || H / Hkv == spec.gqa_group, what,
          fmt::format("the spec fixes gqa_group = {} but the launch has {} / {} heads", spec.gqa_group, H, Hkv));
}

float scale_for(const std::string& what, float scale, int64_t D) {
  require(scale >= 0 && !std::isinf(scale), what, fmt::format("scale must be a finite number >= 0 (0 means 1/sqrt(D)), got {}", scale));
  return scale > 0 ? scale : static_cast<float>(1.0 / std::sqrt(static_cast<double>(D)));
}

// The sequences of a ragged batch: cu_seqlens_q and cu_seqlens_kv read and checked (i32 [B + 1],
// starting at 0, non-decreasing, every length within its bound, the last entry within the packed
// rows). A sequence outside them is an error on the CPU, which checks on the host before any work.
struct RaggedBatch {
  int64_t B = 0;
  std::vector<int64_t> cq, ck;
};

RaggedBatch ragged_batch(const std::string& what, const Tensor& cu_seqlens_q, const Tensor& cu_seqlens_kv, int64_t total_q, int64_t total_kv,
                         int max_seqlen_q, int max_seqlen_kv) {
  check_tensor(what, cu_seqlens_q, "cu_seqlens_q", 1, dsl::DType::I32);
  check_tensor(what, cu_seqlens_kv, "cu_seqlens_kv", 1, dsl::DType::I32);
  const int64_t B = cu_seqlens_q.shape[0] - 1;
  require(B >= 0 && cu_seqlens_kv.shape[0] == B + 1, what,
          fmt::format("cu_seqlens_q has {} entries and cu_seqlens_kv {}: both must be [B + 1]", cu_seqlens_q.shape[0], cu_seqlens_kv.shape[0]));
  RaggedBatch rb{B, read_i32(cu_seqlens_q, B + 1), read_i32(cu_seqlens_kv, B + 1)};
  for (auto [name, cu, total, bound] : {std::tuple{"cu_seqlens_q", &rb.cq, total_q, int64_t{max_seqlen_q}},
                                        std::tuple{"cu_seqlens_kv", &rb.ck, total_kv, int64_t{max_seqlen_kv}}}) {
    require((*cu)[0] == 0, what, fmt::format("{}[0] is {} but must be 0", name, (*cu)[0]));
    for (int64_t b = 0; b < B; ++b) {
      int64_t len = (*cu)[static_cast<size_t>(b + 1)] - (*cu)[static_cast<size_t>(b)];
      require(len >= 0, what, fmt::format("{} decreases at sequence {} ({} then {}); it must be non-decreasing", name, b, (*cu)[static_cast<size_t>(b)],
                                          (*cu)[static_cast<size_t>(b + 1)]));
      require(len <= bound, what,
              fmt::format("sequence {} has {} rows in {} but the bound (max_seqlen_{}) is {}; raise it", b, len, name, name[11] == 'q' ? "q" : "kv", bound));
    }
    require((*cu)[static_cast<size_t>(B)] <= total, what,
            fmt::format("{}[B] = {} exceeds the {} rows of the packed tensor", name, (*cu)[static_cast<size_t>(B)], total));
  }
  return rb;
}

// Runs one sequence's job per entry, in order; throws the mods' errors at the end.
class SequenceRunner {
 public:
  // queries_at_kv_end: the query positions are among the KV positions (decode; VarlenArgs::queries_at_kv_end).
  SequenceRunner(const SpecState& st, const SpecIR& ir, const runtime::LaunchShape& shape, const std::vector<Tensor>& buffers,
                 const AttentionArgs& binding, bool queries_at_kv_end)
      : st_(st), values_(runtime::bind_launch(ir.checked, shape, buffers, binding)), cfg_(settings()) {
    apply_tiles(cfg_, base_);
    mods_ = attach_mods(st_, values_, buffers, cfg_, base_, params_, queries_at_kv_end);
    driver_.threads = cfg_.threads;
    driver_.isa = choose_isa(cfg_.isa);
  }
  // A job with the mods attached and the tile sizes set.
  AttentionJob job() const { return base_; }
  void run(const AttentionJob& job) { errors_ |= run_attention(job, sparsity_of(st_, values_), driver_); }
  void finish() const {
    if (errors_ && mods_) throw Error(describe_errors(st_.ir, mods_->info, errors_));
  }

 private:
  const SpecState& st_;
  BoundValues values_;
  CpuSettings cfg_;
  AttentionJob base_;
  std::vector<uint64_t> params_;
  std::shared_ptr<const CompiledMods> mods_;
  DriverOptions driver_;
  uint32_t errors_ = 0;
};

// Rows [row0, ...) of a packed [rows, heads, d] tensor as a [1, heads, rows, d] operand.
Operand packed_rows(const Tensor& t, int64_t row0) {
  const std::vector<int64_t> s = t.effective_strides();
  return Operand{byte_at(t.data, row0 * s[0], t.dtype), {0, s[1], s[0], s[2]}};
}
OutOperand packed_out_rows(const Tensor& t, int64_t row0) {
  Operand o = packed_rows(t, row0);
  return OutOperand{const_cast<void*>(o.data), {o.stride[0], o.stride[1], o.stride[2], o.stride[3]}};
}

AttentionArgs binding_args(const std::vector<std::pair<std::string, Tensor>>& buffers, const std::vector<std::pair<std::string, double>>& params) {
  AttentionArgs fa;
  fa.buffers = buffers;
  fa.params = params;
  return fa;
}

}  // namespace

void launch_varlen(const SpecState& st, const SpecIR& ir, const VarlenArgs& a) {
  const std::string what = "ragged prefill";
  const dsl::Spec& spec = ir.spec();
  ElemType et = elem_type(spec.dtype);
  // K and V in the spec's dtype, or both in one FP8 format (k's says which) as the GPU accepts them.
  const dsl::DType kv_dtype = is_fp8(a.k.dtype) ? a.k.dtype : spec.dtype;
  const bool fp8 = is_fp8(kv_dtype);
  check_tensor(what, a.q, "q", 3, spec.dtype);
  if (a.k.data && a.v.data) {
    require(a.k.dtype == kv_dtype, what,
            fmt::format("`k` is {} but must be {} (the spec's dtype), or f8e4m3 or f8e5m2 (FP8, with v in the same format)",
                        dsl::dtype_name(a.k.dtype), dsl::dtype_name(spec.dtype)));
    require(a.v.dtype == kv_dtype, what,
            fmt::format("`k` is {} but `v` is {}: pass both in the spec's dtype ({}), or both in one FP8 format (f8e4m3 or f8e5m2)",
                        dsl::dtype_name(a.k.dtype), dsl::dtype_name(a.v.dtype), dsl::dtype_name(spec.dtype)));
  }
  check_tensor(what, a.k, "k", 3, kv_dtype);
  check_tensor(what, a.v, "v", 3, kv_dtype);
  check_tensor(what, a.o, "o", 3, spec.dtype);
  const int64_t total_q = a.q.shape[0], H = a.q.shape[1], D = a.q.shape[2], total_kv = a.k.shape[0], Hkv = a.k.shape[1], Dv = a.v.shape[2];
  check_head_dims(what, spec, H, Hkv, D, Dv);
  const std::string no_scales =
      fmt::format("an FP8 k and v (f8e4m3 or f8e5m2), but k is {}; pass k and v in FP8, or drop the scale", dsl::dtype_name(a.k.dtype));
  const KvScales kv_scale = kv_scales(what, a.k_scale, a.v_scale, kv_dtype, Hkv, no_scales);
  expect_shape(what, a.k, "k", {total_kv, Hkv, D}, "[total_kv, Hkv, D]");
  expect_shape(what, a.v, "v", {total_kv, Hkv, Dv}, "[total_kv, Hkv, Dv]");
  expect_shape(what, a.o, "o", {total_q, H, Dv}, "[total_q, H, Dv]");
  if (a.lse.data) {
    check_tensor(what, a.lse, "lse", 2, dsl::DType::F32);
    expect_shape(what, a.lse, "lse", {H, total_q}, "[H, total_q]");
  }
  const RaggedBatch rb = ragged_batch(what, a.cu_seqlens_q, a.cu_seqlens_kv, total_q, total_kv, a.max_seqlen_q, a.max_seqlen_kv);
  const int64_t B = rb.B;
  const std::vector<int64_t>&cq = rb.cq, &ck = rb.ck;
  if (a.queries_at_kv_end)
    for (int64_t b = 0; b < B; ++b) {
      const int64_t lq = cq[static_cast<size_t>(b + 1)] - cq[static_cast<size_t>(b)], lkv = ck[static_cast<size_t>(b + 1)] - ck[static_cast<size_t>(b)];
      require(lq <= lkv, what,
              fmt::format("sequence {} has {} query rows but {} KV rows: with queries_at_kv_end its queries are its last KV positions, so "
                          "it needs at least as many KV rows",
                          b, lq, lkv));
    }

  runtime::LaunchShape shape{B, H, Hkv, a.max_seqlen_q, a.max_seqlen_kv, D, Dv};
  AttentionArgs binding = binding_args(a.buffers, a.params);
  std::vector<Tensor> buffers = runtime::collect_buffers(spec, binding, {});
  SequenceRunner runner(st, ir, shape, buffers, binding, a.queries_at_kv_end);
  const float scale = scale_for(what, a.scale, D);
  std::vector<int64_t> ks = a.k.effective_strides(), vs = a.v.effective_strides();
  std::vector<int64_t> ls = a.lse.data ? a.lse.effective_strides() : std::vector<int64_t>{0, 0};
  const KvFormat kv_format(kv_dtype);
  std::vector<char> k_copy, v_copy;  // an FP8 sequence's K and V dequantised, as dense f32 [Hkv, len, d]
  for (int64_t b = 0; b < B; ++b) {
    const int64_t q0 = cq[static_cast<size_t>(b)], k0 = ck[static_cast<size_t>(b)];
    AttentionJob job = runner.job();
    job.B = 1;
    job.H = H;
    job.Hkv = Hkv;
    job.Sq = cq[static_cast<size_t>(b + 1)] - q0;
    job.Skv = ck[static_cast<size_t>(b + 1)] - k0;
    job.D = D;
    job.Dv = Dv;
    job.b_offset = b;
    if (a.queries_at_kv_end) job.q_offset = job.Skv - job.Sq;  // query row i sits at KV position Skv - Sq + i
    job.scale = scale;
    job.dtype = et;
    if (job.Sq == 0) continue;
    job.q = packed_rows(a.q, q0);
    if (fp8) {
      gather_rows(kv_format, a.k, kv_scale.k, Hkv, job.Skv, D, ks[2], [&](int64_t p, int64_t h) { return (k0 + p) * ks[0] + h * ks[1]; }, k_copy);
      gather_rows(kv_format, a.v, kv_scale.v, Hkv, job.Skv, Dv, vs[2], [&](int64_t p, int64_t h) { return (k0 + p) * vs[0] + h * vs[1]; }, v_copy);
      job.kv_f32 = true;
      job.k = Operand{k_copy.data(), {0, job.Skv * D, D, 1}};
      job.v = Operand{v_copy.data(), {0, job.Skv * Dv, Dv, 1}};
    } else {
      job.k = packed_rows(a.k, k0);
      job.v = packed_rows(a.v, k0);
    }
    job.o = packed_out_rows(a.o, q0);
    if (a.lse.data) {
      job.lse = static_cast<float*>(a.lse.data) + q0 * ls[1];
      job.lse_stride[0] = 0;
      job.lse_stride[1] = ls[0];
      job.lse_stride[2] = ls[1];
    }
    runner.run(job);
  }
  runner.finish();
}

void launch_backward_varlen(const SpecIR& ir, const BackwardSpec& bs, const VarlenBackwardArgs& a) {
  const std::string what = "ragged backward";
  const dsl::Spec& spec = ir.spec();
  elem_type(spec.dtype);
  for (auto [t, name] : {std::pair{&a.q, "q"}, std::pair{&a.k, "k"}, std::pair{&a.v, "v"}, std::pair{&a.o, "o"}, std::pair{&a.d_o, "d_o"},
                         std::pair{&a.dq, "dq"}, std::pair{&a.dk, "dk"}, std::pair{&a.dv, "dv"}})
    check_tensor(what, *t, name, 3, spec.dtype);
  const int64_t total_q = a.q.shape[0], H = a.q.shape[1], D = a.q.shape[2], total_kv = a.k.shape[0], Hkv = a.k.shape[1], Dv = a.v.shape[2];
  check_head_dims(what, spec, H, Hkv, D, Dv);
  expect_shape(what, a.k, "k", {total_kv, Hkv, D}, "[total_kv, Hkv, D]");
  expect_shape(what, a.v, "v", {total_kv, Hkv, Dv}, "[total_kv, Hkv, Dv]");
  expect_shape(what, a.o, "o", {total_q, H, Dv}, "[total_q, H, Dv]");
  expect_shape(what, a.d_o, "d_o", {total_q, H, Dv}, "[total_q, H, Dv] (the shape of o)");
  expect_shape(what, a.dq, "dq", {total_q, H, D}, "[total_q, H, D] (the shape of q)");
  expect_shape(what, a.dk, "dk", {total_kv, Hkv, D}, "[total_kv, Hkv, D] (the shape of k)");
  expect_shape(what, a.dv, "dv", {total_kv, Hkv, Dv}, "[total_kv, Hkv, Dv] (the shape of v)");
  require(a.lse.data != nullptr, what,
          fmt::format("`lse` is required: pass the [H, total_q] = [{}, {}] f32 LSE the forward wrote (set VarlenArgs::lse on forward_varlen)", H,
                      total_q));
  check_tensor(what, a.lse, "lse", 2, dsl::DType::F32);
  expect_shape(what, a.lse, "lse", {H, total_q}, "[H, total_q]");
  require(a.max_seqlen_q >= 1 && a.max_seqlen_kv >= 1, what,
          fmt::format("max_seqlen_q is {} and max_seqlen_kv {}: both must be >= 1 (the bounds of the per-sequence lengths, as the forward's)",
                      a.max_seqlen_q, a.max_seqlen_kv));
  const RaggedBatch rb = ragged_batch(what, a.cu_seqlens_q, a.cu_seqlens_kv, total_q, total_kv, a.max_seqlen_q, a.max_seqlen_kv);

  // The mods see the bounds as Sq and Skv, as in the forward.
  const runtime::LaunchShape shape{rb.B, H, Hkv, a.max_seqlen_q, a.max_seqlen_kv, D, Dv};
  AttentionArgs binding = binding_args(a.buffers, a.params);
  binding.scale = scale_for(what, a.scale, D);
  BackwardLaunch launch(ir, bs, shape, binding, a.grads);
  const std::vector<int64_t> ls = a.lse.effective_strides();
  std::vector<BackwardJob> jobs;
  for (int64_t b = 0; b < rb.B; ++b) {
    const int64_t q0 = rb.cq[static_cast<size_t>(b)], k0 = rb.ck[static_cast<size_t>(b)];
    BackwardJob job = launch.job();
    job.B = 1;
    job.Sq = rb.cq[static_cast<size_t>(b + 1)] - q0;
    job.Skv = rb.ck[static_cast<size_t>(b + 1)] - k0;
    job.b_offset = b;
    if (job.Sq == 0 && job.Skv == 0) continue;  // no rows to write (with KV rows and no queries, dk and dv are zeros)
    job.q = packed_rows(a.q, q0);
    job.o = packed_rows(a.o, q0);
    job.d_o = packed_rows(a.d_o, q0);
    job.dq = packed_out_rows(a.dq, q0);
    job.k = packed_rows(a.k, k0);
    job.v = packed_rows(a.v, k0);
    job.dk = packed_out_rows(a.dk, k0);
    job.dv = packed_out_rows(a.dv, k0);
    job.lse = static_cast<const float*>(a.lse.data) + q0 * ls[1];
    job.lse_stride[0] = 0;
    job.lse_stride[1] = ls[0];
    job.lse_stride[2] = ls[1];
    jobs.push_back(job);
  }
  launch.run(jobs);
}

void launch_decode(const SpecState& st, const SpecIR& ir, const DecodePlanOptions& plan, const DecodeArgs& a) {
  const std::string what = "decode";
  const dsl::Spec& spec = ir.spec();
  ElemType et = elem_type(spec.dtype);
  const dsl::DType kv_dtype = plan_kv_dtype(what, plan, spec.dtype);
  const bool fp8 = is_fp8(kv_dtype);
  check_tensor(what, a.q, "q", 4, spec.dtype);
  for (auto [t, name] : {std::pair{&a.k, "k"}, std::pair{&a.v, "v"}})
    require(t->dtype == kv_dtype, what,
            fmt::format("`{}` is {} but the plan's KV cache is {} ({}); pass k and v in that dtype, or plan with kv_dtype {}", name,
                        dsl::dtype_name(t->dtype), dsl::dtype_name(kv_dtype),
                        plan.kv_dtype ? "its kv_dtype" : "the spec's dtype; the plan sets no kv_dtype", dsl::dtype_name(t->dtype)));
  check_tensor(what, a.k, "k", 4, kv_dtype);
  check_tensor(what, a.v, "v", 4, kv_dtype);
  check_tensor(what, a.o, "o", 4, spec.dtype);
  const int64_t B = a.q.shape[0], H = a.q.shape[1], Sq = a.q.shape[2], D = a.q.shape[3], Dv = a.v.shape[3];
  const bool paged = plan.page_size > 0;
  const int64_t P = plan.page_size;
  const int64_t Hkv = paged ? (plan.head_major_pages ? a.k.shape[1] : a.k.shape[2]) : a.k.shape[1];
  check_head_dims(what, spec, H, Hkv, D, Dv);
  const std::string no_scales =
      fmt::format("FP8 caches, but the plan's KV cache is {}; plan with kv_dtype f8e4m3 or f8e5m2, or drop the scale", dsl::dtype_name(kv_dtype));
  const KvScales kv_scale = kv_scales(what, a.k_scale, a.v_scale, kv_dtype, Hkv, no_scales);
  require(plan.batch <= 0 || B <= plan.batch, what, fmt::format("q has batch {} but the plan was made for at most {}", B, plan.batch));
  require(plan.heads <= 0 || H == plan.heads, what, fmt::format("q has {} heads but the plan was made for {}", H, plan.heads));
  require(plan.kv_heads <= 0 || Hkv == plan.kv_heads, what, fmt::format("k has {} heads but the plan was made for {}", Hkv, plan.kv_heads));
  require(Sq >= 1 && Sq <= plan.max_seqlen_q, what,
          fmt::format("q has {} rows per sequence but the plan allows 1..{} (max_seqlen_q)", Sq, plan.max_seqlen_q));
  require(plan.page_size >= 0 && plan.page_size <= 256, what, fmt::format("the plan's page_size {} is outside 0..256", plan.page_size));
  expect_shape(what, a.o, "o", {B, H, Sq, Dv}, "[B, H, Sq, Dv]");
  if (a.lse.data) {
    check_tensor(what, a.lse, "lse", 3, dsl::DType::F32);
    expect_shape(what, a.lse, "lse", {B, H, Sq}, "[B, H, Sq]");
  }
  check_tensor(what, a.kv_lens, "kv_lens", 1, dsl::DType::I32);
  expect_shape(what, a.kv_lens, "kv_lens", {B}, "[B]");
  std::vector<int64_t> kv_lens = read_i32(a.kv_lens, B), q_lens(static_cast<size_t>(B), Sq);
  if (a.q_lens.data) {
    check_tensor(what, a.q_lens, "q_lens", 1, dsl::DType::I32);
    expect_shape(what, a.q_lens, "q_lens", {B}, "[B]");
    q_lens = read_i32(a.q_lens, B);
  }
  int64_t num_pages = 0, max_pages = 0, cap = 0;
  std::vector<int64_t> table;
  if (paged) {
    num_pages = a.k.shape[0];
    if (plan.head_major_pages) {
      expect_shape(what, a.k, "k", {num_pages, Hkv, P, D}, "[num_pages, Hkv, page_size, D] (head-major pages)");
      expect_shape(what, a.v, "v", {num_pages, Hkv, P, Dv}, "[num_pages, Hkv, page_size, Dv] (head-major pages)");
    } else {
      expect_shape(what, a.k, "k", {num_pages, P, Hkv, D}, "[num_pages, page_size, Hkv, D]");
      expect_shape(what, a.v, "v", {num_pages, P, Hkv, Dv}, "[num_pages, page_size, Hkv, Dv]");
    }
    check_tensor(what, a.page_table, "page_table", 2, dsl::DType::I32);
    require(a.page_table.shape[0] == B, what, fmt::format("page_table has {} rows but the batch is {}", a.page_table.shape[0], B));
    max_pages = a.page_table.shape[1];
    std::vector<int64_t> pts = a.page_table.effective_strides();
    table.resize(static_cast<size_t>(B * max_pages));
    for (int64_t b = 0; b < B; ++b)
      for (int64_t i = 0; i < max_pages; ++i)
        table[static_cast<size_t>(b * max_pages + i)] = static_cast<const int32_t*>(a.page_table.data)[b * pts[0] + i * pts[1]];
  } else {
    cap = a.k.shape[2];
    expect_shape(what, a.k, "k", {B, Hkv, cap, D}, "[B, Hkv, Skv_cap, D]");
    expect_shape(what, a.v, "v", {B, Hkv, cap, Dv}, "[B, Hkv, Skv_cap, Dv]");
  }
  for (int64_t b = 0; b < B; ++b) {
    const int64_t ql = q_lens[static_cast<size_t>(b)], kl = kv_lens[static_cast<size_t>(b)];
    require(ql >= 1 && ql <= Sq, what, fmt::format("q_lens[{}] is {} but must be in 1..{} (the rows of q)", b, ql, Sq));
    require(kl >= ql && kl <= plan.max_seqlen_kv, what,
            fmt::format("kv_lens[{}] is {} but must be in {}..{} (at least the sequence's new query rows, at most the plan's max_seqlen_kv)", b,
                        kl, ql, plan.max_seqlen_kv));
    if (!paged) require(kl <= cap, what, fmt::format("kv_lens[{}] is {} but the KV cache holds {} positions per sequence", b, kl, cap));
    if (paged) {
      const int64_t pages = (kl + P - 1) / P;
      require(pages <= max_pages, what, fmt::format("sequence {} needs {} pages for {} positions but page_table has {} per row", b, pages, kl, max_pages));
      for (int64_t i = 0; i < pages; ++i) {
        int64_t pg = table[static_cast<size_t>(b * max_pages + i)];
        require(pg >= 0 && pg < num_pages, what, fmt::format("page_table[{}, {}] is {} but there are {} pages", b, i, pg, num_pages));
      }
    }
  }

  runtime::LaunchShape shape{B, H, Hkv, plan.max_seqlen_q, plan.max_seqlen_kv, D, Dv};
  AttentionArgs binding = binding_args(a.buffers, a.params);
  std::vector<Tensor> buffers = runtime::collect_buffers(spec, binding, {});
  SequenceRunner runner(st, ir, shape, buffers, binding, /*queries_at_kv_end=*/true);
  const float scale = scale_for(what, a.scale, D);
  std::vector<int64_t> qs = a.q.effective_strides(), ks = a.k.effective_strides(), vs = a.v.effective_strides(), os = a.o.effective_strides();
  std::vector<int64_t> ls = a.lse.data ? a.lse.effective_strides() : std::vector<int64_t>{0, 0, 0};
  const KvFormat kv_format(kv_dtype);
  std::vector<char> k_copy, v_copy;  // a paged or FP8 sequence's K and V as dense [Hkv, len, d]
  // Positions [0, len) of sequence b out of the cache (pages or [B, Hkv, cap, d]).
  auto gather = [&](const Tensor& t, const std::vector<int64_t>& s, const std::vector<float>& scale, int64_t b, int64_t len, int64_t d,
                    std::vector<char>& out) {
    gather_rows(kv_format, t, scale, Hkv, len, d, s[3], [&](int64_t p, int64_t h) {
      if (!paged) return b * s[0] + h * s[1] + p * s[2];
      const int64_t page = table[static_cast<size_t>(b * max_pages + p / P)], slot = p % P;
      return page * s[0] + (plan.head_major_pages ? h * s[1] + slot * s[2] : slot * s[1] + h * s[2]);
    }, out);
  };
  for (int64_t b = 0; b < B; ++b) {
    const int64_t ql = q_lens[static_cast<size_t>(b)], kl = kv_lens[static_cast<size_t>(b)];
    AttentionJob job = runner.job();
    job.B = 1;
    job.H = H;
    job.Hkv = Hkv;
    job.Sq = ql;
    job.Skv = kl;
    job.D = D;
    job.Dv = Dv;
    job.b_offset = b;
    job.q_offset = kl - ql;  // query row i sits at position kv_lens[b] - q_len(b) + i
    job.scale = scale;
    job.dtype = et;
    job.q = Operand{byte_at(a.q.data, b * qs[0], spec.dtype), {0, qs[1], qs[2], qs[3]}};
    job.o = OutOperand{const_cast<char*>(byte_at(a.o.data, b * os[0], spec.dtype)), {0, os[1], os[2], os[3]}};
    if (a.lse.data) {
      job.lse = static_cast<float*>(a.lse.data) + b * ls[0];
      job.lse_stride[0] = 0;
      job.lse_stride[1] = ls[1];
      job.lse_stride[2] = ls[2];
    }
    if (paged || fp8) {
      gather(a.k, ks, kv_scale.k, b, kl, D, k_copy);
      gather(a.v, vs, kv_scale.v, b, kl, Dv, v_copy);
      job.kv_f32 = fp8;
      job.k = Operand{k_copy.data(), {0, kl * D, D, 1}};
      job.v = Operand{v_copy.data(), {0, kl * Dv, Dv, 1}};
    } else {
      job.k = Operand{byte_at(a.k.data, b * ks[0], spec.dtype), {0, ks[1], ks[2], ks[3]}};
      job.v = Operand{byte_at(a.v.data, b * vs[0], spec.dtype), {0, vs[1], vs[2], vs[3]}};
    }
    runner.run(job);
  }
  runner.finish();
}

}  // namespace flexjit::cpu
