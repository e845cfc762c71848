// The C API's argument validation (what a server passes on its hot path), on the CPU
// backend: each input is one scenario - a kernel, a launch kind (forward, backward, ragged
// prefill and its backward, decode), shapes, strides, dtypes, buffers, parameters, devices, null pointers and
// index arrays (cu_seqlens, page tables, lengths) with any contents - then the calls. Every
// tensor the harness passes is backed by exactly the memory its shape and strides describe
// (ASan poisons the rest), so an accepted launch that reads or writes anything else is caught;
// a tensor with no elements or with an extent no memory can have points at a region no access
// is allowed to. Properties: no crash or sanitizer report, never FLEXJIT_ERROR_INTERNAL, an
// error text with every failure, and launches fail when a tensor's extent overflows the
// address space or B, H, Sq or Skv reach 2^31 (flexjit.hpp's limit).
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <sys/mman.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "fuzz/targets/byte_reader.h"
#include "fuzz/targets/targets.h"
#include "runtime/capi/flexjit.h"
#include "runtime/cpu/cpu_backend.h"

namespace flexjit::fuzz {

namespace {

// The kernels scenarios launch, compiled once: every buffer dtype, custom symbols, runtime and
// const parameters, a GQA group, a value head dim, gradients, data-dependent and plain masks.
const char* const kSpecs[] = {
    R"j({"dtype": "f32", "head_dim": 8})j",
    R"j({"mask_mod": "q >= kv", "dtype": "bf16", "head_dim": 16})j",
    R"j({"mask_mod": "doc[q] == doc[kv]", "buffers": ["doc: i32[Sq]"], "dtype": "f16", "head_dim": 8})j",
    R"j({"score_mod": "score * s + bias[h, kv]", "mask_mod": "q - kv < window", "buffers": ["bias: f32[H, Skv]"],
        "params": ["window: int", "s: float", "on: bool"], "grad": ["bias"], "dtype": "f32", "head_dim": 8})j",
    R"j({"score_mod": "score + table[offset[q] % N]", "buffers": ["offset: i64[Sq]", "table: bf16[N]", "flags: u8[4]", "keep: bool[Skv]"],
        "mask_mod": "keep[kv] || flags[q % 4] > 0", "grad": ["table"], "dtype": "f32", "head_dim": 16})j",
    R"j({"score_mod": "cap * tanh(score / cap)", "params": ["const cap: float = 20"], "gqa_group": 2, "dtype": "bf16", "head_dim": 8})j",
};
constexpr int kNumSpecs = sizeof kSpecs / sizeof kSpecs[0];

constexpr int64_t kBig = int64_t{1} << 31;
const std::vector<int64_t> kDims = {1, 1, 2, 2, 3, 4, 5, 7, 8, 16, 17, 33, 64, 65, 0, -1, kBig - 1, kBig, int64_t{1} << 40,
                                    std::numeric_limits<int64_t>::max(), std::numeric_limits<int64_t>::min()};
const std::vector<int64_t> kStrides = {0, 1, -1, 2, 8, 16, 100, -64, kBig, std::numeric_limits<int64_t>::max(),
                                       std::numeric_limits<int64_t>::min()};
const std::vector<double> kValues = {0, 1, 3, -5, 0.5, 64, 1e300, -1e300, std::numeric_limits<double>::quiet_NaN(),
                                     std::numeric_limits<double>::infinity(), 9.1e15};
const std::vector<int32_t> kIndexValues = {0, 1, 2, 3, 5, 8, 17, 64, -1, -100, std::numeric_limits<int32_t>::max(),
                                           std::numeric_limits<int32_t>::min()};
constexpr size_t kMaxTensorBytes = 1 << 20;  // larger tensors are not backed: their launches are skipped
constexpr double kMaxWork = double(1 << 20);  // score elements per launch

// FLEXJIT_FUZZ_TRACE=1 prints every tensor and call of a scenario as it happens (to triage a finding).
template <class... A>
void trace(fmt::format_string<A...> f, A&&... a) {
  static const bool on = std::getenv("FLEXJIT_FUZZ_TRACE") != nullptr;
  if (on) fmt::print(stderr, "capi: {}\n", fmt::format(f, std::forward<A>(a)...));
}

