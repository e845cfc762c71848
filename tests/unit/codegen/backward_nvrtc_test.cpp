// The backward module of every gallery spec and of the learnable-buffer specs (tests/data/backward)
// compiles through NVRTC for sm_80 and sm_90a, without a GPU, with dq by atomics and by the query-major
// pass; the scatter classes are the expected ones.
#include <catch2/catch.hpp>

#include <fmt/format.h>

#include <cstdio>
#include <utility>

#include "compiler/codegen/backward_source.h"
#include "compiler/frontend.h"
#include "compiler/passes/autodiff.h"
#include "runtime/kernel_compiler.h"
#include "support/spec_loading.h"
#include "support/warp_specialized_ptx.h"

using namespace flexjit;

namespace {

std::filesystem::path backward_data_dir() { return test::source_dir() / "tests" / "data" / "backward"; }

// arch "sm_90a" gives the module with the Hopper main kernel (head dims up to 128), as the runtime builds it there.
BackwardKernelSource make_source(const SpecIR& ir, bool deterministic, int head_dim, bool query_major = false, const char* arch = "") {
  ScoreModGradient grad = differentiate_score_mod(ir);
  RangeInfo ranges = analyze_ranges(backward_roots(grad), ir.checked, VarDomains::forward(ir.checked));
  BackwardKernelOptions bo;
  bo.dtype = ir.spec().dtype;
  bo.head_dim = head_dim;
  bo.deterministic = deterministic;
  bo.query_major = query_major;
  bo.arch = arch;
  return backward_kernel_source(ir, grad, ranges, bo);
}

// ptxas' report of one entry (registers, spills), for the log: the query-major pass must not spill.
void print_resources(const runtime::CacheLookup& r, const std::string& what, const char* arch) {
  const nlohmann::json& res = r.artefact->metadata.value("resources", nlohmann::json::object());
  for (const auto& [entry, v] : res.items())
    std::printf("%-44s %-7s %-26s regs %3d spill st %4d ld %4d stack %4d\n", what.c_str(), arch, entry.c_str(), v.value("registers", -1),
                v.value("spill_store_bytes", -1), v.value("spill_load_bytes", -1), v.value("stack_bytes", -1));
}

void compile_all(const std::vector<std::filesystem::path>& specs, bool query_major) {
  for (const auto& path : specs) {
    dsl::Spec spec = test::load_spec(path);
    SpecIR ir = build_spec_ir(spec);
    for (const char* arch : {"sm_80", "sm_90a"}) {
      BackwardKernelSource bs = make_source(ir, false, spec.head_dim, query_major, arch);
      // Above head dim 128 only modules without buffer gradients take the Hopper kernel (its head-dim split form).
      if (std::string(arch) == "sm_80") CHECK_FALSE(bs.config.hopper);
      else if (spec.head_dim <= 128) CHECK(bs.config.hopper);
      INFO(spec.name << " for " << arch << "\n" << bs.module.source);
      runtime::CacheLookup r = runtime::compile_kernel(bs.module, canonical_ir_text(ir), arch);
      REQUIRE(r.artefact);
      CHECK(r.artefact->binary.size() > 1000);
      if (query_major) print_resources(r, bs.module.name, arch);
    }
  }
}

std::vector<std::filesystem::path> learnable_specs() {
  std::vector<std::filesystem::path> specs;
  for (const auto& e : std::filesystem::directory_iterator(backward_data_dir()))
    if (e.path().extension() == ".json") specs.push_back(e.path());
  std::sort(specs.begin(), specs.end());
  return specs;
}

}  // namespace

TEST_CASE("every gallery backward module compiles for sm_80 and, with the Hopper main kernel, for sm_90a", "[nvrtc][backward]") { compile_all(test::gallery_specs(), false); }

TEST_CASE("the learnable-buffer backward modules compile, deterministic and other head dims too", "[nvrtc][backward]") {
  compile_all(learnable_specs(), false);
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
  CHECK(classes("sam_learnable.json") == std::vector<ScatterClass>{ScatterClass::RowTile, ScatterClass::RowCol});
}

