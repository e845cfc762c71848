// The decode module (decode + combine, + tile list for masked specs) of every gallery spec compiles through NVRTC,
// without a GPU, and neither the decode kernel nor the tile-list kernel spills: sm_90a for all, sm_80, the
// two-m-tile configuration and the non-default pipeline for a few (CI time). Also the host's choice of pipeline
// and splits.
#include <catch2/catch.hpp>

#include <cstdio>

#include "compiler/codegen/decode_source.h"
#include "kernels_templates/flex_decode_params.cuh"
#include "runtime/kernel_compiler.h"
#include "support/spec_loading.h"

using namespace flexjit;

namespace {

// Compiles the module and checks that the decode kernel does not spill (printing ptxas' registers and spills).
void compile_decode(const SpecIR& ir, const DecodeKernelOptions& o, const char* arch) {
  KernelSource ks = decode_kernel_source(ir, analyze_decode_ranges(ir), o);
  INFO(ks.name << " for " << arch);
  CHECK((ks.source.find(kDecodeTilesEntry) != std::string::npos) == decode_has_tile_list(ir));
  runtime::CacheLookup r = runtime::compile_kernel(ks, canonical_ir_text(ir), arch);
  REQUIRE(r.artefact);
  REQUIRE(r.artefact->binary.size() > 1000);
  CHECK(r.artefact->binary[0] == 0x7f);
  const nlohmann::json& res = r.artefact->metadata.value("resources", nlohmann::json::object());
  REQUIRE(res.contains(kDecodeEntry));
  const nlohmann::json& v = res[kDecodeEntry];
  std::printf("%-40s %-7s regs %3d spill %3d\n", ks.name.c_str(), arch, v.value("registers", -1), v.value("spill_store_bytes", -1));
  CHECK(v.value("spill_store_bytes", -1) == 0);
  if (res.contains(kDecodeTilesEntry)) {
    const nlohmann::json& t = res[kDecodeTilesEntry];
    std::printf("%-40s %-7s tile list: regs %3d spill %3d\n", ks.name.c_str(), arch, t.value("registers", -1), t.value("spill_store_bytes", -1));
    CHECK(t.value("spill_store_bytes", -1) == 0);
  }
}

}  // namespace

TEST_CASE("decode policy: alternating K/V loads at D128 with one m-tile; FP8 on three stages; the target shape gets 4 splits",
          "[nvrtc][decode]") {
  for (int d : dsl::supported_head_dims())
    for (int rows : {1, 4, 16, 17, 32, 64}) {
      DecodeConfig c = decode_config(d, rows);
      INFO("D" << d << " rows " << rows);
      CHECK(c.m_tiles == (rows > 16 && d <= 128 ? 2 : 1));
      CHECK(c.stages == 2);
      CHECK(c.alternate == (d == 128 && c.m_tiles == 1));
      const DecodeConfig fp8 = decode_config(d, rows, dsl::DType::F8E4M3);
      CHECK(fp8.m_tiles == c.m_tiles);
      CHECK(fp8.stages == 3);
      CHECK_FALSE(fp8.alternate);
      // The pipeline is part of the module's name and cache key.
      DecodeConfig other = c;
      other.alternate = !c.alternate;
      CHECK(other.str() != c.str());
    }
  // H100 (132 SMs), D128, B8 x 8 KV heads: 2 resident CTAs per SM for the alternating kernel (3 for the pairs),
  // bandwidth wants 2 either way, so 4 splits: 256 CTAs in one wave of 264 slots, at KV 8192 and 32768.
  for (int resident : {2, 3}) {
    const int ctas = flex_decode_bandwidth_ctas(resident, 128, 2);
    CHECK(ctas == 2);
    CHECK(flex_decode_num_splits(132, ctas, 64, 8192 / 64) == 4);
    CHECK(flex_decode_num_splits(132, ctas, 64, 32768 / 64) == 4);
    CHECK(flex_decode_num_splits(132, ctas, 32 * 8, 32768 / 64) == 1);  // B32: 256 CTAs already
  }
  // D128, one m-tile: Q 16 x 136 x 2 bytes, two stages of K and V 64 x 272 bytes each (above the warps' merge); FP8:
  // three stages of 64 rows of 144 bytes.
  CHECK(decode_config(128, 4).shared_bytes() == 16 * 136 * 2 + 2 * 2 * 64 * 272);
  CHECK(decode_config(128, 4, dsl::DType::F8E4M3).shared_bytes() == 16 * 136 * 2 + 3 * 2 * 64 * 144);
  // evict_first for caches up to 512 MB and for listed tiles; a 1 GB cache without a list streams normally.
  CHECK(flex_decode_evict_first(256e6, false));
  CHECK_FALSE(flex_decode_evict_first(1e9, false));
  CHECK(flex_decode_evict_first(1e9, true));
}

