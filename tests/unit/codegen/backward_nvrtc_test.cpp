// The backward module of every gallery spec and of the learnable-buffer specs (tests/data/backward)
// compiles through NVRTC for sm_80 and sm_90a, without a GPU; the scatter classes are the expected ones.
#include <catch2/catch.hpp>

#include "compiler/codegen/backward_source.h"
#include "compiler/frontend.h"
#include "compiler/passes/autodiff.h"
#include "runtime/kernel_compiler.h"
#include "support/spec_loading.h"

using namespace flexjit;

namespace {

std::filesystem::path backward_data_dir() { return test::source_dir() / "tests" / "data" / "backward"; }

BackwardKernelSource make_source(const SpecIR& ir, bool deterministic, int head_dim) {
  ScoreModGradient grad = differentiate_score_mod(ir);
  RangeInfo ranges = analyze_ranges(backward_roots(grad), ir.checked, VarDomains::forward(ir.checked));
  BackwardKernelOptions bo;
  bo.dtype = ir.spec().dtype;
  bo.head_dim = head_dim;
  bo.deterministic = deterministic;
  return backward_kernel_source(ir, grad, ranges, bo);
}

void compile_all(const std::vector<std::filesystem::path>& specs) {
  for (const auto& path : specs) {
    dsl::Spec spec = test::load_spec(path);
    SpecIR ir = build_spec_ir(spec);
    BackwardKernelSource bs = make_source(ir, false, spec.head_dim);
    for (const char* arch : {"sm_80", "sm_90a"}) {
      INFO(spec.name << " for " << arch << "\n" << bs.module.source);
      runtime::CacheLookup r = runtime::compile_kernel(bs.module, canonical_ir_text(ir), arch);
      REQUIRE(r.artefact);
      CHECK(r.artefact->binary.size() > 1000);
    }
  }
}

}  // namespace

TEST_CASE("every gallery backward module compiles for sm_80 and sm_90a", "[nvrtc][backward]") { compile_all(test::gallery_specs()); }

TEST_CASE("the learnable-buffer backward modules compile, deterministic and other head dims too", "[nvrtc][backward]") {
  std::vector<std::filesystem::path> specs;
  for (const auto& e : std::filesystem::directory_iterator(backward_data_dir()))
    if (e.path().extension() == ".json") specs.push_back(e.path());
  std::sort(specs.begin(), specs.end());
  compile_all(specs);
  // Deterministic mode, fp16, and the 8-warp D-split configuration (D = 256, sm_90a only: its shared
  // memory is for sm_90's limit as well as A100's).
  dsl::Spec spec = test::load_spec(backward_data_dir() / "learnable_bias.json");
  spec.dtype = dsl::DType::F16;
  SpecIR ir = build_spec_ir(spec);
  for (int d : {80, 256}) {
    BackwardKernelSource bs = make_source(ir, true, d);
    INFO(bs.module.source);
    runtime::CacheLookup r = runtime::compile_kernel(bs.module, canonical_ir_text(ir), "sm_80");
    CHECK(r.artefact->binary.size() > 1000);
  }
}

TEST_CASE("scatter classes follow the index dependence", "[backward]") {
  auto classes = [](const char* file) {
    SpecIR ir = build_spec_ir(test::load_spec(backward_data_dir() / file));
    std::vector<ScatterClass> out;
    for (const GradScatter& s : differentiate_score_mod(ir).scatters) out.push_back(classify_scatter(s));
    return out;
  };
  CHECK(classes("alibi_learnable.json") == std::vector<ScatterClass>{ScatterClass::Uniform});
  CHECK(classes("learnable_bias.json") == std::vector<ScatterClass>{ScatterClass::Diagonal});
  CHECK(classes("offset_bias_learnable.json") == std::vector<ScatterClass>{ScatterClass::QOnly});
  CHECK(classes("softcap_bias_learnable.json") == std::vector<ScatterClass>{ScatterClass::KvOnly});
  CHECK(classes("sam_learnable.json") == std::vector<ScatterClass>{ScatterClass::General, ScatterClass::General});
}