TEST_CASE("the query-major backward modules compile: learnable buffers, masks, every head dim", "[nvrtc][backward][qmajor]") {
  std::vector<std::filesystem::path> specs = learnable_specs();
  for (const char* g : {"causal.json", "document.json", "softcap.json", "sam_relpos.json"}) specs.push_back(test::gallery_dir() / g);
  compile_all(specs, true);
  // Deterministic fp16 SAM and every head dim of the pass (192 / 256: one K/V stage; 256 only fits sm_90's
  // shared memory, but compiles for both).
  dsl::Spec sam = test::load_spec(backward_data_dir() / "sam_learnable.json");
  for (int d : {32, 80, 96, 128, 192, 256}) {
    SpecIR ir = build_spec_ir(sam);
    BackwardKernelSource bs = make_source(ir, d == 80, d, true, "sm_90a");
    INFO(bs.module.source);
    runtime::CacheLookup r = runtime::compile_kernel(bs.module, canonical_ir_text(ir), "sm_90a");
    CHECK(r.artefact->binary.size() > 1000);
    print_resources(r, bs.module.name + " D" + std::to_string(d), "sm_90a");
  }
  // Beside the SAM terms, a target computed from the score (general: no offset-only function for it).
  dsl::Spec mixed = sam;
  mixed.name = "sam_score_target";
  mixed.score_mod = *sam.score_mod + " + w[int(score) % 64]";
  dsl::Diagnostics diags;
  REQUIRE(dsl::add_buffer(mixed, "w: f32[64]", "test", diags));
  mixed.buffers.back().requires_grad = true;
  {
    SpecIR ir = build_spec_ir(mixed);
    BackwardKernelSource bs = make_source(ir, false, 64, true, "sm_90a");
    INFO(bs.module.source);
    CHECK(runtime::compile_kernel(bs.module, canonical_ir_text(ir), "sm_90a").artefact->binary.size() > 1000);
  }
  sam.dtype = dsl::DType::F16;
  SpecIR ir = build_spec_ir(sam);
  BackwardKernelSource bs = make_source(ir, true, 64, true);
  INFO(bs.module.source);
  CHECK(runtime::compile_kernel(bs.module, canonical_ir_text(ir), "sm_80").artefact->binary.size() > 1000);
}

