// The CPU backend end to end (Runtime::compile -> Kernel::forward with Device::cpu()) against
// a float64 reference written here: naive loops with the mods evaluated by the interpreter
// at every (b, h, q, kv). Gallery specs, odd lengths, head dims 24 / 64 / 80, GQA 2:1 and
// 4:1, Sq != Skv, fully masked rows, strided and half-precision operands, every instruction
// set this machine runs, and load errors.
#include <catch2/catch.hpp>
#include <fmt/format.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <random>

#include "compiler/frontend.h"
#include "dsl/error.h"
#include "runtime/cpu/cpu_backend.h"
#include "runtime/cpu/mod_jit.h"
#include "runtime/flexjit.hpp"
#include "support/spec_loading.h"
#include "compiler/ir/ir_mutator.h"
#include "compiler/ir/ir_printer.h"
#include "compiler/passes/pipeline.h"
#include "runtime/cpu_executor.h"
#include "unit/compiler/random_ir.h"
#include "unit/cpu/gallery_inputs.h"

using namespace flexjit;
using test::Sizes;

namespace {

const double kInfD = std::numeric_limits<double>::infinity();
const float kNanF = std::numeric_limits<float>::quiet_NaN();

// One attention problem: the spec, sizes, contiguous fp32 inputs and captured buffers.
struct Problem {
  dsl::Spec spec;
  Sizes sz;
  int64_t Dv = 0;
  float scale = 0;  // 0: 1 / sqrt(D)
  std::vector<float> q, k, v;
  std::vector<test::HostBuffer> buffers;
  std::vector<std::pair<std::string, double>> params;
};

Problem make_problem(dsl::Spec spec, Sizes sz, uint64_t seed, int64_t dv = 0) {
  // The gallery's document mask indexes doc: i32[Sq] with kv as well: it assumes Skv = Sq.
  if (spec.name == "document") sz.Skv = sz.Sq;
  Problem p;
  spec.dtype = dsl::DType::F32;
  spec.head_dim = static_cast<int>(sz.D);
  spec.head_dim_v = static_cast<int>(dv);
  p.spec = spec;
  p.sz = sz;
  p.Dv = dv ? dv : sz.D;
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> u(-1.5f, 1.5f);
  p.q.resize(static_cast<size_t>(sz.B * sz.H * sz.Sq * sz.D));
  p.k.resize(static_cast<size_t>(sz.B * sz.Hkv * sz.Skv * sz.D));
  p.v.resize(static_cast<size_t>(sz.B * sz.Hkv * sz.Skv * p.Dv));
  for (auto* t : {&p.q, &p.k, &p.v})
    for (float& x : *t) x = u(rng);
  p.buffers = test::make_buffers(spec, sz, rng);
  p.params = test::gallery_params(spec, sz);
  return p;
}

struct Reference {
  std::vector<double> o, lse;
};

// The float64 reference: S = scale * q.k in double, the mods through the interpreter (the
// score handed to score_mod rounded to fp32, as the language defines it), softmax and P.V in
// double. Fully masked rows: O = 0, LSE = -inf.
Reference reference(const SpecIR& ir, EvalEnv env, const Problem& p, const std::vector<float>& q, const std::vector<float>& k,
                    const std::vector<float>& v) {
  const Sizes& s = p.sz;
  double scale = p.scale > 0 ? p.scale : 1.0 / std::sqrt(static_cast<double>(s.D));
  Reference r;
  r.o.assign(static_cast<size_t>(s.B * s.H * s.Sq * p.Dv), 0.0);
  r.lse.assign(static_cast<size_t>(s.B * s.H * s.Sq), -kInfD);
  std::vector<double> row(static_cast<size_t>(s.Skv));
  for (int64_t b = 0; b < s.B; ++b)
    for (int64_t h = 0; h < s.H; ++h)
      for (int64_t qi = 0; qi < s.Sq; ++qi) {
        int64_t hkv = h / (s.H / s.Hkv);
        const float* qp = &q[static_cast<size_t>(((b * s.H + h) * s.Sq + qi) * s.D)];
        double mx = -kInfD;
        for (int64_t kv = 0; kv < s.Skv; ++kv) {
          env.vars[int(dsl::VarId::B)] = b;
          env.vars[int(dsl::VarId::H)] = h;
          env.vars[int(dsl::VarId::KvHead)] = hkv;
          env.vars[int(dsl::VarId::Q)] = qi;
          env.vars[int(dsl::VarId::KV)] = kv;
          double x = -kInfD;
          if (!ir.mask_mod || evaluate(ir.mask_mod, env).b) {
            const float* kp = &k[static_cast<size_t>(((b * s.Hkv + hkv) * s.Skv + kv) * s.D)];
            double dot = 0;
            for (int64_t d = 0; d < s.D; ++d) dot += static_cast<double>(qp[d]) * kp[d];
            x = scale * dot;
            if (ir.score_mod) {
              env.score = static_cast<float>(x);
              x = evaluate(ir.score_mod, env).f;
            }
          }
          row[static_cast<size_t>(kv)] = x;
          mx = std::max(mx, x);
        }
        size_t ri = static_cast<size_t>((b * s.H + h) * s.Sq + qi);
        if (mx == -kInfD) continue;
        double sum = 0;
        for (double& x : row) sum += (x = std::exp(x - mx));
        double* op = &r.o[ri * static_cast<size_t>(p.Dv)];
        for (int64_t kv = 0; kv < s.Skv; ++kv) {
          const float* vp = &v[static_cast<size_t>(((b * s.Hkv + hkv) * s.Skv + kv) * p.Dv)];
          for (int64_t d = 0; d < p.Dv; ++d) op[d] += row[static_cast<size_t>(kv)] * vp[d];
        }
        for (int64_t d = 0; d < p.Dv; ++d) op[d] /= sum;
        r.lse[ri] = mx + std::log(sum);
      }
  return r;
}

Reference reference(const Problem& p, const std::vector<float>& q, const std::vector<float>& k, const std::vector<float>& v) {
  SpecIR ir = build_spec_ir(p.spec);
  return reference(ir, test::eval_env(ir.checked, p.sz, p.buffers, p.params), p, q, k, v);
}

struct Output {
  std::vector<float> o, lse;
};

// Runs the problem through the public API on the CPU with contiguous fp32 operands; outputs
// are poisoned with NaN first.
Output run_cpu(const Problem& p) {
  cpu::install();
  Runtime rt;
  std::shared_ptr<Kernel> kernel = rt.compile(p.spec);
  const Sizes& s = p.sz;
  Output out;
  out.o.assign(static_cast<size_t>(s.B * s.H * s.Sq * p.Dv), kNanF);
  out.lse.assign(static_cast<size_t>(s.B * s.H * s.Sq), kNanF);
  std::vector<float> q = p.q, k = p.k, v = p.v;
  AttentionArgs a;
  a.q = Tensor::contiguous(q.data(), DType::F32, {s.B, s.H, s.Sq, s.D});
  a.k = Tensor::contiguous(k.data(), DType::F32, {s.B, s.Hkv, s.Skv, s.D});
  a.v = Tensor::contiguous(v.data(), DType::F32, {s.B, s.Hkv, s.Skv, p.Dv});
  a.o = Tensor::contiguous(out.o.data(), DType::F32, {s.B, s.H, s.Sq, p.Dv});
  a.lse = Tensor::contiguous(out.lse.data(), DType::F32, {s.B, s.H, s.Sq});
  a.scale = p.scale;
  std::vector<test::HostBuffer> buffers = p.buffers;
  for (test::HostBuffer& b : buffers) a.buffers.push_back({b.name, b.tensor()});
  a.params = p.params;
  a.device = Device::cpu();
  kernel->forward(a);
  return out;
}

// O within rel_tol of the reference relative to each row's largest |O|, LSE within rel_tol
// relative to max(1, |LSE|); fully masked rows exactly O = 0, LSE = -inf.
void check_close(const Problem& p, const Reference& ref, const Output& out, double rel_tol, const std::string& what) {
  const Sizes& s = p.sz;
  int64_t rows = s.B * s.H * s.Sq;
  double worst = 0;
  for (int64_t r = 0; r < rows; ++r) {
    size_t ri = static_cast<size_t>(r);
    INFO(what << ": row " << r << " (b=" << r / (s.H * s.Sq) << " h=" << (r / s.Sq) % s.H << " q=" << r % s.Sq << ")");
    if (ref.lse[ri] == -kInfD) {
      REQUIRE(out.lse[ri] == -std::numeric_limits<float>::infinity());
      for (int64_t d = 0; d < p.Dv; ++d) REQUIRE(out.o[ri * static_cast<size_t>(p.Dv) + static_cast<size_t>(d)] == 0.0f);
      continue;
    }
    REQUIRE(std::isfinite(out.lse[ri]));
    REQUIRE(std::abs(out.lse[ri] - ref.lse[ri]) <= rel_tol * std::max(1.0, std::abs(ref.lse[ri])));
    double scale = 0;
    for (int64_t d = 0; d < p.Dv; ++d) scale = std::max(scale, std::abs(ref.o[ri * static_cast<size_t>(p.Dv) + static_cast<size_t>(d)]));
    scale = std::max(scale, 1e-30);
    for (int64_t d = 0; d < p.Dv; ++d) {
      size_t i = ri * static_cast<size_t>(p.Dv) + static_cast<size_t>(d);
      REQUIRE(std::isfinite(out.o[i]));
      double err = std::abs(out.o[i] - ref.o[i]) / scale;
      worst = std::max(worst, err);
      REQUIRE(err <= rel_tol);
    }
  }
  INFO(what << ": worst row-relative error " << worst);
  SUCCEED();
}

const Sizes kShapes[] = {
    {1, 2, 2, 1, 1, 24},      // one query, one key
    {2, 4, 2, 17, 33, 64},    // GQA 2:1, odd lengths
    {1, 4, 1, 100, 37, 80},   // GQA 4:1, Sq > Skv, head dim 80
    {1, 2, 1, 33, 100, 24},   // Sq < Skv, head dim 24
    {1, 2, 2, 150, 200, 64},  // several query and KV tiles: block sparsity at work
};

std::string describe(const Problem& p) {
  const Sizes& s = p.sz;
  return fmt::format("{} B{} H{} Hkv{} Sq{} Skv{} D{} Dv{} isa {}", p.spec.name, s.B, s.H, s.Hkv, s.Sq, s.Skv, s.D, p.Dv, cpu::settings().isa);
}

// Restores the default CPU settings when a test ends.
struct SettingsGuard {
  cpu::CpuSettings saved = cpu::settings();
  ~SettingsGuard() { cpu::configure(saved); }
};

}  // namespace