// How a tensor is backed.
enum class Backing {
  Exact,          // the memory its shape and strides describe
  Empty,          // a dimension below 1: the guard region, which no launch may touch
  Unaddressable,  // its extent overflows any address space: the guard region, and the launch must fail
  TooLarge        // too big to back (a dimension >= 2^31, or over kMaxTensorBytes): its launches are skipped
};

struct Tensor {
  std::vector<int64_t> shape, strides;  // strides empty: contiguous
  Backing backing = Backing::Exact;
  void* data = nullptr;
};

size_t dtype_bytes(flexjit_dtype t) {
  switch (t) {
    case FLEXJIT_F32:
    case FLEXJIT_I32: return 4;
    case FLEXJIT_F16:
    case FLEXJIT_BF16: return 2;
    case FLEXJIT_I64: return 8;
    default: return 1;
  }
}

// Owns the memory of one scenario; a guard region (no access) stands in for tensors not backed.
class Arena {
 public:
  Arena() {
    static void* guard = ::mmap(nullptr, kGuardBytes, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    guard_ = static_cast<char*>(guard) + kGuardBytes / 2;
  }

  // Backs `t` with elements of `elem` bytes and sets its data pointer.
  void back(Tensor& t, size_t elem, uint8_t fill, const char* label) {
    constexpr __int128 kLimit = __int128{1} << 62;
    __int128 lo = 0, hi = 0, contiguous = 1;
    t.backing = Backing::Exact;
    for (int64_t n : t.shape) {
      if (n < 1) t.backing = Backing::Empty;
      else if (n >= kBig && t.backing == Backing::Exact) t.backing = Backing::TooLarge;
    }
    if (t.backing != Backing::Empty) {
      for (size_t d = t.shape.size(); d-- > 0;) {
        const __int128 s = t.strides.size() == t.shape.size() ? __int128{t.strides[d]} : contiguous;
        const __int128 reach = s * (t.shape[d] - 1);
        (reach < 0 ? lo : hi) += reach;
        contiguous = std::min(contiguous * t.shape[d], kLimit);
        if (hi - lo > kLimit / 8) {
          t.backing = Backing::Unaddressable;
          break;
        }
      }
    }
    const __int128 bytes = t.backing == Backing::Exact ? (hi - lo + 1) * __int128(elem) : 0;
    if (bytes > __int128(kMaxTensorBytes)) t.backing = Backing::TooLarge;
    if (t.backing != Backing::Exact) {
      static const char* const kWhat[] = {"", "empty (guard region)", "unaddressable (guard region)", "too large to back"};
      t.data = guard_;
      trace("{} shape [{}] strides [{}]: {}", label, fmt::join(t.shape, ", "), fmt::join(t.strides, ", "), kWhat[static_cast<int>(t.backing)]);
      return;
    }
    auto& block = blocks_.emplace_back(std::make_unique<std::vector<uint8_t>>(static_cast<size_t>(bytes)));
    for (size_t i = 0; i < block->size(); ++i) block->at(i) = static_cast<uint8_t>((i * 131 + fill) & 0x3f);
    t.data = block->data() + static_cast<size_t>(-lo) * elem;
    trace("{} shape [{}] strides [{}]: {} bytes at {}, element 0 at +{}", label, fmt::join(t.shape, ", "), fmt::join(t.strides, ", "),
          block->size(), static_cast<void*>(block->data()), static_cast<int64_t>(-lo) * static_cast<int64_t>(elem));
  }

  // An int32 array of exactly `n` entries with contents from the input (n <= 0: none).
  int32_t* indices(int64_t n, ByteReader& in) {
    if (n < 1 || n > (1 << 16)) return nullptr;
    auto& block = blocks_.emplace_back(std::make_unique<std::vector<uint8_t>>(static_cast<size_t>(n) * 4));
    int32_t* p = reinterpret_cast<int32_t*>(block->data());
    const bool ramp = in.flag();  // mostly valid offsets (0, step, 2 step, ...) or anything
    const int32_t step = static_cast<int32_t>(in.below(9));
    for (int64_t i = 0; i < n; ++i) p[i] = ramp ? static_cast<int32_t>(i) * step : in.pick(kIndexValues);
    trace("int32 array [{}]", fmt::join(p, p + n, ", "));
    return p;
  }

 private:
  static constexpr size_t kGuardBytes = 1 << 16;
  char* guard_;
  std::vector<std::unique_ptr<std::vector<uint8_t>>> blocks_;
};

struct Kernels {
  flexjit_runtime* rt = nullptr;
  flexjit_kernel* k[kNumSpecs] = {};
  Kernels() {
    flexjit_enable_cpu_backend();
    cpu::CpuSettings s = cpu::settings();
    s.threads = 1;  // one worker: launches of fuzz-sized problems are faster without thread start-up
    cpu::configure(s);
    flexjit_runtime_create(&rt);
    for (int i = 0; i < kNumSpecs; ++i)
      if (flexjit_compile(rt, kSpecs[i], &k[i]) != FLEXJIT_OK) std::abort();
  }
};

flexjit_dtype pick_dtype(ByteReader& in, flexjit_dtype usual) {
  if (!in.chance(40)) return usual;
  static const std::vector<int> kinds = {0, 1, 2, 3, 4, 5, 6, 7};
  return static_cast<flexjit_dtype>(in.pick(kinds));
}

int64_t pick_dim(ByteReader& in, int64_t usual) { return in.chance(200) ? usual : in.pick(kDims); }

// Strides for a rank-4 tensor: none (contiguous), a permutation's, or anything.
std::vector<int64_t> pick_strides(ByteReader& in, const std::vector<int64_t>& shape) {
  switch (in.below(4)) {
    case 0:
    case 1: return {};
    case 2: {  // [B, S, H, D] storage of a [B, H, S, D] view (contiguous when that overflows)
      int64_t hd = 0, shd = 0;
      if (__builtin_mul_overflow(shape[1], shape[3], &hd) || __builtin_mul_overflow(shape[2], hd, &shd)) return {};
      return {shd, shape[3], hd, 1};
    }
    default: {
      std::vector<int64_t> s(shape.size());
      for (auto& x : s) x = in.pick(kStrides);
      return s;
    }
  }
}

// The records of one scenario: what failed and whether any failure was a violation.
class Checker {
 public:
  void call(flexjit_status st, const char* what) {
    trace("{} -> {} {}", what, static_cast<int>(st), st == FLEXJIT_OK ? "" : flexjit_last_error());
    if (!violation_.empty()) return;
    if (st == FLEXJIT_ERROR_INTERNAL) violation_ = std::string(what) + " reported an internal error: " + flexjit_last_error();
    else if (st != FLEXJIT_OK && !*flexjit_last_error()) violation_ = std::string(what) + " failed without an error text";
    else if (st < FLEXJIT_OK || st > FLEXJIT_ERROR_INTERNAL) violation_ = std::string(what) + " returned an unknown status";
  }
  // A launch that must fail (it was given arguments that cannot be valid).
  void must_fail(flexjit_status st, const char* what) {
    call(st, what);
    if (violation_.empty() && st == FLEXJIT_OK) violation_ = std::string(what) + " accepted a tensor with an impossible shape";
  }
  const std::string& violation() const { return violation_; }