TEST_CASE("the staged Hopper backward modules compile: SAM deterministic, fp16 at head dim 128, strided rows, a residual, selector GEMMs", "[nvrtc][backward]") {
  struct Case {
    const char* name;
    const char* score_mod;
    std::vector<std::string> buffers;
    std::vector<std::string> grads;
    dsl::DType dtype;
    int head_dim;
    bool deterministic;
    bool col = true, tile = true;  // the terms expected staged
    bool gemm = false;             // spread rows' gradients by selector GEMMs expected (bf16, d_score 1)
  };
  const char* sam = "score + rel_h[b, h, q, kv // 64] + rel_w[b, h, q, kv % 64]";
  const std::vector<Case> cases = {
      {"sam_det", sam, {"rel_h: bf16[B, H, Sq, 64]", "rel_w: bf16[B, H, Sq, 64]"}, {"rel_h", "rel_w"}, dsl::DType::BF16, 64, true, true, true, true},
      // Deterministic with the blocked accumulators at the other head dims that fit them: 32 (selectors in K) and 80
      // (selector tiles of their own).
      {"sam_det_d32", sam, {"rel_h: bf16[B, H, Sq, 64]", "rel_w: bf16[B, H, Sq, 64]"}, {"rel_h", "rel_w"}, dsl::DType::BF16, 32, true, true, true, true},
      {"sam_det_d80", sam, {"rel_h: bf16[B, H, Sq, 64]", "rel_w: bf16[B, H, Sq, 64]"}, {"rel_h", "rel_w"}, dsl::DType::BF16, 80, true, true, true, true},
      {"sam_f16", sam, {"rel_h: f16[B, H, Sq, 64]", "rel_w: f16[B, H, Sq, 64]"}, {"rel_h", "rel_w"}, dsl::DType::F16, 128, false},
      {"sam_strided", sam, {"rel_h: bf16[B, H, Sq, 65]", "rel_w: bf16[B, H, Sq, 66]"}, {"rel_w"}, dsl::DType::BF16, 80, false},
      {"sam_strided_both", sam, {"rel_h: bf16[B, H, Sq, 65]", "rel_w: bf16[B, H, Sq, 66]"}, {"rel_h", "rel_w"}, dsl::DType::BF16, 80, false, true,
       true, true},
      // rel_w's gradient alone, or a scaled score (d_score 0.5): the slabs.
      {"rel_w_only", "score + rel_w[b, h, q, kv % 64]", {"rel_w: bf16[B, H, Sq, 64]"}, {"rel_w"}, dsl::DType::BF16, 32, false, true, false},
      {"sam_scaled", "0.5 * score + rel_h[b, h, q, kv // 64] + rel_w[b, h, q, kv % 64]", {"rel_h: bf16[B, H, Sq, 64]", "rel_w: bf16[B, H, Sq, 64]"},
       {"rel_h", "rel_w"}, dsl::DType::BF16, 64, false},
      {"sam_residual", "score * (1.0 - 0.25 * (q % 3)) + rel_h[b, h, q, kv // 64] + rel_w[b, h, q, kv % 64] + slope[h] * (kv - q)",
       {"rel_h: bf16[B, H, Sq, 64]", "rel_w: bf16[B, H, Sq, 64]", "slope: f32[H]"}, {"rel_h", "slope"}, dsl::DType::BF16, 32, false},
      {"tile_only", "score + r[h, q, kv // 64]", {"r: bf16[H, Sq, 64]"}, {"r"}, dsl::DType::BF16, 96, false, false, true},
      {"col_only", "score + r[q, kv % 64]", {"r: f16[Sq, 64]"}, {}, dsl::DType::F16, 64, false, true, false},
  };
  for (const Case& c : cases) {
    dsl::Spec spec;
    spec.name = c.name;
    spec.score_mod = c.score_mod;
    spec.head_dim = c.head_dim;
    spec.dtype = c.dtype;
    dsl::Diagnostics diags;
    for (const std::string& b : c.buffers) REQUIRE(dsl::add_buffer(spec, b, "test", diags));
    for (dsl::BufferDecl& b : spec.buffers)
      for (const std::string& g : c.grads) b.requires_grad = b.requires_grad || b.name == g;
    SpecIR ir = build_spec_ir(spec);
    BackwardKernelSource bs = make_source(ir, c.deterministic, c.head_dim, false, "sm_90a");
    INFO(bs.module.source);
    CHECK(bs.config.staged_col == c.col);
    CHECK(bs.config.staged_tile == c.tile);
    CHECK(bs.config.grad_gemm == c.gemm);
    CHECK((bs.module.source.find("/*kGradGemm=*/true") != std::string::npos) == c.gemm);
    // Deterministic selector GEMMs send their sums as blocks (flex_backward_staged_blocks); the host learns which
    // buffers' accumulators to lay out so (rel_h is buffer 0, rel_w 1 in every SAM case).
    CHECK(bs.config.staged_blocks() == (c.deterministic && c.gemm));
    if (c.deterministic && c.gemm) {
      CHECK(bs.staged_tile_grad_buffer == 0);
      CHECK(bs.staged_col_grad_buffer == 1);
    }
    runtime::CacheLookup r = runtime::compile_kernel(bs.module, canonical_ir_text(ir), "sm_90a");
    CHECK(r.artefact->binary.size() > 1000);
    print_resources(r, bs.module.name, "sm_90a");
  }
}