TEST_CASE("every gallery decode module compiles for sm_90a", "[nvrtc][decode]") {
  for (const auto& path : test::gallery_specs()) {
    dsl::Spec spec = test::load_spec(path);
    if (spec.value_head_dim() != spec.head_dim) continue;  // decode needs Dv == D
    SpecIR ir = build_spec_ir(spec);
    DecodeKernelOptions o;
    o.dtype = spec.dtype;
    o.config = decode_config(spec.head_dim, 4);
    compile_decode(ir, o, "sm_90a");
  }
}

TEST_CASE("decode modules compile for sm_80, with two m-tiles and fp16", "[nvrtc][decode]") {
  for (const char* name : {"causal.json", "alibi.json", "sliding_window.json"}) {
    dsl::Spec spec = test::load_spec(test::gallery_dir() / name);
    SpecIR ir = build_spec_ir(spec);
    DecodeKernelOptions o;
    o.dtype = dsl::DType::F16;
    o.config = decode_config(spec.head_dim, 32);
    CHECK(o.config.m_tiles == 2);
    compile_decode(ir, o, "sm_80");
  }
}

TEST_CASE("ragged-prefill forward modules compile, classifying their KV tiles where the mask reads no buffers", "[nvrtc][varlen]") {
  // The causal and sliding-window masks' interval classifier goes into the kernel (it skips excluded tiles,
  // flex::TileScheduler); the document mask reads a buffer, so its kernel runs mask_mod on every tile.
  for (auto [name, classified] :
       {std::pair{"causal.json", true}, std::pair{"sliding_window.json", true}, std::pair{"document.json", false}}) {
    dsl::Spec spec = test::load_spec(test::gallery_dir() / name);
    SpecIR ir = build_spec_ir(spec);
    for (const char* arch : {"sm_90a", "sm_80"}) {
      INFO(name << " for " << arch);
      ForwardKernelOptions fo;
      fo.dtype = spec.dtype;
      fo.head_dim = spec.head_dim;
      fo.arch = arch;
      std::vector<ir::Expr> roots{ir.mask_mod};
      KernelSource ks = forward_varlen_kernel_source(ir, analyze_ranges(roots, ir.checked, VarDomains::forward(ir.checked)), fo);
      CHECK(ks.source.find(classified ? "/*kVarlen=*/true, FlexMaskBox>" : "/*kVarlen=*/true>") != std::string::npos);
      CHECK((ks.source.find("struct FlexMaskBox") != std::string::npos) == classified);
      CHECK(ks.entries == std::vector<std::string>{kForwardVarlenEntry});
      CHECK(ks.key_text.rfind("kind=forward_varlen\n", 0) == 0);
      runtime::CacheLookup r = runtime::compile_kernel(ks, canonical_ir_text(ir), arch);
      REQUIRE(r.artefact);
      CHECK(r.artefact->binary.size() > 1000);
      // Only the producer warp classifies (it publishes the ranges with the work index), so the consumers keep
      // their registers: the causal kernel does not spill.
      if (std::string(arch) == "sm_90a" && std::string(name) == "causal.json") {
        const nlohmann::json& res = r.artefact->metadata.value("resources", nlohmann::json::object());
        REQUIRE(res.contains(kForwardVarlenEntry));
        CHECK(res[kForwardVarlenEntry].value("spill_store_bytes", -1) == 0);
      }
    }
  }
}

