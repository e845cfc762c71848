// Every generated kernel of the gallery compiles through NVRTC for sm_80 and sm_90a,
// without a GPU. Results go through the build tree's kernel cache, so one test run
// compiles each kernel once and a rerun is fast.
#include <catch2/catch.hpp>
#include <fmt/format.h>

#include "compiler/codegen/kernel_source.h"
#include "compiler/ir_report.h"
#include "runtime/kernel_compiler.h"
#include "runtime/nvrtc.h"
#include "support/spec_loading.h"
#include "support/warp_specialized_ptx.h"

using namespace flexjit;

TEST_CASE("every gallery forward kernel compiles for sm_80 and for sm_90a with the warp-specialised kernel", "[nvrtc]") {
  for (const auto& path : test::gallery_specs()) {
    dsl::Spec spec = test::load_spec(path);
    SpecIR ir = build_spec_ir(spec);
    ForwardKernelOptions fo;
    fo.dtype = spec.dtype;
    fo.head_dim = spec.head_dim;
    for (const char* arch : {"sm_80", "sm_90a"}) {
      INFO(spec.name << " for " << arch);
      fo.arch = arch;
      KernelSource ks = forward_kernel_source(ir, analyze_ir_ranges(ir), fo);
      CHECK(ks.config.warp_specialized == (std::string(arch) == "sm_90a" && spec.head_dim >= 64));
      runtime::CacheLookup r = runtime::compile_kernel(ks, canonical_ir_text(ir), arch);
      REQUIRE(r.artefact);
      REQUIRE(r.artefact->binary.size() > 1000);
      CHECK(r.artefact->binary[0] == 0x7f);
      CHECK(r.artefact->binary[1] == 'E');
      // No wgmma serialised by ptxas (C7520: a wgmma under a run-time condition serialises all of them).
      CHECK(r.artefact->metadata.dump().find("wgmma.mma_async instructions are serialized") == std::string::npos);
    }
  }
}

// Head dims up to 96 take the three-warpgroup tiles, whose KV width depends on the variant: one spec per policy branch
// (plain, a mask, a mask that needs 64-aligned tiles, a score_mod that does, one with per-column state, one that needs
// neither), bf16.
TEST_CASE("the three-warpgroup tiles compile for every kind of variant at head dims 64, 80 and 96", "[nvrtc]") {
  const std::vector<std::pair<std::string, std::string>> mods = {
      {"", ""}, {"", "q >= kv"}, {"", "kv // 64 <= q // 64"}, {"score + rel[b, h, q, kv // 64]", ""}, {"score + rel[b, h, q, kv % 64]", ""}, {"30.0 * tanh(score / 30.0)", ""}};
  for (int d : {64, 80, 96}) {
    for (const auto& [score, mask] : mods) {
      const std::vector<std::string> buffers = score.find("rel") != std::string::npos ? std::vector<std::string>{"rel: bf16[B, H, Sq, 64]"}
                                                                                         : std::vector<std::string>{};
      dsl::Spec spec = test::f32_spec("policy", score, mask, buffers, {}, d);
      spec.dtype = dsl::DType::BF16;
      INFO("head dim " << d << ", score_mod '" << score << "', mask_mod '" << mask << "'");
      SpecIR ir = build_spec_ir(spec);
      ForwardKernelOptions fo;
      fo.dtype = spec.dtype;
      fo.head_dim = d;
      fo.arch = "sm_90a";
      KernelSource ks = forward_kernel_source(ir, analyze_ir_ranges(ir), fo);
      CHECK(ks.config.warp_specialized);
      runtime::CacheLookup r = runtime::compile_kernel(ks, canonical_ir_text(ir), "sm_90a");
      REQUIRE(r.artefact);
      CHECK(r.artefact->binary.size() > 1000);
    }
  }
}

TEST_CASE("a division by a runtime int parameter compiles to the divisor multiplier on both kernels", "[nvrtc]") {
  for (const auto& [score, mask] : std::vector<std::pair<std::string, std::string>>{
           {"score + 0.01 * (kv % W)", "(kv // W) % 3 != 1"}, {"score + rel_h[b, h, q, kv // W] + rel_w[b, h, q, kv % W]", ""}}) {
    const std::vector<std::string> buffers = score.find("rel_h") != std::string::npos
                                                 ? std::vector<std::string>{"rel_h: bf16[B, H, Sq, 64]", "rel_w: bf16[B, H, Sq, 64]"}
                                                 : std::vector<std::string>{};
    dsl::Spec spec = test::f32_spec("int_divisor", score, mask, buffers, {}, 64);
    spec.dtype = dsl::DType::BF16;
    dsl::Diagnostics diags;
    dsl::add_param(spec, "W: int", "test", diags);
    REQUIRE(!diags.has_errors());
    SpecIR ir = build_spec_ir(spec);
    for (const char* arch : {"sm_80", "sm_90a"}) {
      INFO("score_mod '" << score << "', mask_mod '" << mask << "' for " << arch);
      ForwardKernelOptions fo;
      fo.dtype = spec.dtype;
      fo.head_dim = 64;
      fo.arch = arch;
      KernelSource ks = forward_kernel_source(ir, analyze_ir_ranges(ir), fo);
      CHECK(ks.source.find("fj::floordiv_by_param") != std::string::npos);
      CHECK(ks.source.find("fj::mod_by_param") != std::string::npos);
      runtime::CacheLookup r = runtime::compile_kernel(ks, canonical_ir_text(ir), arch);
      REQUIRE(r.artefact);
      CHECK(r.artefact->binary.size() > 1000);
    }
  }
}