TEST_CASE("CPU attention: the gallery matches a float64 reference", "[cpu][attention][gallery]") {
  SettingsGuard guard;
  uint64_t seed = 1;
  for (const auto& path : test::gallery_specs()) {
    dsl::Spec spec = test::load_spec(path);
    for (const Sizes& sz : kShapes) {
      Problem p = make_problem(spec, sz, seed++);
      Reference ref = reference(p, p.q, p.k, p.v);
      check_close(p, ref, run_cpu(p), 2e-4, describe(p));
    }
  }
}

TEST_CASE("CPU attention: every instruction set agrees with the reference", "[cpu][attention][isa]") {
  SettingsGuard guard;
  std::vector<std::string> isas = cpu::available_isas();
  INFO("instruction sets: " << fmt::format("{}", fmt::join(isas, ", ")));
  REQUIRE(!isas.empty());
  uint64_t seed = 100;
  for (const char* name : {"causal.json", "sam_relpos_d80.json", "document.json", "softcap.json"}) {
    dsl::Spec spec = test::load_spec(test::gallery_dir() / name);
    Problem p = make_problem(spec, {2, 4, 2, 70, 130, 80}, seed++);
    Reference ref = reference(p, p.q, p.k, p.v);
    std::vector<float> first;
    for (const std::string& isa : isas) {
      for (int threads : {1, 3}) {
        cpu::configure({threads, isa});
        Output out = run_cpu(p);
        check_close(p, ref, out, 2e-4, describe(p) + " threads " + std::to_string(threads));
        // The split over threads never changes a result: each work item is computed alone.
        if (threads == 1) first = out.o;
        else CHECK(out.o == first);
      }
    }
  }
}

