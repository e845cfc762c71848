// The decode module (decode + combine, + tile window for buffer-free masks) of every gallery spec compiles
// through NVRTC, without a GPU: sm_90a for all, sm_80 and the two-m-tile configuration for a few (CI time).
#include <catch2/catch.hpp>

#include "compiler/codegen/decode_source.h"
#include "runtime/kernel_compiler.h"
#include "support/spec_loading.h"

using namespace flexjit;

namespace {

void compile_decode(const SpecIR& ir, const DecodeKernelOptions& o, const char* arch) {
  KernelSource ks = decode_kernel_source(ir, analyze_decode_ranges(ir), o);
  INFO(ks.name << " for " << arch);
  CHECK((ks.source.find(kDecodeWindowEntry) != std::string::npos) == decode_has_window(ir));
  runtime::CacheLookup r = runtime::compile_kernel(ks, canonical_ir_text(ir), arch);
  REQUIRE(r.artefact);
  REQUIRE(r.artefact->binary.size() > 1000);
  CHECK(r.artefact->binary[0] == 0x7f);
}

}  // namespace

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

TEST_CASE("the ragged-prefill forward module compiles for sm_90a", "[nvrtc][varlen]") {
  dsl::Spec spec = test::load_spec(test::gallery_dir() / "sliding_window.json");
  SpecIR ir = build_spec_ir(spec);
  ForwardKernelOptions fo;
  fo.dtype = spec.dtype;
  fo.head_dim = spec.head_dim;
  std::vector<ir::Expr> roots{ir.mask_mod};
  KernelSource ks = forward_varlen_kernel_source(ir, analyze_ranges(roots, ir.checked, VarDomains::forward(ir.checked)), fo);
  CHECK(ks.source.find("/*kVarlen=*/true") != std::string::npos);
  CHECK(ks.key_text.rfind("kind=forward_varlen\n", 0) == 0);
  runtime::CacheLookup r = runtime::compile_kernel(ks, canonical_ir_text(ir), "sm_90a");
  REQUIRE(r.artefact);
  CHECK(r.artefact->binary.size() > 1000);
}
