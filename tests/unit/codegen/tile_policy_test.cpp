// The forward tile policy (kernels_templates/flex_tile_policy.cuh) over every head dim and variant feature set, not
// only the ones the gallery instantiates: a register split beyond the CTA's launch allocation hangs the kernel in
// setmaxnreg, and a tile that breaks the swizzle's alignment or shared memory fails only when NVRTC compiles it.
#include <catch2/catch.hpp>

#include "dsl/spec.h"
#include "kernels_templates/flex_tile_policy.cuh"

namespace {

// Every feature set a generated variant can have: tile alignment comes from a mod's kv // c or kv % c, a
// data-dependent mask is a mask, per-column state is kv % c hoisted (so tile-aligned), a fixed maximum bounds a
// score_mod, and loads per element belong to a mod.
std::vector<FlexVariantFeatures> all_features() {
  std::vector<FlexVariantFeatures> out;
  for (int bits = 0; bits < 128; ++bits) {
    const FlexVariantFeatures f{bool(bits & 1),  bool(bits & 2),  bool(bits & 4), bool(bits & 8),
                                bool(bits & 16), bool(bits & 32), bool(bits & 64)};
    if ((f.tile_aligned && !f.has_score_mod && !f.has_mask_mod) || (f.data_dependent_mask && !f.has_mask_mod) ||
        (f.column_state && !f.tile_aligned) || (f.fixed_max && !f.has_score_mod) || (f.element_loads && !f.has_score_mod && !f.has_mask_mod))
      continue;
    out.push_back(f);
  }
  return out;
}

}  // namespace

TEST_CASE("the warp-specialised policy keeps its register, shared-memory and swizzle invariants", "[codegen][policy]") {
  for (int d : flexjit::dsl::supported_head_dims()) {
    if (flex_forward_kind(90, d, true) != kFlexForwardWarpSpecialized) continue;
    for (const FlexVariantFeatures& f : all_features()) {
      INFO("head dim " << d << ", score_mod " << f.has_score_mod << ", mask_mod " << f.has_mask_mod << ", tile aligned "
                       << f.tile_aligned << ", data-dependent mask " << f.data_dependent_mask << ", column state " << f.column_state << ", fixed max " << f.fixed_max
                       << ", element loads " << f.element_loads);
      const FlexForwardPolicy p = flex_forward_policy(kFlexForwardWarpSpecialized, d, f);
      CHECK(p.block_m == 64 * p.consumer_warpgroups);
      CHECK(p.threads == 128 * (p.consumer_warpgroups + 1));
      const int launch_regs = (65536 / p.threads) / 8 * 8 * p.threads;
      CHECK(p.producer_regs * 128 + p.consumer_regs * 128 * p.consumer_warpgroups <= launch_regs);
      CHECK(p.producer_regs % 8 == 0);
      CHECK(p.consumer_regs % 8 == 0);
      CHECK(p.producer_regs >= 32);  // 24 spills the producer's loop
      CHECK(p.consumer_regs <= 256);
      CHECK((!p.pingpong || p.consumer_warpgroups == 2));
      CHECK(p.block_n % 16 == 0);
      CHECK(p.block_n <= 256);
      CHECK((!f.tile_aligned || p.block_n % 64 == 0));
      CHECK(p.tile_head_dim >= d);
      CHECK(p.tile_head_dim % (p.swizzle_bytes / 2) == 0);
      CHECK(p.block_m * p.tile_head_dim * 2 % 1024 == 0);
      CHECK(p.block_n * p.tile_head_dim * 2 % 1024 == 0);
      CHECK(p.smem_bytes == flex_sm90_smem_bytes(p.block_m, p.block_n, p.tile_head_dim, p.stages));
      CHECK(p.smem_bytes <= 232448);
    }
  }
}

TEST_CASE("the mma.sync policy fits shared memory at every head dim", "[codegen][policy]") {
  for (int d : flexjit::dsl::supported_head_dims()) {
    INFO("head dim " << d);
    const FlexForwardPolicy p = flex_forward_policy(kFlexForwardMmaSync, d, FlexVariantFeatures{});
    CHECK(p.smem_bytes <= 232448);
    CHECK(p.block_m % (16 * p.threads / 32) == 0);
  }
}