TEST_CASE("CPU attention: tile and chunk sizes do not change results", "[cpu][attention][tiles]") {
  SettingsGuard guard;
  struct Tiling {
    int block_m, block_n, chunk_n;
  };
  // Odd tiles (the staging rewrite of kv // 64 and kv % 64 then does not apply), tiles
  // smaller than the hoisting alignment, one tile per product, and chunks past Skv.
  const Tiling tilings[] = {{7, 5, 23}, {16, 16, 48}, {64, 64, 64}, {33, 64, 1024}, {128, 128, 512}};
  uint64_t seed = 200;
  for (const char* name : {"sam_relpos.json", "document.json", "sliding_window.json", "alibi_causal.json", "relative_bias.json"}) {
    dsl::Spec spec = test::load_spec(test::gallery_dir() / name);
    Problem p = make_problem(spec, {1, 3, 3, 90, 150, 24}, seed++);
    Reference ref = reference(p, p.q, p.k, p.v);
    for (const Tiling& t : tilings) {
      cpu::configure({0, "", t.block_m, t.block_n, t.chunk_n});
      check_close(p, ref, run_cpu(p), 2e-4,
                  fmt::format("{} block_m {} block_n {} chunk_n {}", describe(p), t.block_m, t.block_n, t.chunk_n));
    }
  }
}