 private:
  std::string violation_;
};

// Whether a scenario's launch must fail or cannot run.
struct Launchable {
  bool must_fail = false, too_large = false;
  void add(const Tensor& t) {
    must_fail |= t.backing == Backing::Unaddressable;
    too_large |= t.backing == Backing::TooLarge;
  }
};

// Buffers and parameters for kernel `spec`, right or wrong as the input says.
void set_buffers_and_params(flexjit_args* a, int spec, const int64_t dims[6], ByteReader& in, Arena& arena, Checker& check, Launchable& go,
                            std::vector<std::pair<std::string, Tensor>>* grads_like) {
  struct Decl {
    const char* name;
    flexjit_dtype dtype;
    std::vector<int> dims;  // indices into dims[] (B H Hkv Sq Skv N); -k: the literal k
  };
  static const std::vector<std::vector<Decl>> decls = {
      {},
      {},
      {{"doc", FLEXJIT_I32, {3}}},
      {{"bias", FLEXJIT_F32, {1, 4}}},
      {{"offset", FLEXJIT_I64, {3}}, {"table", FLEXJIT_BF16, {5}}, {"flags", FLEXJIT_U8, {-4}}, {"keep", FLEXJIT_BOOL, {4}}},
      {}};
  static const std::vector<std::vector<const char*>> params = {{}, {}, {}, {"window", "s", "on"}, {}, {"cap"}};
  for (const Decl& d : decls[static_cast<size_t>(spec)]) {
    if (in.chance(10)) continue;  // not given
    Tensor t;
    for (int i : d.dims) t.shape.push_back(i < 0 ? -i : pick_dim(in, dims[i]));
    if (in.chance(12)) t.shape.push_back(pick_dim(in, 2));  // wrong rank
    if (in.chance(40)) {
      t.strides.resize(t.shape.size());
      for (auto& s : t.strides) s = in.pick(kStrides);
    }
    const flexjit_dtype dt = pick_dtype(in, d.dtype);
    arena.back(t, dtype_bytes(dt), in.byte(), d.name);
    go.add(t);
    const char* name = in.chance(8) ? "bais" : d.name;
    const void* data = in.chance(8) ? nullptr : t.data;
    // The shape array holds exactly the tensor's rank; a wrong rank is one the call must refuse.
    const int rank = in.chance(8) ? (in.flag() ? -1 : 17) : static_cast<int>(t.shape.size());
    const int64_t* shape = in.chance(6) ? nullptr : t.shape.data();
    check.call(flexjit_args_set_buffer(a, name, data, dt, rank, shape, t.strides.empty() ? nullptr : t.strides.data()),
               "flexjit_args_set_buffer");
    if (grads_like) grads_like->emplace_back(d.name, t);
  }
  for (const char* p : params[static_cast<size_t>(spec)]) {
    if (in.chance(20)) continue;
    check.call(flexjit_args_set_param(a, in.chance(8) ? "widow" : p, in.pick(kValues)), "flexjit_args_set_param");
  }
  if (in.chance(30)) check.call(flexjit_args_set_scale(a, static_cast<float>(in.pick(kValues))), "flexjit_args_set_scale");
  static const std::vector<int> devices = {-2, -2, -2, -2, -1, 0, 1, -3};
  if (!in.chance(8)) check.call(flexjit_args_set_stream(a, nullptr, in.pick(devices)), "flexjit_args_set_stream");
}

// Q, K, V and O of a [B, H, Sq, D] launch (forward, backward).
struct Dense {
  Tensor q, k, v, o;
};

// flexjit_args_set_qkvo gives v and o q's head dim.
Dense dense_operands(const int64_t dims[6], int64_t D, flexjit_dtype dt, ByteReader& in, Arena& arena) {
  Dense t;
  t.q.shape = {dims[0], dims[1], dims[3], D};
  t.k.shape = {dims[0], dims[2], dims[4], D};
  t.v.shape = t.k.shape;
  t.o.shape = t.q.shape;
  const char* names[] = {"q", "k", "v", "o"};
  int i = 0;
  for (Tensor* x : {&t.q, &t.k, &t.v, &t.o}) {
    x->strides = pick_strides(in, x->shape);
    arena.back(*x, dtype_bytes(dt), in.byte(), names[i++]);
  }
  return t;
}

const int64_t* strides_or_null(const Tensor& t) { return t.strides.empty() ? nullptr : t.strides.data(); }

// Backs a tensor of `shape` (contiguous) and records it.
void* contiguous(std::vector<int64_t> shape, size_t elem, Arena& arena, Launchable& go, uint8_t fill, const char* label) {
  Tensor t;
  t.shape = std::move(shape);
  arena.back(t, elem, fill, label);
  go.add(t);
  return t.data;
}

struct Scenario {
  const Kernels& kernels;
  ByteReader in;
  Arena arena;
  Checker check;
  Launchable go;
  flexjit_args* args = nullptr;
  int spec = 0;
  flexjit_dtype dtype = FLEXJIT_F32;
  int64_t D = 8;
  int64_t dims[6] = {};  // B, H, Hkv, Sq, Skv, N