TEST_CASE("ragged-prefill modules over an FP8 K / V compile with their widening pass", "[nvrtc][varlen]") {
  // e4m3 into bf16 on the warp-specialised kernel (sm_90a), e5m2 into f16 on the mma.sync one (sm_80).
  dsl::Spec spec = test::load_spec(test::gallery_dir() / "causal.json");
  for (auto [fp8, dtype, arch] : {std::tuple{dsl::DType::F8E4M3, dsl::DType::BF16, "sm_90a"}, std::tuple{dsl::DType::F8E5M2, dsl::DType::F16, "sm_80"}}) {
    INFO(dsl::dtype_name(fp8) << " into " << dsl::dtype_name(dtype) << " for " << arch);
    spec.dtype = dtype;
    SpecIR ir = build_spec_ir(spec);
    ForwardKernelOptions fo;
    fo.dtype = dtype;
    fo.head_dim = spec.head_dim;
    fo.arch = arch;
    fo.fp8_kv = fp8;
    std::vector<ir::Expr> roots{ir.mask_mod};
    KernelSource ks = forward_varlen_kernel_source(ir, analyze_ranges(roots, ir.checked, VarDomains::forward(ir.checked)), fo);
    CHECK(ks.entries == std::vector<std::string>{kForwardVarlenEntry, kWidenFp8Entry});
    CHECK(ks.key_text.find(fmt::format("fp8_kv={}\n", dsl::dtype_name(fp8))) != std::string::npos);
    CHECK(ks.source.find(fp8 == dsl::DType::F8E4M3 ? "flex_widen_fp8<FlexFp8E4M3, __nv_bfloat16>" : "flex_widen_fp8<FlexFp8E5M2, __half>") !=
          std::string::npos);
    runtime::CacheLookup r = runtime::compile_kernel(ks, canonical_ir_text(ir), arch);
    REQUIRE(r.artefact);
  }
}

TEST_CASE("the other decode pipeline compiles too (FLEXJIT_DECODE_ALTERNATE)", "[nvrtc][decode]") {
  // The pairs at D128 (the previous default) and the alternating loads at D64 and with two m-tiles, which the
  // runtime builds only when the environment asks: compiled, not checked for spills.
  dsl::Spec spec = test::load_spec(test::gallery_dir() / "alibi_causal.json");
  for (auto [d, rows] : {std::pair{128, 4}, std::pair{64, 4}, std::pair{128, 32}}) {
    spec.head_dim = d;
    SpecIR ir = build_spec_ir(spec);
    DecodeKernelOptions o;
    o.dtype = spec.dtype;
    o.config = decode_config(d, rows);
    o.config.alternate = !o.config.alternate;
    KernelSource ks = decode_kernel_source(ir, analyze_decode_ranges(ir), o);
    INFO(ks.name);
    CHECK(ks.source.find(o.config.alternate ? "/*kAlternate=*/true" : "/*kAlternate=*/false") != std::string::npos);
    runtime::CacheLookup r = runtime::compile_kernel(ks, canonical_ir_text(ir), "sm_90a");
    REQUIRE(r.artefact);
    CHECK(r.artefact->binary.size() > 1000);
  }
}

TEST_CASE("FP8 KV-cache decode modules compile without spills (e4m3 and e5m2, bf16 and fp16, sm_90a and sm_80)", "[nvrtc][decode]") {
  // The gallery at D128 (the serving shape) with an e4m3 cache for sm_90a, and a spread of head dims, element
  // types, formats and m-tiles for sm_90a and sm_80 (no FP8 instruction is used, so sm_80 runs them too).
  for (const char* name : {"causal.json", "alibi.json", "softcap.json", "document.json", "sliding_window.json"}) {
    dsl::Spec spec = test::load_spec(test::gallery_dir() / name);
    spec.head_dim = 128;
    SpecIR ir = build_spec_ir(spec);
    DecodeKernelOptions o;
    o.dtype = spec.dtype;
    o.config = decode_config(128, 4, dsl::DType::F8E4M3);
    CHECK(o.config.str() == "d128_mt1_st3_f8e4m3");
    CHECK(!o.config.alternate);
    compile_decode(ir, o, "sm_90a");
  }
  dsl::Spec spec = test::load_spec(test::gallery_dir() / "alibi_causal.json");
  struct Case { int d, rows; dsl::DType element, kv; const char* arch; };
  for (const Case& c : {Case{64, 4, dsl::DType::BF16, dsl::DType::F8E5M2, "sm_90a"}, Case{256, 4, dsl::DType::F16, dsl::DType::F8E4M3, "sm_90a"},
                        Case{128, 32, dsl::DType::F16, dsl::DType::F8E5M2, "sm_80"}, Case{32, 8, dsl::DType::BF16, dsl::DType::F8E4M3, "sm_80"}}) {
    spec.head_dim = c.d;
    SpecIR ir = build_spec_ir(spec);
    DecodeKernelOptions o;
    o.dtype = c.element;
    o.config = decode_config(c.d, c.rows, c.kv);
    KernelSource ks = decode_kernel_source(ir, analyze_decode_ranges(ir), o);
    CHECK(ks.source.find(c.kv == dsl::DType::F8E5M2 ? "/*KvElement=*/FlexFp8E5M2" : "/*KvElement=*/FlexFp8E4M3") != std::string::npos);
    CHECK(ks.key_text.find(fmt::format("config={}\n", o.config.str())) != std::string::npos);
    compile_decode(ir, o, c.arch);
  }
}