TEST_CASE("CPU attention: fully masked rows give O = 0 and LSE = -inf", "[cpu][attention][masked]") {
  SettingsGuard guard;
  const char* masks[] = {"kv > q + 1000",              // every row
                         "q >= 5 && kv <= q - 3",      // the first 5 rows; row 5 sees 3 keys
                         "doc[q] == doc[kv] && q % 7 != 3"};  // data-dependent, every 7th row empty
  uint64_t seed = 300;
  for (const char* mask : masks) {
    dsl::Spec spec;
    spec.name = "masked";
    spec.mask_mod = mask;
    spec.score_mod = "score * 1.5";
    dsl::Diagnostics d;
    dsl::add_buffer(spec, "doc: i32[Skv]", "test", d);
    for (const Sizes& sz : {Sizes{1, 2, 1, 77, 77, 64}, Sizes{2, 2, 2, 9, 140, 24}}) {
      for (const std::string& isa : cpu::available_isas()) {
        cpu::configure({0, isa});
        Problem p = make_problem(spec, sz, seed++);
        Reference ref = reference(p, p.q, p.k, p.v);
        check_close(p, ref, run_cpu(p), 2e-4, describe(p) + " mask " + mask);
      }
    }
  }
}

TEST_CASE("CPU attention: tile values with data-dependent masks that empty tiles", "[cpu][attention][masked]") {
  SettingsGuard guard;
  // rel_h[..., kv // 64] is a Tile value; the document mask empties whole KV tiles next to
  // non-empty ones, so chunks end on tiles whose tile stage already ran.
  dsl::Spec spec;
  spec.name = "doc_tile_bias";
  spec.score_mod = "score + rel_h[b, h, q, kv // 64] * 2.0";
  spec.mask_mod = "doc[q] == doc[kv]";
  dsl::Diagnostics d;
  dsl::add_buffer(spec, "rel_h: f32[B, H, Sq, 64]", "test", d);
  dsl::add_buffer(spec, "doc: i32[Skv]", "test", d);
  uint64_t seed = 500;
  for (const std::string& isa : cpu::available_isas()) {
    for (bool aligned : {true, false}) {
      cpu::configure({0, isa});
      Problem p = make_problem(spec, {1, 2, 2, 300, 300, 24}, seed++);
      // Documents of exactly one KV tile, or of 40 to 100 positions: query tiles see full,
      // partial and emptied tiles side by side.
      std::vector<int32_t> doc(300);
      int32_t id = 0, left = 0;
      std::mt19937 rng(static_cast<uint32_t>(seed));
      for (auto& x : doc) {
        if (left-- <= 0) {
          ++id;
          left = aligned ? 63 : 40 + static_cast<int32_t>(rng() % 60);
        }
        x = id;
      }
      for (test::HostBuffer& b : p.buffers)
        if (b.name == "doc") std::memcpy(b.bytes.data(), doc.data(), doc.size() * 4);
      Reference ref = reference(p, p.q, p.k, p.v);
      check_close(p, ref, run_cpu(p), 2e-4, describe(p) + (aligned ? " tile-aligned documents" : " random documents"));
    }
  }
}

TEST_CASE("CPU attention: scale, a value head dim other than D, and a parameter", "[cpu][attention]") {
  dsl::Spec spec;
  spec.name = "alibi_window";
  spec.score_mod = "score + slope[h] * float(kv - q) + bonus";
  spec.mask_mod = "q - kv < window && kv <= q + 3";
  dsl::Diagnostics d;
  dsl::add_buffer(spec, "slope: f32[H]", "test", d);
  dsl::add_param(spec, "window: int", "test", d);
  dsl::add_param(spec, "bonus: float", "test", d);
  Problem p = make_problem(spec, {2, 6, 3, 45, 91, 64}, 7, /*dv=*/40);
  p.scale = 0.37f;
  p.params = {{"window", 19}, {"bonus", 0.25}};
  Reference ref = reference(p, p.q, p.k, p.v);
  check_close(p, ref, run_cpu(p), 2e-4, describe(p));
}

TEST_CASE("CPU attention: softcap with the vector and the scalar math library", "[cpu][attention]") {
  SettingsGuard guard;
  dsl::Spec spec = test::load_spec(test::gallery_dir() / "softcap.json");
  Problem p = make_problem(spec, {1, 2, 2, 70, 90, 64}, 17);
  p.scale = 4.0f;  // scores of tens, so the cap (30) bends them
  Reference ref = reference(p, p.q, p.k, p.v);
  for (bool exact : {false, true}) {
    cpu::CpuSettings st;
    st.exact_math = exact;
    cpu::configure(st);
    check_close(p, ref, run_cpu(p), 2e-4, describe(p) + (exact ? " scalar libm" : " libmvec"));
  }
}