  Scenario(const Kernels& k, const uint8_t* data, size_t size) : kernels(k), in(data, size) {}

  flexjit_kernel* kernel() const { return kernels.k[spec]; }

  // Backs four operands of the kernel's dtype (their shapes and strides set) and records them.
  void back_operands(std::initializer_list<Tensor*> tensors, std::initializer_list<const char*> names) {
    auto name = names.begin();
    for (Tensor* t : tensors) {
      arena.back(*t, dtype_bytes(dtype), in.byte(), *name++);
      go.add(*t);
    }
  }

  // Runs `launch` unless a tensor was too large to back; it must fail when one cannot be valid.
  void launch(flexjit_status (*launch)(flexjit_kernel*, const flexjit_args*), const char* what, double work) {
    if (go.must_fail) check.must_fail(launch(kernel(), args), what);
    else if (!go.too_large && work <= kMaxWork) check.call(launch(kernel(), args), what);
  }

  void forward_or_backward(bool backward) {
    Dense t = dense_operands(dims, D, dtype, in, arena);
    for (const Tensor* x : {&t.q, &t.k, &t.v, &t.o}) go.add(*x);
    // Launches refuse B, H, Sq or Skv of 2^31 or more (flexjit.hpp); other too-large tensors are skipped.
    for (int i : {0, 1, 2, 3, 4})
      if (dims[i] >= kBig) go.must_fail = true;
    const flexjit_dtype dt = pick_dtype(in, dtype);
    check.call(flexjit_args_set_qkvo(args, in.chance(8) ? nullptr : t.q.data, t.k.data, t.v.data, in.chance(4) ? nullptr : t.o.data, dt,
                                     t.q.shape[0], t.q.shape[1], t.k.shape[1], t.q.shape[2], t.k.shape[2], t.q.shape[3]),
               "flexjit_args_set_qkvo");
    if (!t.q.strides.empty() || !t.k.strides.empty() || !t.v.strides.empty() || !t.o.strides.empty())
      check.call(flexjit_args_set_strides(args, strides_or_null(t.q), strides_or_null(t.k), strides_or_null(t.v), strides_or_null(t.o)),
                 "flexjit_args_set_strides");
    const bool lse = backward || in.flag();
    if (lse) check.call(flexjit_args_set_lse(args, static_cast<float*>(contiguous({dims[0], dims[1], dims[3]}, 4, arena, go, 7, "lse"))), "flexjit_args_set_lse");
    std::vector<std::pair<std::string, Tensor>> buffers;
    set_buffers_and_params(args, spec, dims, in, arena, check, go, &buffers);
    const double work = double(dims[0]) * double(dims[1]) * double(dims[3]) * double(dims[4]) * double(D);
    if (!backward) {
      launch(flexjit_forward, "flexjit_forward", work);
      return;
    }
    // dO like o, dq / dk / dv like q / k / v (their shapes and strides), gradients like their buffers.
    Tensor d_o = t.o, dq = t.q, dk = t.k, dv = t.v;
    back_operands({&d_o, &dq, &dk, &dv}, {"dO", "dq", "dk", "dv"});
    if (!in.chance(10))
      check.call(flexjit_args_set_backward(args, d_o.data, dq.data, in.chance(6) ? nullptr : dk.data, dv.data), "flexjit_args_set_backward");
    for (auto& [name, b] : buffers) {
      if (in.chance(128)) continue;
      void* g = contiguous(b.shape, 4, arena, go, 3, "grad");
      check.call(flexjit_args_set_grad(args, in.chance(8) ? "tabel" : name.c_str(), static_cast<float*>(g)), "flexjit_args_set_grad");
    }
    check.call(flexjit_args_set_deterministic(args, in.flag()), "flexjit_args_set_deterministic");
    if (in.flag()) check.call(flexjit_args_set_backward_dq(args, static_cast<flexjit_bwd_dq>(in.below(4))), "flexjit_args_set_backward_dq");
    launch(flexjit_backward, "flexjit_backward", work * 3);
    // A forward with the same arguments too (its LSE is the backward's input).
    launch(flexjit_forward, "flexjit_forward", work);
  }