TEST_CASE("bulk dQ reductions: the Hopper kernel in fp32 from head dim 96 (with a diagonal scatter when warp-specialised), deterministic in fixed point at every head dim, where the rows fit", "[backward]") {
  auto config = [](const char* score_mod, const char* mask, std::vector<std::string> buffers, std::vector<std::string> grads, int head_dim,
                   bool deterministic, const char* arch) {
    dsl::Spec spec;
    spec.name = "bulk";
    if (score_mod) spec.score_mod = score_mod;
    if (mask) spec.mask_mod = mask;
    spec.head_dim = head_dim;
    dsl::Diagnostics diags;
    for (const std::string& b : buffers) REQUIRE(dsl::add_buffer(spec, b, "test", diags));
    for (dsl::BufferDecl& b : spec.buffers)
      for (const std::string& g : grads) b.requires_grad = b.requires_grad || b.name == g;
    return make_source(build_spec_ir(spec), deterministic, head_dim, false, arch);
  };
  BackwardKernelSource c128 = config(nullptr, "q >= kv", {}, {}, 128, false, "sm_90a");
  CHECK(c128.config.dq_bulk);
  CHECK(c128.module.source.find("/*kDqBulk=*/true") != std::string::npos);
  CHECK(c128.module.key_text.find("_qb") != std::string::npos);
  BackwardKernelSource c128_det = config(nullptr, "q >= kv", {}, {}, 128, true, "sm_90a");  // deterministic: fixed point
  CHECK(c128_det.config.dq_bulk);
  CHECK(c128_det.module.source.find("flex_bwd_sm90::Smem<FlexBwdTraits, FlexGradVariant, true, false, true, true, false>") != std::string::npos);
  // [64][D] fp32 rows or [64][D] 64-bit fixed-point ones on top of the same tiles, unpadded (bulk_dq_group_xor); the
  // fp32 rows leave room for a second dS^T tile (two_ds), the fixed-point ones do not.
  CHECK(c128.config.two_ds);
  CHECK(!c128_det.config.two_ds);
  CHECK(c128.config.shared_bytes() - 64 * 128 * 4 - 128 * 64 * 2 == c128_det.config.shared_bytes() - 64 * 128 * 8);
  CHECK(c128.module.source.find("/*kBulkLayout=*/true") != std::string::npos);
  CHECK(config(nullptr, "q >= kv", {}, {}, 96, false, "sm_90a").config.dq_bulk);
  CHECK(!config(nullptr, "q >= kv", {}, {}, 64, false, "sm_90a").config.dq_bulk);  // slower than the atomics there
  CHECK(config(nullptr, "q >= kv", {}, {}, 64, true, "sm_90a").config.dq_bulk);    // faster than 64-bit atomics
  CHECK(!config(nullptr, "q >= kv", {}, {}, 128, false, "sm_80").config.dq_bulk);
  // A diagonal scatter (learnable relative bias) takes the rows in the warp-specialised kernel (these modules have
  // tensor maps), as a uniform one (learnable slope) does.
  CHECK(config("score + bias[h, q - kv + Skv - 1]", "q >= kv", {"bias: f32[H, L]"}, {"bias"}, 128, false, "sm_90a").config.dq_bulk);
  CHECK(config("score + slope[h] * (kv - q)", "q >= kv", {"slope: f32[H]"}, {"slope"}, 128, false, "sm_90a").config.dq_bulk);
  // SAM with both gradients at head dim 128: the selectors take two 16 KB spare regions of K (bf16) and leave no
  // room for the rows (the selector columns in the dQ GEMM with atomics still beat separate selector GEMMs with the
  // rows: 4.34 -> 4.21 ms on an H100); with the fp32 slabs (fp16 SAM) the kernel uses 226 KB, no room either.
  BackwardKernelSource sam = config("score + rel_h[b, h, q, kv // 64] + rel_w[b, h, q, kv % 64]", nullptr,
                                    {"rel_h: bf16[B, H, Sq, 64]", "rel_w: bf16[B, H, Sq, 64]"}, {"rel_h", "rel_w"}, 128, false, "sm_90a");
  CHECK(sam.config.spread_rows);
  CHECK(sam.config.grad_gemm);
  CHECK(!sam.config.dq_bulk);
  CHECK(sam.config.shared_bytes() <= 227 * 1024);
  BackwardConfig bulk = sam.config;
  bulk.dq_bulk = true;
  CHECK(bulk.shared_bytes() > 227 * 1024);
  BackwardConfig slabs = sam.config;
  slabs.grad_gemm = false;
  CHECK(slabs.shared_bytes() <= 232448);
  slabs.dq_bulk = true;
  CHECK(slabs.shared_bytes() > 227 * 1024);
}