TEST_CASE("CPU attention: strided operands", "[cpu][attention][strides]") {
  dsl::Spec spec = test::load_spec(test::gallery_dir() / "alibi_causal.json");
  Sizes s{2, 4, 2, 37, 51, 24};
  Problem p = make_problem(spec, s, 11);
  Reference ref = reference(p, p.q, p.k, p.v);
  cpu::install();
  std::shared_ptr<Kernel> kernel = Runtime().compile(p.spec);
  // q stored as [B, Sq, H, D]; k and v rows padded to 32; o as [B, Sq, H, D] with padding;
  // lse as [B, Sq, H] (last dimension of the [B, H, Sq] view must stay unit-stride: use padding instead).
  std::vector<float> q(static_cast<size_t>(s.B * s.Sq * s.H * s.D)), k(static_cast<size_t>(s.B * s.Hkv * s.Skv * 32)),
      v(static_cast<size_t>(s.B * s.Hkv * s.Skv * 32)), o(static_cast<size_t>(s.B * s.Sq * s.H * (s.D + 5)), kNanF),
      lse(static_cast<size_t>(s.B * s.H * (s.Sq + 3)), kNanF);
  for (int64_t b = 0; b < s.B; ++b)
    for (int64_t h = 0; h < s.H; ++h)
      for (int64_t i = 0; i < s.Sq; ++i)
        for (int64_t d = 0; d < s.D; ++d) q[static_cast<size_t>(((b * s.Sq + i) * s.H + h) * s.D + d)] = p.q[static_cast<size_t>(((b * s.H + h) * s.Sq + i) * s.D + d)];
  for (int64_t r = 0; r < s.B * s.Hkv * s.Skv; ++r)
    for (int64_t d = 0; d < s.D; ++d) {
      k[static_cast<size_t>(r * 32 + d)] = p.k[static_cast<size_t>(r * s.D + d)];
      v[static_cast<size_t>(r * 32 + d)] = p.v[static_cast<size_t>(r * s.D + d)];
    }
  AttentionArgs a;
  a.q = Tensor{q.data(), DType::F32, {s.B, s.H, s.Sq, s.D}, {s.Sq * s.H * s.D, s.D, s.H * s.D, 1}};
  a.k = Tensor{k.data(), DType::F32, {s.B, s.Hkv, s.Skv, s.D}, {s.Hkv * s.Skv * 32, s.Skv * 32, 32, 1}};
  a.v = Tensor{v.data(), DType::F32, {s.B, s.Hkv, s.Skv, s.D}, {s.Hkv * s.Skv * 32, s.Skv * 32, 32, 1}};
  a.o = Tensor{o.data(), DType::F32, {s.B, s.H, s.Sq, s.D}, {s.Sq * s.H * (s.D + 5), s.D + 5, s.H * (s.D + 5), 1}};
  a.lse = Tensor{lse.data(), DType::F32, {s.B, s.H, s.Sq}, {s.H * (s.Sq + 3), s.Sq + 3, 1}};
  std::vector<test::HostBuffer> buffers = p.buffers;
  for (test::HostBuffer& b : buffers) a.buffers.push_back({b.name, b.tensor()});
  a.device = Device::cpu();
  kernel->forward(a);
  Output out;
  for (int64_t b = 0; b < s.B; ++b)
    for (int64_t h = 0; h < s.H; ++h)
      for (int64_t i = 0; i < s.Sq; ++i) {
        for (int64_t d = 0; d < s.D; ++d) out.o.push_back(o[static_cast<size_t>(((b * s.Sq + i) * s.H + h) * (s.D + 5) + d)]);
        out.lse.push_back(lse[static_cast<size_t>((b * s.H + h) * (s.Sq + 3) + i)]);
      }
  check_close(p, ref, out, 2e-4, describe(p) + " strided");
}

