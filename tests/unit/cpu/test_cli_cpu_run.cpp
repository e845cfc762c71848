// `flexjit run --device cpu` end to end, as a user runs it: .npy files in, .npy files out,
// compared with a float64 reference computed here, fully masked rows included.
#include <catch2/catch.hpp>
#include <cstdio>
#include <filesystem>
#include <random>

#include "runtime/npy.h"
#include "support/attention_reference.h"
#include "support/attention_reference_backward.h"
#include "support/spec_loading.h"

using namespace flexjit;

namespace {

NpyArray random_f32(std::vector<int64_t> shape, std::mt19937& rng) {
  NpyArray a;
  a.dtype = dsl::DType::F32;
  a.shape = std::move(shape);
  a.data.resize(static_cast<size_t>(a.numel()) * 4);
  std::normal_distribution<float> nd(0.f, 1.f);
  for (int64_t i = 0; i < a.numel(); ++i) a.as<float>()[i] = nd(rng);
  return a;
}

std::vector<float> floats(const NpyArray& a) { return std::vector<float>(a.as<float>(), a.as<float>() + a.numel()); }

// The float64 forward and backward of an f32 spec with one f32 [H] buffer (the slopes) that requires a gradient.
void alibi_reference(const std::filesystem::path& spec_path, const test::RefShape& shape, const NpyArray& q, const NpyArray& k,
                     const NpyArray& v, const NpyArray& d_o, NpyArray& slope, test::RefResult* fwd_out, test::RefBackward* bwd_out) {
  dsl::Spec spec = test::load_spec(spec_path);
  spec.dtype = dsl::DType::F32;
  spec.head_dim = static_cast<int>(shape.D);
  spec.buffers[0].requires_grad = true;
  SpecIR ir = build_spec_ir(spec);
  EvalEnv env;
  env.symbols = {shape.B, shape.H, shape.Hkv, shape.Sq, shape.Skv, shape.D};
  env.symbols.resize(ir.checked.symbols.size(), 1);
  env.buffers = {BufferView{dsl::DType::F32, slope.data.data(), {shape.H}, {1}}};
  const double scale = 1.0 / std::sqrt(double(shape.D));
  test::RefResult fwd = test::reference_attention(ir, shape, floats(q), floats(k), floats(v), env, scale);
  *bwd_out = test::reference_backward(ir, shape, floats(q), floats(k), floats(v), floats(d_o), fwd.o, fwd.lse, env, scale);
  if (fwd_out) *fwd_out = std::move(fwd);
}

}  // namespace