  void varlen() {
    const int64_t batch = pick_dim(in, 1 + static_cast<int64_t>(in.below(3)));
    const int64_t total_q = pick_dim(in, dims[3]), total_kv = pick_dim(in, dims[4]);
    Tensor q, k, v, o;
    q.shape = {total_q, dims[1], D};
    k.shape = {total_kv, dims[2], D};
    v.shape = k.shape;
    o.shape = q.shape;
    back_operands({&q, &k, &v, &o}, {"q", "k", "v", "o"});
    const int64_t entries = batch >= 0 && batch < (1 << 16) ? batch + 1 : 0;
    const int32_t* cu_q = arena.indices(entries, in);
    const int32_t* cu_kv = arena.indices(entries, in);
    if (batch < 1 || batch >= (1 << 16)) go.must_fail = true;  // set_varlen refuses it, or the offsets are not given
    const int max_q = static_cast<int>(in.pick(kIndexValues)), max_kv = static_cast<int>(in.pick(kIndexValues));
    check.call(flexjit_args_set_varlen(args, q.data, k.data, v.data, o.data, pick_dtype(in, dtype), total_q, total_kv, dims[1], dims[2],
                                       D, batch, cu_q, cu_kv, max_q, max_kv),
               "flexjit_args_set_varlen");
    if (in.flag()) check.call(flexjit_args_set_lse(args, static_cast<float*>(contiguous({dims[1], total_q}, 4, arena, go, 5, "lse"))), "flexjit_args_set_lse");
    set_buffers_and_params(args, spec, dims, in, arena, check, go, nullptr);
    const double work = double(total_q) * double(dims[1]) * double(std::max(0, max_kv)) * double(D);
    launch(flexjit_forward_varlen, "flexjit_forward_varlen", work);
    if (!in.flag()) return;
    // Its backward: dO like o, dq / dk / dv like q / k / v.
    Tensor d_o = o, dq = q, dk = k, dv = v;
    back_operands({&d_o, &dq, &dk, &dv}, {"dO", "dq", "dk", "dv"});
    check.call(flexjit_args_set_backward(args, d_o.data, dq.data, dk.data, dv.data), "flexjit_args_set_backward");
    launch(flexjit_backward_varlen, "flexjit_backward_varlen", work * 3);
  }