TEST_CASE("the fully checked and 64-bit variants compile too", "[nvrtc]") {
  dsl::Spec spec = test::load_spec(test::gallery_dir() / "sam_relpos.json");
  SpecIR ir = build_spec_ir(spec);
  ForwardKernelOptions fo;
  fo.dtype = dsl::DType::F16;
  fo.head_dim = spec.head_dim;
  fo.variant.int32 = false;
  fo.variant.checked_loads = ~0ull;
  KernelSource ks = forward_kernel_source(ir, analyze_ir_ranges(ir), fo);
  CHECK(ks.source.find("fj::checked_index") != std::string::npos);
  runtime::CacheLookup r = runtime::compile_kernel(ks, canonical_ir_text(ir), "sm_80");
  CHECK(r.artefact->binary.size() > 1000);
}

TEST_CASE("modules for buffers with a unit last stride index them without it, are keyed apart and compile", "[nvrtc]") {
  for (const char* name : {"relative_bias.json", "sam_relpos.json"}) {
    dsl::Spec spec = test::load_spec(test::gallery_dir() / name);
    SpecIR ir = build_spec_ir(spec);
    const std::string last_stride = fmt::format("p.buf_{}_s{}", spec.buffers[0].name, spec.buffers[0].shape.size() - 1);
    ForwardKernelOptions fo;
    fo.dtype = spec.dtype;
    fo.head_dim = spec.head_dim;
    for (const char* arch : {"sm_80", "sm_90a"}) {
      INFO(spec.name << " for " << arch);
      fo.arch = arch;
      fo.variant.unit_inner_stride = 0;
      const KernelSource strided = forward_kernel_source(ir, analyze_ir_ranges(ir), fo);
      fo.variant.unit_inner_stride = 1;  // the first buffer only
      const KernelSource unit = forward_kernel_source(ir, analyze_ir_ranges(ir), fo);
      CHECK(strided.source.find(last_stride + ")") != std::string::npos);
      CHECK(unit.source.find(last_stride + ")") == std::string::npos);
      CHECK(unit.key_text != strided.key_text);
      if (spec.buffers.size() > 1) CHECK(unit.source.find(fmt::format("p.buf_{}_s3)", spec.buffers[1].name)) != std::string::npos);
      runtime::CacheLookup r = runtime::compile_kernel(unit, canonical_ir_text(ir), arch);
      REQUIRE(r.artefact);
      CHECK(r.artefact->binary.size() > 1000);
    }
  }
}

TEST_CASE("shard modules (context parallelism) compile for both kernels, named apart from whole-sequence modules", "[nvrtc]") {
  for (const char* name : {"causal.json", "document.json", "relative_bias.json", "sam_relpos.json"}) {
    dsl::Spec spec = test::load_spec(test::gallery_dir() / name);
    SpecIR ir = build_spec_ir(spec);
    ForwardKernelOptions fo;
    fo.dtype = spec.dtype;
    fo.head_dim = spec.head_dim;
    for (const char* arch : {"sm_80", "sm_90a"}) {
      INFO(spec.name << " for " << arch);
      fo.arch = arch;
      fo.shard_positions = false;
      const KernelSource whole = forward_kernel_source(ir, analyze_ir_ranges(ir), fo);
      fo.shard_positions = true;
      const KernelSource shard = forward_kernel_source(ir, analyze_ir_ranges(ir), fo);
      CHECK(whole.source.find("FLEX_SHARD_POSITIONS") == std::string::npos);
      CHECK(shard.source.find("#define FLEX_SHARD_POSITIONS 1") == 0 + shard.source.find('\n') + 1);
      CHECK(shard.name != whole.name);
      CHECK(shard.key_text != whole.key_text);
      runtime::CacheLookup r = runtime::compile_kernel(shard, canonical_ir_text(ir), arch);
      REQUIRE(r.artefact);
      CHECK(r.artefact->binary.size() > 1000);
    }
  }
}

TEST_CASE("the sm_90a forward is the warp-specialised kernel: setmaxnreg and TMA copies in its PTX", "[nvrtc]") {
  dsl::Spec spec = test::load_spec(test::gallery_dir() / "causal.json");
  SpecIR ir = build_spec_ir(spec);
  ForwardKernelOptions fo;
  fo.dtype = spec.dtype;
  fo.head_dim = spec.head_dim;
  fo.arch = "sm_90a";
  KernelSource ks = forward_kernel_source(ir, analyze_ir_ranges(ir), fo);
  REQUIRE(ks.config.warp_specialized);
  CHECK(ks.config.threads() == 384);  // a producer warpgroup and two consumer warpgroups
  test::check_warp_specialized_ptx(ks);
  // Strides no tensor map can describe keep the mma.sync kernel.
  fo.tma_describable = false;
  CHECK(!forward_kernel_source(ir, analyze_ir_ranges(ir), fo).config.warp_specialized);
}