TEST_CASE("flexjit run --device cpu matches a float64 reference", "[cpu][cli]") {
  namespace fs = std::filesystem;
  fs::path dir = fs::temp_directory_path() / ("flexjit-cpu-run-" + std::to_string(::getpid()));
  fs::create_directories(dir);
  struct Case {
    const char* spec;
    int64_t B, H, Hkv, Sq, Skv, D;
  };
  for (const Case& c : {Case{"causal.json", 2, 4, 2, 33, 47, 24}, Case{"softcap.json", 1, 2, 2, 17, 100, 80},
                        Case{"alibi_causal.json", 1, 8, 2, 40, 40, 64}}) {
    INFO(c.spec);
    std::mt19937 rng(42);
    NpyArray q = random_f32({c.B, c.H, c.Sq, c.D}, rng), k = random_f32({c.B, c.Hkv, c.Skv, c.D}, rng),
             v = random_f32({c.B, c.Hkv, c.Skv, c.D}, rng), slope = random_f32({c.H}, rng);
    write_npy((dir / "q.npy").string(), q);
    write_npy((dir / "k.npy").string(), k);
    write_npy((dir / "v.npy").string(), v);
    write_npy((dir / "slope.npy").string(), slope);
    dsl::Spec spec = test::load_spec(test::gallery_dir() / c.spec);
    std::string cmd = test::cli_path() + " run " + (test::gallery_dir() / c.spec).string() + " --device cpu --q " + (dir / "q.npy").string() +
                      " --k " + (dir / "k.npy").string() + " --v " + (dir / "v.npy").string() + " --out " + (dir / "o.npy").string() +
                      " --lse " + (dir / "lse.npy").string();
    if (!spec.buffers.empty()) cmd += " --load slope=" + (dir / "slope.npy").string();
    REQUIRE(std::system(cmd.c_str()) == 0);
    NpyArray o = read_npy((dir / "o.npy").string()), lse = read_npy((dir / "lse.npy").string());
    spec.dtype = dsl::DType::F32;
    spec.head_dim = static_cast<int>(c.D);
    SpecIR ir = build_spec_ir(spec);
    EvalEnv env;
    env.symbols = {c.B, c.H, c.Hkv, c.Sq, c.Skv, c.D};
    env.symbols.resize(ir.checked.symbols.size(), 1);
    env.params.resize(spec.params.size());
    for (size_t i = 0; i < spec.params.size(); ++i) env.params[i] = Value::of_float(static_cast<float>(spec.params[i].float_value));
    if (!spec.buffers.empty()) env.buffers = {BufferView{dsl::DType::F32, slope.data.data(), {c.H}, {1}}};
    test::RefResult ref = test::reference_attention(ir, {c.B, c.H, c.Hkv, c.Sq, c.Skv, c.D, c.D}, floats(q), floats(k), floats(v), env,
                                                    1.0 / std::sqrt(double(c.D)));
    test::Comparison co = test::compare(floats(o), ref.o), cl = test::compare(floats(lse), ref.lse);
    INFO("O rel " << co.rel_l2 << " bad " << co.bad << "; LSE rel " << cl.rel_l2 << " bad " << cl.bad);
    CHECK(co.bad == 0);
    CHECK(cl.bad == 0);
    CHECK(co.rel_l2 <= 2e-4);
    CHECK(cl.rel_l2 <= 2e-4);
  }
  // A mask that hides every key from the first rows: O = 0 and LSE = -inf there.
  std::mt19937 rng(7);
  write_npy((dir / "q.npy").string(), random_f32({1, 1, 20, 32}, rng));
  write_npy((dir / "k.npy").string(), random_f32({1, 1, 20, 32}, rng));
  write_npy((dir / "v.npy").string(), random_f32({1, 1, 20, 32}, rng));
  std::string cmd = test::cli_path() + " run --mask 'kv <= q - 5' --device cpu --q " + (dir / "q.npy").string() + " --k " +
                    (dir / "k.npy").string() + " --v " + (dir / "v.npy").string() + " --out " + (dir / "o.npy").string() + " --lse " +
                    (dir / "lse.npy").string();
  REQUIRE(std::system(cmd.c_str()) == 0);
  NpyArray lse = read_npy((dir / "lse.npy").string()), o = read_npy((dir / "o.npy").string());
  for (int r = 0; r < 5; ++r) {
    CHECK(std::isinf(lse.as<float>()[r]));
    CHECK(lse.as<float>()[r] < 0);
    for (int d = 0; d < 32; ++d) CHECK(o.as<float>()[r * 32 + d] == 0.f);
  }
  CHECK(std::isfinite(lse.as<float>()[5]));
  fs::remove_all(dir);
}

TEST_CASE("flexjit run --backward --device cpu writes gradients that match a float64 reference", "[cpu][cli][backward]") {
  namespace fs = std::filesystem;
  fs::path dir = fs::temp_directory_path() / ("flexjit-cpu-bwd-" + std::to_string(::getpid()));
  fs::create_directories(dir);
  const int64_t B = 1, H = 4, Hkv = 2, Sq = 37, Skv = 45, D = 32;
  std::mt19937 rng(11);
  NpyArray q = random_f32({B, H, Sq, D}, rng), k = random_f32({B, Hkv, Skv, D}, rng), v = random_f32({B, Hkv, Skv, D}, rng),
           d_o = random_f32({B, H, Sq, D}, rng), slope = random_f32({H}, rng);
  for (auto& [name, a] : std::vector<std::pair<const char*, NpyArray*>>{{"q", &q}, {"k", &k}, {"v", &v}, {"do", &d_o}, {"slope", &slope}})
    write_npy((dir / (std::string(name) + ".npy")).string(), *a);
  auto file = [&](const char* name) { return (dir / name).string(); };
  fs::path spec_path = test::gallery_dir() / "alibi_causal.json";
  std::string cmd = test::cli_path() + " run " + spec_path.string() + " --device cpu --q " + file("q.npy") + " --k " + file("k.npy") +
                    " --v " + file("v.npy") + " --load slope=" + file("slope.npy") + " --out " + file("o.npy") + " --backward --do " +
                    file("do.npy") + " --dq " + file("dq.npy") + " --dk " + file("dk.npy") + " --dv " + file("dv.npy") +
                    " --grad slope=" + file("dslope.npy");
  REQUIRE(std::system(cmd.c_str()) == 0);

  test::RefBackward ref;
  alibi_reference(spec_path, {B, H, Hkv, Sq, Skv, D, D}, q, k, v, d_o, slope, nullptr, &ref);
  for (const auto& [name, want] : std::vector<std::pair<const char*, const std::vector<double>*>>{
           {"dq.npy", &ref.dq}, {"dk.npy", &ref.dk}, {"dv.npy", &ref.dv}, {"dslope.npy", &ref.grads[0]}}) {
    NpyArray got = read_npy(file(name));
    test::Comparison c = test::compare(floats(got), *want);
    INFO(name << ": rel " << c.rel_l2 << " bad " << c.bad);
    CHECK(got.numel() == static_cast<int64_t>(want->size()));
    CHECK(c.bad == 0);
    CHECK(c.rel_l2 <= 1e-4);
  }
  // --grad without --backward, and a gradient for a buffer the spec lacks, are errors.
  std::string bad = test::cli_path() + " run " + spec_path.string() + " --device cpu --q " + file("q.npy") + " --k " + file("k.npy") +
                    " --v " + file("v.npy") + " --load slope=" + file("slope.npy") + " --out " + file("o.npy");
  CHECK(std::system((bad + " --grad slope=" + file("x.npy") + " 2>/dev/null").c_str()) != 0);
  CHECK(std::system((bad + " --backward --do " + file("do.npy") + " --dq " + file("dq.npy") + " --dk " + file("dk.npy") + " --dv " +
                     file("dv.npy") + " --grad slop=" + file("x.npy") + " 2>/dev/null")
                        .c_str()) != 0);
  fs::remove_all(dir);
}