TEST_CASE("CPU attention: fp16 and bf16 operands", "[cpu][attention][half]") {
  SettingsGuard guard;
  auto round_bf16 = [](float f) {
    uint32_t u;
    std::memcpy(&u, &f, 4);
    u = (u + 0x7fffu + ((u >> 16) & 1u)) & 0xffff0000u;
    std::memcpy(&f, &u, 4);
    return f;
  };
  auto to_bf16 = [](float f) {  // exact for values already rounded to bf16
    uint32_t u;
    std::memcpy(&u, &f, 4);
    return static_cast<uint16_t>(u >> 16);
  };
  auto from_bits = [](uint16_t h, bool half) {
    if (!half) {
      uint32_t u = static_cast<uint32_t>(h) << 16;
      float f;
      std::memcpy(&f, &u, 4);
      return f;
    }
    uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16, ex = (h >> 10) & 0x1fu, man = h & 0x3ffu;
    uint32_t u = ex == 0 ? 0 : sign | ((ex + 112) << 23) | (man << 13);
    float f;
    std::memcpy(&f, &u, 4);
    return ex == 0 ? std::ldexp(static_cast<float>(man), -24) * (sign ? -1.0f : 1.0f) : f;
  };
  // Halves from floats that are exact in fp16: k / 256 for |k| < 512 (normal halves).
  auto to_half = [](float f) {
    uint32_t u;
    std::memcpy(&u, &f, 4);
    if (f == 0) return static_cast<uint16_t>(0);
    return static_cast<uint16_t>(((u >> 16) & 0x8000u) | ((((u >> 23) & 0xffu) - 112) << 10) | ((u >> 13) & 0x3ffu));
  };
  for (bool half : {false, true}) {
    for (const std::string& isa : cpu::available_isas()) {
      cpu::configure({0, isa});
      dsl::Spec spec = test::load_spec(test::gallery_dir() / "sliding_window.json");
      Problem p = make_problem(spec, {1, 4, 2, 66, 131, 64}, 21);
      p.spec.dtype = half ? dsl::DType::F16 : dsl::DType::BF16;
      std::mt19937_64 rng(5);
      for (auto* t : {&p.q, &p.k, &p.v})
        for (float& x : *t) x = half ? static_cast<float>(static_cast<int>(rng() % 767) - 383) / 256.0f : round_bf16(x);
      Reference ref = reference(p, p.q, p.k, p.v);
      const Sizes& s = p.sz;
      std::vector<uint16_t> q, k, v, o(static_cast<size_t>(s.B * s.H * s.Sq * s.D), 0x7fc0);
      for (float x : p.q) q.push_back(half ? to_half(x) : to_bf16(x));
      for (float x : p.k) k.push_back(half ? to_half(x) : to_bf16(x));
      for (float x : p.v) v.push_back(half ? to_half(x) : to_bf16(x));
      std::vector<float> lse(static_cast<size_t>(s.B * s.H * s.Sq), kNanF);
      cpu::install();
      std::shared_ptr<Kernel> kernel = Runtime().compile(p.spec);
      AttentionArgs a;
      DType dt = p.spec.dtype;
      a.q = Tensor::contiguous(q.data(), dt, {s.B, s.H, s.Sq, s.D});
      a.k = Tensor::contiguous(k.data(), dt, {s.B, s.Hkv, s.Skv, s.D});
      a.v = Tensor::contiguous(v.data(), dt, {s.B, s.Hkv, s.Skv, s.D});
      a.o = Tensor::contiguous(o.data(), dt, {s.B, s.H, s.Sq, s.D});
      a.lse = Tensor::contiguous(lse.data(), DType::F32, {s.B, s.H, s.Sq});
      a.params = p.params;
      a.device = Device::cpu();
      kernel->forward(a);
      Output out;
      for (uint16_t x : o) out.o.push_back(from_bits(x, half));
      out.lse = lse;
      // O is rounded to 8 (bf16) or 11 (fp16) significant bits on output; LSE stays fp32.
      check_close(p, ref, out, half ? 1e-3 : 8e-3, describe(p) + (half ? " fp16" : " bf16"));
      for (size_t i = 0; i < lse.size(); ++i)
        if (std::isfinite(ref.lse[i])) CHECK(std::abs(lse[i] - ref.lse[i]) <= 2e-4 * std::max(1.0, std::abs(ref.lse[i])));
    }
  }
}

TEST_CASE("CPU attention: out-of-range loads are reported naming the buffer", "[cpu][attention][errors]") {
  dsl::Spec spec;
  spec.name = "oob";
  spec.score_mod = "score + bias[kv]";
  dsl::Diagnostics d;
  dsl::add_buffer(spec, "bias: f32[16]", "test", d);
  Problem p = make_problem(spec, {1, 2, 2, 5, 40, 24}, 3);
  try {
    run_cpu(p);
    FAIL("expected an error for bias[kv] with kv up to 39 and 16 entries");
  } catch (const Error& e) {
    std::string m = e.what();
    INFO(m);
    CHECK(m.find("bias") != std::string::npos);
    CHECK(m.find("out of range") != std::string::npos);
  }
  // Guarded: the interpreter never evaluates the load where it would be out of range.
  spec.score_mod = "score + where(kv < 16, bias[kv], 0.0)";
  Problem g = make_problem(spec, {1, 2, 2, 5, 40, 24}, 3);
  Reference ref = reference(g, g.q, g.k, g.v);
  check_close(g, ref, run_cpu(g), 2e-4, describe(g));
  // Masked-out elements do not evaluate score_mod either.
  spec.mask_mod = "kv < 16";
  spec.score_mod = "score + bias[kv]";
  Problem m = make_problem(spec, {1, 2, 2, 5, 40, 24}, 3);
  Reference mref = reference(m, m.q, m.k, m.v);
  check_close(m, mref, run_cpu(m), 2e-4, describe(m));
}