TEST_CASE("the head-dim split form (192 and 256) takes every buffer-gradient class and stays warp-specialised", "[nvrtc][backward]") {
  // The diagonal class reduces in its warps' slots there; uniform, q-only and KV-only ones as in the other forms.
  for (const char* file : {"learnable_bias.json", "alibi_learnable.json", "offset_bias_learnable.json", "softcap_bias_learnable.json"}) {
    INFO(file << ", head dim 192");
    BackwardKernelSource ss = make_source(build_spec_ir(test::load_spec(backward_data_dir() / file)), false, 192, false, "sm_90a");
    CHECK(ss.config.hopper);
    REQUIRE(ss.config.warp_specialized);
    CHECK(ss.config.block_n == 64);
    test::check_warp_specialized_ptx(ss.module);
  }
}

TEST_CASE("the sm_90a backward of a module without buffer gradients is warp-specialised: setmaxnreg and TMA copies in its PTX", "[nvrtc][backward]") {
  SpecIR ir = build_spec_ir(test::load_spec(test::gallery_dir() / "causal.json"));
  for (bool deterministic : {false, true}) {
    for (int d : {64, 128, 192, 256}) {
      INFO("deterministic " << deterministic << ", head dim " << d);
      BackwardKernelSource bs = make_source(ir, deterministic, d, false, "sm_90a");
      REQUIRE(bs.config.hopper);
      REQUIRE(bs.config.warp_specialized);
      // Head dims 192 and 256: the head-dim split form, 64 KV rows per CTA; two Q / dO stages but with D192's
      // fixed-point dQ rows.
      CHECK(bs.config.block_n == (d > 128 ? 64 : 128));
      CHECK(bs.config.stages == (deterministic && d == 192 ? 1 : 2));
      CHECK(bs.config.threads() == 384);  // a producer warpgroup and two consumer warpgroups
      CHECK(bs.module.source.find("__launch_bounds__(384, 1)") != std::string::npos);
      CHECK(bs.module.source.find("const __grid_constant__ FlexBackwardTmaMaps tma") != std::string::npos);
      const std::string ptx = test::check_warp_specialized_ptx(bs.module);
      // With bulk dQ rows (D128 and D192, and deterministic up to 192) the writer warp sends them.
      CHECK((ptx.find("cp.reduce.async.bulk") != std::string::npos) == ((deterministic && d <= 192) || d == 128 || d == 192));
    }
  }
  // Operands no tensor map describes, sm_80 and the query-major pass keep the 256-thread kernels.
  BackwardKernelOptions bo;
  ScoreModGradient grad = differentiate_score_mod(ir);
  RangeInfo ranges = analyze_ranges(backward_roots(grad), ir.checked, VarDomains::forward(ir.checked));
  bo.arch = "sm_90a";
  bo.tma_operands = false;
  CHECK_FALSE(backward_kernel_source(ir, grad, ranges, bo).config.warp_specialized);
  CHECK(backward_kernel_source(ir, grad, ranges, bo).config.threads() == 256);
  CHECK_FALSE(make_source(ir, false, 128, false, "sm_80").config.warp_specialized);
  CHECK_FALSE(make_source(ir, false, 128, true, "sm_90a").config.warp_specialized);
  // Head dims above 128 without tensor maps: the mma.sync kernel. With the query-major pass (deterministic launches'
  // automatic choice there) the split form stays warp-specialised and leaves dQ to the pass.
  bo.head_dim = 256;
  CHECK_FALSE(backward_kernel_source(ir, grad, ranges, bo).config.hopper);
  for (int d : {192, 256}) {
    INFO("query-major pass, head dim " << d);
    BackwardKernelSource qs = make_source(ir, true, d, true, "sm_90a");
    REQUIRE(qs.config.warp_specialized);
    CHECK(qs.config.stages == 2);
    CHECK(test::check_warp_specialized_ptx(qs.module).find("cp.reduce.async.bulk") == std::string::npos);
  }
  // Staged terms (SAM's rel_h / rel_w) with their gradients by selector GEMMs: warp-specialised, the consumers copying
  // the staged blocks a tile ahead and K / V once (cp.async), Q / dO by TMA, deterministic launches too. Gradients
  // through slabs (rel_w's alone) keep the 256-thread form.
  dsl::Spec sam = test::load_spec(backward_data_dir() / "sam_learnable.json");
  for (int d : {64, 128}) {
    INFO("SAM, head dim " << d);
    BackwardKernelSource ss = make_source(build_spec_ir(sam), false, d, false, "sm_90a");
    REQUIRE(ss.config.warp_specialized);
    CHECK(ss.config.grad_gemm);
    const std::string ptx = test::check_warp_specialized_ptx(ss.module);
    CHECK(ptx.find("cp.async.cg.shared.global") != std::string::npos);
  }
  CHECK(make_source(build_spec_ir(sam), true, 64, false, "sm_90a").config.warp_specialized);
  for (dsl::BufferDecl& b : sam.buffers) b.requires_grad = b.name == "rel_w";
  CHECK_FALSE(make_source(build_spec_ir(sam), false, 64, false, "sm_90a").config.warp_specialized);
}