TEST_CASE("flexjit run --ring R --backward --device cpu: ring attention over virtual ranks matches a float64 reference",
          "[cpu][cli][ring]") {
  namespace fs = std::filesystem;
  fs::path dir = fs::temp_directory_path() / ("flexjit-cpu-ring-" + std::to_string(::getpid()));
  fs::create_directories(dir);
  const int64_t B = 1, H = 4, Hkv = 2, S = 45, D = 32;  // 45 positions: no multiple of 2R
  std::mt19937 rng(12);
  NpyArray q = random_f32({B, H, S, D}, rng), k = random_f32({B, Hkv, S, D}, rng), v = random_f32({B, Hkv, S, D}, rng),
           d_o = random_f32({B, H, S, D}, rng), slope = random_f32({H}, rng), k_short = random_f32({B, Hkv, S - 1, D}, rng);
  for (auto& [name, a] : std::vector<std::pair<const char*, NpyArray*>>{
           {"q", &q}, {"k", &k}, {"v", &v}, {"do", &d_o}, {"slope", &slope}, {"k_short", &k_short}})
    write_npy((dir / (std::string(name) + ".npy")).string(), *a);
  auto file = [&](const char* name) { return (dir / name).string(); };
  fs::path spec_path = test::gallery_dir() / "alibi_causal.json";
  auto command = [&](const std::string& k_file, const std::string& ring) {
    return test::cli_path() + " run " + spec_path.string() + " --device cpu --q " + file("q.npy") + " --k " + k_file + " --v " +
           file("v.npy") + " --load slope=" + file("slope.npy") + " --out " + file("o.npy") + " --lse " + file("lse.npy") +
           " --backward --do " + file("do.npy") + " --dq " + file("dq.npy") + " --dk " + file("dk.npy") + " --dv " + file("dv.npy") +
           " --grad slope=" + file("dslope.npy") + " " + ring;
  };

  test::RefResult fwd;
  test::RefBackward ref;
  alibi_reference(spec_path, {B, H, Hkv, S, S, D, D}, q, k, v, d_o, slope, &fwd, &ref);
  for (const std::string ring : {"--ring 2", "--ring 3", "--ring 3 --ring-sharding contiguous"}) {
    for (const char* out : {"o.npy", "lse.npy", "dq.npy", "dk.npy", "dv.npy", "dslope.npy"}) fs::remove(file(out));
    REQUIRE(std::system(command(file("k.npy"), ring).c_str()) == 0);
    for (const auto& [name, want] : std::vector<std::pair<const char*, const std::vector<double>*>>{{"o.npy", &fwd.o},
                                                                                                   {"lse.npy", &fwd.lse},
                                                                                                   {"dq.npy", &ref.dq},
                                                                                                   {"dk.npy", &ref.dk},
                                                                                                   {"dv.npy", &ref.dv},
                                                                                                   {"dslope.npy", &ref.grads[0]}}) {
      NpyArray got = read_npy(file(name));
      test::Comparison c = test::compare(floats(got), *want);
      INFO(ring << ", " << name << ": rel " << c.rel_l2 << " bad " << c.bad);
      CHECK(got.numel() == static_cast<int64_t>(want->size()));
      CHECK(c.bad == 0);
      CHECK(c.rel_l2 <= 1e-4);
    }
  }
  // One sequence only (q and k of one length), and a known sharding.
  CHECK(std::system((command(file("k_short.npy"), "--ring 2") + " 2>/dev/null").c_str()) != 0);
  CHECK(std::system((command(file("k.npy"), "--ring 2 --ring-sharding diagonal") + " 2>/dev/null").c_str()) != 0);
  fs::remove_all(dir);
}