TEST_CASE("CPU attention: the JIT runs once per spec across launches", "[cpu][attention]") {
  dsl::Spec spec = test::load_spec(test::gallery_dir() / "prefix_lm.json");
  Problem p = make_problem(spec, {1, 2, 2, 20, 30, 24}, 9);
  run_cpu(p);
  size_t compiles = cpu::jit_compile_count();
  Problem p2 = make_problem(spec, {2, 2, 1, 50, 10, 24}, 10);  // new sizes and a new Runtime: same module
  run_cpu(p2);
  CHECK(cpu::jit_compile_count() == compiles);
}

TEST_CASE("CPU attention: argument errors are reported", "[cpu][attention][errors]") {
  dsl::Spec spec = test::load_spec(test::gallery_dir() / "document.json");
  Problem p = make_problem(spec, {1, 2, 2, 8, 8, 24}, 1);
  p.buffers.clear();
  CHECK_THROWS_WITH(run_cpu(p), Catch::Contains("doc"));
  SettingsGuard guard;
  CHECK_THROWS_WITH(cpu::configure({0, "sse9"}), Catch::Contains("unknown instruction set"));
}

TEST_CASE("CPU attention: random masks and score mods through the executor", "[cpu][attention][random]") {
  // Random IR straight into the CpuExecutor seam (the public API takes text). Where the CPU
  // reports an error, the interpreter must have flagged some point too (the CPU evaluates a
  // subset of the points, with the interpreter's short-circuit rules); otherwise O and LSE
  // must match the reference wherever it is finite.
  cpu::install();
  std::shared_ptr<CpuExecutor> exec = cpu_executor();
  REQUIRE(exec);
  SpecIR base = test::random_ir_spec();
  const dsl::CheckedSpec& cs = base.checked;
  const Sizes sz{1, 4, 2, 45, 70, 24};
  int compared = 0, reported = 0;
  for (uint64_t seed = 1; seed <= 40; ++seed) {
    test::RandomIR gen(seed * 31337, /*int_heavy=*/seed % 3 != 0);
    ir::Expr mask;
    for (int tries = 0; tries < 16 && !mask; ++tries) {
      ir::Expr m = gen.gen(ir::Type::Bool, 2 + static_cast<int>(seed % 3));
      bool uses_score = false;
      ir::for_each_node(m, [&](const ir::Expr& n) {
        if (const ir::Var* v = n.as<ir::Var>()) uses_score |= v->var == dsl::VarId::Score;
      });
      if (!uses_score) mask = m;
    }
    ir::Expr score = seed % 2 ? gen.gen(ir::Type::Float, 2) : ir::Expr();
    SpecIR s = optimize(SpecIR{cs, score, mask});
    std::mt19937_64 rng(seed);
    std::vector<int32_t> ti(static_cast<size_t>(sz.Skv));
    std::vector<float> tf(64);
    std::vector<uint8_t> tb(static_cast<size_t>(sz.Sq)), tu(static_cast<size_t>(sz.Skv));
    std::vector<uint16_t> th(static_cast<size_t>(sz.H * 16));
    for (auto& x : ti) x = static_cast<int32_t>(gen.range(-12, 80));
    for (auto& x : tf) x = static_cast<float>(gen.range(-40, 40)) / 8.0f;
    for (auto& x : tb) x = static_cast<uint8_t>(gen.range(0, 1));
    for (auto& x : tu) x = static_cast<uint8_t>(gen.range(0, 255));
    for (auto& x : th) x = test::float_to_bf16_bits(static_cast<float>(gen.range(-40, 40)) / 8.0f);
    std::vector<std::pair<std::string, double>> params = {
        {"pi", static_cast<double>(gen.range(-10, 70))}, {"pf", static_cast<double>(gen.range(-20, 20)) / 4.0}, {"pb", double(gen.range(0, 1))}};
    Problem p;
    p.sz = sz;
    p.Dv = sz.D;
    p.spec = s.spec();
    std::uniform_real_distribution<float> u(-1.5f, 1.5f);
    p.q.resize(static_cast<size_t>(sz.B * sz.H * sz.Sq * sz.D));
    p.k.resize(static_cast<size_t>(sz.B * sz.Hkv * sz.Skv * sz.D));
    p.v.resize(p.k.size());
    for (auto* t : {&p.q, &p.k, &p.v})
      for (float& x : *t) x = u(rng);
    EvalEnv env;
    env.symbols = test::symbols(cs, {{"B", sz.B}, {"H", sz.H}, {"Hkv", sz.Hkv}, {"Sq", sz.Sq}, {"Skv", sz.Skv}, {"D", sz.D}});
    env.params = {Value::of_int(static_cast<int64_t>(params[0].second)), Value::of_float(static_cast<float>(params[1].second)),
                  Value::of_bool(params[2].second != 0)};
    env.buffers = {test::view(dsl::DType::I32, ti, {sz.Skv}), test::view(dsl::DType::F32, tf, {64}), test::view(dsl::DType::Bool, tb, {sz.Sq}),
                   test::view(dsl::DType::BF16, th, {sz.H, 16}), test::view(dsl::DType::U8, tu, {sz.Skv})};
    // Did the interpreter flag anything at any point (mask everywhere, score_mod where kept)?
    bool interpreter_flagged = false;
    for (int64_t h = 0; h < sz.H && !interpreter_flagged; ++h)
      for (int64_t qi = 0; qi < sz.Sq && !interpreter_flagged; ++qi)
        for (int64_t kv = 0; kv < sz.Skv && !interpreter_flagged; ++kv) {
          EvalEnv e = env;
          e.vars[int(dsl::VarId::B)] = 0;
          e.vars[int(dsl::VarId::H)] = h;
          e.vars[int(dsl::VarId::KvHead)] = h / 2;
          e.vars[int(dsl::VarId::Q)] = qi;
          e.vars[int(dsl::VarId::KV)] = kv;
          EvalFlags f;
          bool keep = !s.mask_mod || evaluate(s.mask_mod, e, &f).b;
          if (keep && s.score_mod) {
            e.score = 0.5f;
            evaluate(s.score_mod, e, &f);
          }
          interpreter_flagged = f.index_out_of_range || f.int_div_by_zero;
        }
    Output out;
    out.o.assign(static_cast<size_t>(sz.B * sz.H * sz.Sq * sz.D), kNanF);
    out.lse.assign(static_cast<size_t>(sz.B * sz.H * sz.Sq), kNanF);
    AttentionArgs a;
    a.q = Tensor::contiguous(p.q.data(), DType::F32, {sz.B, sz.H, sz.Sq, sz.D});
    a.k = Tensor::contiguous(p.k.data(), DType::F32, {sz.B, sz.Hkv, sz.Skv, sz.D});
    a.v = Tensor::contiguous(p.v.data(), DType::F32, {sz.B, sz.Hkv, sz.Skv, sz.D});
    a.o = Tensor::contiguous(out.o.data(), DType::F32, {sz.B, sz.H, sz.Sq, sz.D});
    a.lse = Tensor::contiguous(out.lse.data(), DType::F32, {sz.B, sz.H, sz.Sq});
    a.buffers = {{"ti", Tensor::contiguous(ti.data(), DType::I32, {sz.Skv})}, {"tf", Tensor::contiguous(tf.data(), DType::F32, {64})},
                 {"tb", Tensor::contiguous(tb.data(), DType::Bool, {sz.Sq})}, {"th", Tensor::contiguous(th.data(), DType::BF16, {sz.H, 16})},
                 {"tu", Tensor::contiguous(tu.data(), DType::U8, {sz.Skv})}};
    a.params = params;
    a.device = Device::cpu();
    std::string what = "seed " + std::to_string(seed) + " mask " + (s.mask_mod ? ir::print_inline(s.mask_mod) : "none") + " score " +
                       (s.score_mod ? ir::print_inline(s.score_mod) : "none");
    p.spec.dtype = DType::F32;
    p.spec.head_dim = static_cast<int>(sz.D);
    SpecIR run_ir = s;
    run_ir.checked.spec.dtype = DType::F32;
    run_ir.checked.spec.head_dim = static_cast<int>(sz.D);
    try {
      exec->forward(run_ir, a);
    } catch (const Error& e) {
      INFO(what << "\n" << e.what());
      CHECK(interpreter_flagged);
      ++reported;
      continue;
    }
    Reference ref = reference(s, env, p, p.q, p.k, p.v);
    bool finite = true;
    for (double x : ref.o) finite &= std::isfinite(x);
    for (double x : ref.lse) finite &= std::isfinite(x) || x == -kInfD;
    if (!finite) continue;
    ++compared;
    check_close(p, ref, out, 2e-4, what);
  }
  INFO("compared " << compared << ", errors reported " << reported);
  CHECK(compared >= 10);
}