TEST_CASE("buffer gradients in the warp-specialised sm_90a backward: their reductions meet at the consumers' named barrier", "[nvrtc][backward]") {
  // A diagonal scatter (the learnable bias: split around the GEMMs, its cross-warp sums behind the dQ barrier), a
  // uniform one (ALiBi's slope per head: summed over the warps at the end of each head, at the reduction barrier) and
  // a kv-only one beside a d_score that is not 1 (softcap of a per-KV bias: summed in registers).
  for (const std::string name : {"learnable_bias.json", "alibi_learnable.json", "softcap_bias_learnable.json"}) {
    const SpecIR ir = build_spec_ir(test::load_spec(backward_data_dir() / name));
    for (bool deterministic : {false, true}) {
      for (int d : {64, 96, 128}) {
        INFO(name << ", deterministic " << deterministic << ", head dim " << d);
        BackwardKernelSource bs = make_source(ir, deterministic, d, false, "sm_90a");
        REQUIRE(bs.config.warp_specialized);
        CHECK(bs.config.threads() == 384);
        const std::string ptx = test::check_warp_specialized_ptx(bs.module);
        CHECK((ptx.find("bar.sync 3, 256") != std::string::npos) == (name == "alibi_learnable.json"));
      }
    }
  }
}

TEST_CASE("shard backward modules (context parallelism) compile: global positions through ShardPositions, nothing staged", "[nvrtc][backward]") {
  for (const auto& path : {test::gallery_dir() / "causal.json", test::gallery_dir() / "document.json", backward_data_dir() / "learnable_bias.json",
                           backward_data_dir() / "sam_learnable.json"}) {
    dsl::Spec spec = test::load_spec(path);
    SpecIR ir = build_spec_ir(spec);
    ScoreModGradient grad = differentiate_score_mod(ir);
    RangeInfo ranges = analyze_ranges(backward_roots(grad), ir.checked, VarDomains::forward(ir.checked));
    for (const char* arch : {"sm_80", "sm_90a"}) {
      INFO(spec.name << " for " << arch);
      BackwardKernelOptions bo;
      bo.dtype = spec.dtype;
      bo.head_dim = spec.head_dim;
      bo.arch = arch;
      const BackwardKernelSource whole = backward_kernel_source(ir, grad, ranges, bo);
      bo.shard_positions = true;
      const BackwardKernelSource shard = backward_kernel_source(ir, grad, ranges, bo);
      CHECK(whole.module.source.find("ShardPositions") == std::string::npos);
      CHECK(shard.module.source.find("using FlexGradVariant = flex::ShardPositions<FlexGradVariantLocal>;") != std::string::npos);
      CHECK(shard.module.name != whole.module.name);
      CHECK(shard.module.key_text != whole.module.key_text);
      // SAM's rel_h / rel_w are staged by the whole-sequence Hopper kernel; a shard's loads them per element.
      CHECK_FALSE(shard.config.staged_col);
      CHECK_FALSE(shard.config.staged_tile);
      CHECK_FALSE(shard.config.spread_rows);
      // The variant's parameters are the layout's slots and the two offsets (the generated static_assert says so too).
      CHECK(shard.module.source.find(fmt::format("sizeof(FlexGradVariant::Params) == {}", shard.grad.layout.bytes() + 16)) != std::string::npos);
      runtime::CacheLookup r = runtime::compile_kernel(shard.module, canonical_ir_text(ir), arch);
      REQUIRE(r.artefact);
      CHECK(r.artefact->binary.size() > 1000);
      bo.query_major = true;
      CHECK_THROWS_WITH(backward_kernel_source(ir, grad, ranges, bo), Catch::Matchers::Contains("no query-major pass"));
    }
  }
}