  void decode() {
    const int64_t B = dims[0], H = dims[1], Hkv = dims[2];
    const int64_t Sq = 1 + static_cast<int64_t>(in.below(3));
    const int page_size = static_cast<int>(in.pick(std::vector<int64_t>{0, 0, 1, 4, 16, 300, -1}));
    const bool head_major = in.flag();
    const int max_seqlen_kv = static_cast<int>(pick_dim(in, dims[4]));
    static const std::vector<int> plan_devices = {-2, -2, -2, -1, 0, -3};
    flexjit_decode_plan* plan = nullptr;
    check.call(flexjit_plan_decode(kernel(), in.pick(plan_devices), static_cast<int>(pick_dim(in, B)), static_cast<int>(H),
                                   static_cast<int>(Hkv), static_cast<int>(pick_dim(in, Sq)), max_seqlen_kv, page_size, head_major, &plan),
               "flexjit_plan_decode");
    const int64_t num_pages = pick_dim(in, 1 + static_cast<int64_t>(in.below(8)));
    const int64_t max_pages = pick_dim(in, 1 + static_cast<int64_t>(in.below(4)));
    const int64_t slots = page_size > 0 ? page_size : pick_dim(in, dims[4]);
    int64_t cache_shape[4];
    if (page_size > 0) {
      cache_shape[0] = num_pages;
      cache_shape[1] = head_major ? Hkv : slots;
      cache_shape[2] = head_major ? slots : Hkv;
    } else {
      cache_shape[0] = B;
      cache_shape[1] = Hkv;
      cache_shape[2] = slots;
    }
    cache_shape[3] = D;
    Tensor q, kc, vc, o;
    q.shape = {B, H, Sq, D};
    kc.shape = std::vector<int64_t>(cache_shape, cache_shape + 4);
    vc.shape = kc.shape;
    o.shape = q.shape;
    back_operands({&q, &kc, &vc, &o}, {"q", "k cache", "v cache", "o"});
    const double table_entries = double(B) * double(max_pages);
    const bool table_fits = B >= 1 && max_pages >= 1 && table_entries <= (1 << 16);
    const int32_t* page_table = page_size > 0 && table_fits && !in.chance(20) ? arena.indices(B * max_pages, in) : nullptr;
    const int32_t* kv_lens = arena.indices(B, in);
    const int32_t* q_lens = in.flag() ? arena.indices(B, in) : nullptr;
    if (B < 1 || B >= (1 << 16)) go.must_fail = true;  // no kv_lens to give
    check.call(flexjit_args_set_decode(args, q.data, kc.data, vc.data, o.data, pick_dtype(in, dtype), B, H, Sq, D, cache_shape, page_table,
                                       max_pages, kv_lens, q_lens),
               "flexjit_args_set_decode");
    if (in.flag()) check.call(flexjit_args_set_lse(args, static_cast<float*>(contiguous({B, H, Sq}, 4, arena, go, 9, "lse"))), "flexjit_args_set_lse");
    set_buffers_and_params(args, spec, dims, in, arena, check, go, nullptr);
    const double work = double(B) * double(H) * double(Sq) * double(std::max(0, max_seqlen_kv)) * double(D);
    if (plan) {
      if (go.must_fail) check.must_fail(flexjit_decode(kernel(), plan, args), "flexjit_decode");
      else if (!go.too_large && work <= kMaxWork) check.call(flexjit_decode(kernel(), plan, args), "flexjit_decode");
      flexjit_decode_plan_destroy(plan);
    }
  }

