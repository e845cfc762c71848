// Plain attention (a spec with no mods) as a new user first runs it: `flexjit run` with only
// q, k and v on the CPU, and the C++ and C APIs with an empty spec, against float64.
#include <catch2/catch.hpp>

#include <filesystem>
#include <cstring>
#include <random>

#include "compiler/frontend.h"
#include "runtime/capi/flexjit.h"
#include "runtime/cpu/cpu_backend.h"
#include "runtime/flexjit.hpp"
#include "runtime/npy.h"
#include "support/attention_reference.h"
#include "support/shell.h"
#include "support/test_paths.h"

using namespace flexjit;

namespace {

struct Inputs {
  test::RefShape s;
  std::vector<float> q, k, v;
};

Inputs random_inputs(test::RefShape s, unsigned seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd(0.f, 1.f);
  Inputs in{s, {}, {}, {}};
  auto fill = [&](std::vector<float>& x, int64_t n) {
    x.resize(static_cast<size_t>(n));
    for (float& e : x) e = nd(rng);
  };
  fill(in.q, s.B * s.H * s.Sq * s.D);
  fill(in.k, s.B * s.Hkv * s.Skv * s.D);
  fill(in.v, s.B * s.Hkv * s.Skv * s.Dv);
  return in;
}

test::RefResult plain_reference(const Inputs& in) {
  SpecIR ir = build_spec_ir(dsl::Spec{});
  EvalEnv env;
  env.symbols = {in.s.B, in.s.H, in.s.Hkv, in.s.Sq, in.s.Skv, in.s.D};
  env.symbols.resize(ir.checked.symbols.size(), 1);
  return test::reference_attention(ir, in.s, in.q, in.k, in.v, env, 1.0 / std::sqrt(double(in.s.D)));
}

NpyArray f32_array(const std::vector<float>& x, std::vector<int64_t> shape) {
  NpyArray a;
  a.dtype = dsl::DType::F32;
  a.shape = std::move(shape);
  a.data.resize(x.size() * 4);
  std::memcpy(a.data.data(), x.data(), a.data.size());
  return a;
}

void check_matches(const std::vector<float>& o, const std::vector<float>& lse, const test::RefResult& ref) {
  test::Comparison co = test::compare(o, ref.o), cl = test::compare(lse, ref.lse);
  INFO("O rel " << co.rel_l2 << " bad " << co.bad << "; LSE rel " << cl.rel_l2 << " bad " << cl.bad);
  CHECK(co.bad == 0);
  CHECK(cl.bad == 0);
  CHECK(co.rel_l2 <= 2e-5);
  CHECK(cl.rel_l2 <= 2e-5);
}

}  // namespace

TEST_CASE("flexjit run with no spec and no mods is plain attention and matches float64", "[cpu][cli]") {
  namespace fs = std::filesystem;
  const Inputs in = random_inputs({2, 4, 2, 29, 41, 32, 32}, 5);
  fs::path dir = fs::temp_directory_path() / ("flexjit-plain-run-" + std::to_string(::getpid()));
  fs::create_directories(dir);
  auto file = [&](const char* name) { return (dir / name).string(); };
  write_npy(file("q.npy"), f32_array(in.q, {in.s.B, in.s.H, in.s.Sq, in.s.D}));
  write_npy(file("k.npy"), f32_array(in.k, {in.s.B, in.s.Hkv, in.s.Skv, in.s.D}));
  write_npy(file("v.npy"), f32_array(in.v, {in.s.B, in.s.Hkv, in.s.Skv, in.s.Dv}));
  test::ShellResult r = test::run_shell(test::cli_path() + " run --q " + file("q.npy") + " --k " + file("k.npy") + " --v " + file("v.npy") +
                                        " --out " + file("o.npy") + " --lse " + file("lse.npy") + " --device cpu");
  INFO(r.out);
  REQUIRE(r.status == 0);
  NpyArray o = read_npy(file("o.npy")), lse = read_npy(file("lse.npy"));
  REQUIRE(o.dtype == dsl::DType::F32);
  check_matches(std::vector<float>(o.as<float>(), o.as<float>() + o.numel()), std::vector<float>(lse.as<float>(), lse.as<float>() + lse.numel()),
                plain_reference(in));
  // The other commands still ask for a spec: a forgotten file is an error, not plain attention.
  test::ShellResult check = test::run_shell(test::cli_path() + " check");
  CHECK(check.status == 1);
  CHECK(check.out.find("no spec given") != std::string::npos);
  fs::remove_all(dir);
}

TEST_CASE("the C++ and C APIs run an empty spec as plain attention", "[cpu][api]") {
  cpu::install();
  const Inputs in = random_inputs({1, 2, 1, 23, 37, 16, 16}, 9);
  const test::RefResult ref = plain_reference(in);
  const size_t o_size = static_cast<size_t>(in.s.B * in.s.H * in.s.Sq * in.s.Dv), lse_size = static_cast<size_t>(in.s.B * in.s.H * in.s.Sq);
  std::vector<float> q = in.q, k = in.k, v = in.v;
  {
    dsl::Spec spec;
    spec.dtype = dsl::DType::F32;
    spec.head_dim = static_cast<int>(in.s.D);
    Runtime rt;
    auto kernel = rt.compile(spec);
    std::vector<float> o(o_size), lse(lse_size);
    AttentionArgs a;
    a.q = Tensor::contiguous(q.data(), DType::F32, {in.s.B, in.s.H, in.s.Sq, in.s.D});
    a.k = Tensor::contiguous(k.data(), DType::F32, {in.s.B, in.s.Hkv, in.s.Skv, in.s.D});
    a.v = Tensor::contiguous(v.data(), DType::F32, {in.s.B, in.s.Hkv, in.s.Skv, in.s.Dv});
    a.o = Tensor::contiguous(o.data(), DType::F32, {in.s.B, in.s.H, in.s.Sq, in.s.Dv});
    a.lse = Tensor::contiguous(lse.data(), DType::F32, {in.s.B, in.s.H, in.s.Sq});
    a.device = Device::cpu();
    kernel->forward(a);
    check_matches(o, lse, ref);
  }
  {
    flexjit_runtime* rt = nullptr;
    flexjit_kernel* kernel = nullptr;
    flexjit_args* a = nullptr;
    REQUIRE(flexjit_runtime_create(&rt) == FLEXJIT_OK);
    INFO(flexjit_last_error());
    REQUIRE(flexjit_compile(rt, "{\"dtype\": \"fp32\", \"head_dim\": 16}", &kernel) == FLEXJIT_OK);
    std::vector<float> o(o_size), lse(lse_size);
    REQUIRE(flexjit_args_create(&a) == FLEXJIT_OK);
    REQUIRE(flexjit_args_set_qkvo(a, q.data(), k.data(), v.data(), o.data(), FLEXJIT_F32, in.s.B, in.s.H, in.s.Hkv, in.s.Sq, in.s.Skv,
                                  in.s.D) == FLEXJIT_OK);
    REQUIRE(flexjit_args_set_lse(a, lse.data()) == FLEXJIT_OK);
    REQUIRE(flexjit_args_set_stream(a, nullptr, -2) == FLEXJIT_OK);
    REQUIRE(flexjit_forward(kernel, a) == FLEXJIT_OK);
    check_matches(o, lse, ref);
    flexjit_args_destroy(a);
    flexjit_kernel_destroy(kernel);
    flexjit_runtime_destroy(rt);
  }
}