TEST_CASE("ragged backward modules compile: sequence views in every kernel, tile classes by the mask's intervals, tensor maps", "[nvrtc][backward]") {
  for (const auto& path : {test::gallery_dir() / "causal.json", test::gallery_dir() / "document.json", backward_data_dir() / "learnable_bias.json",
                           backward_data_dir() / "sam_learnable.json"}) {
    dsl::Spec spec = test::load_spec(path);
    SpecIR ir = build_spec_ir(spec);
    ScoreModGradient grad = differentiate_score_mod(ir);
    RangeInfo ranges = analyze_ranges(backward_roots(grad), ir.checked, VarDomains::forward(ir.checked));
    for (const char* arch : {"sm_80", "sm_90a"}) {
      for (auto [det, tma] : {std::pair{false, false}, std::pair{true, false}, std::pair{false, true}}) {
        INFO(spec.name << " for " << arch << (det ? ", deterministic" : "") << (tma ? ", tensor maps" : ""));
        BackwardKernelOptions bo;
        bo.dtype = spec.dtype;
        bo.head_dim = spec.head_dim;
        bo.arch = arch;
        bo.deterministic = det;
        bo.tma_operands = tma;
        const BackwardKernelSource dense = backward_kernel_source(ir, grad, ranges, bo);
        bo.ragged = true;
        const BackwardKernelSource ragged = backward_kernel_source(ir, grad, ranges, bo);
        CHECK(dense.module.source.find("ragged_sequence") == std::string::npos);
        // The preprocess, main and dQ kernels each take their sequence's view.
        size_t views = 0;
        for (size_t at = ragged.module.source.find("flex_bwd::ragged_sequence<"); at != std::string::npos;
             at = ragged.module.source.find("flex_bwd::ragged_sequence<", at + 1))
          ++views;
        CHECK(views == 3);
        // Index-only masks classify tiles by intervals; the document mask (a buffer) runs every tile as partial.
        if (spec.name == "causal") CHECK(ragged.module.source.find("flex_backward_ragged_tile_state<FlexGradVariant, FlexMaskBox>") != std::string::npos);
        if (spec.name == "document") CHECK(ragged.module.source.find("flex_backward_ragged_tile_state<FlexGradVariant, void>") != std::string::npos);
        CHECK(ragged.module.name != dense.module.name);
        CHECK(ragged.module.key_text != dense.module.key_text);
        CHECK_FALSE(ragged.config.staged_col);
        CHECK_FALSE(ragged.config.staged_tile);
        // The warp-specialised kernel's producer addresses the sequence's rows through the maps' row coordinates. A
        // ragged module stages nothing, so with tensor maps it is warp-specialised even where the dense one stages
        // SAM's terms in the 256-thread kernel.
        CHECK(ragged.config.warp_specialized == (tma && std::string_view(arch) == "sm_90a"));
        runtime::CacheLookup r = runtime::compile_kernel(ragged.module, canonical_ir_text(ir), arch);
        REQUIRE(r.artefact);
        CHECK(r.artefact->binary.size() > 1000);
      }
    }
    BackwardKernelOptions bo;
    bo.head_dim = spec.head_dim;
    bo.arch = "sm_90a";
    bo.ragged = true;
    bo.query_major = true;
    CHECK_THROWS_WITH(backward_kernel_source(ir, grad, ranges, bo), Catch::Matchers::Contains("no query-major pass"));
  }
}