  std::string run() {
    spec = static_cast<int>(in.below(kNumSpecs));
    static const flexjit_dtype spec_dtypes[kNumSpecs] = {FLEXJIT_F32, FLEXJIT_BF16, FLEXJIT_F16, FLEXJIT_F32, FLEXJIT_F32, FLEXJIT_BF16};
    static const int64_t spec_d[kNumSpecs] = {8, 16, 8, 8, 16, 8};
    dtype = spec_dtypes[spec];
    D = in.chance(230) ? spec_d[spec] : in.pick(kDims);
    dims[0] = pick_dim(in, 1 + static_cast<int64_t>(in.below(2)));
    dims[2] = pick_dim(in, 1 + static_cast<int64_t>(in.below(2)));
    const int64_t group = 1 + static_cast<int64_t>(in.below(3));
    dims[1] = pick_dim(in, dims[2] > 0 && dims[2] < kBig ? dims[2] * group : dims[2]);
    dims[3] = pick_dim(in, 1 + static_cast<int64_t>(in.below(70)));
    dims[4] = pick_dim(in, 1 + static_cast<int64_t>(in.below(70)));
    dims[5] = pick_dim(in, 1 + static_cast<int64_t>(in.below(10)));
    check.call(flexjit_args_create(&args), "flexjit_args_create");
    switch (in.below(5)) {
      case 0:
      case 1: forward_or_backward(false); break;
      case 2: forward_or_backward(true); break;
      case 3: varlen(); break;
      default: decode(); break;
    }
    if (in.chance(16)) check.call(flexjit_check_errors(kernel(), -2, nullptr), "flexjit_check_errors");
    flexjit_args_destroy(args);
    return check.violation();
  }
};

}  // namespace

std::string run_capi(const uint8_t* data, size_t size) {
  static const Kernels kernels;
  Scenario s(kernels, data, size);
  return s.run();
}

}  // namespace flexjit::fuzz
