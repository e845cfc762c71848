// The C API's ring plans (flexjit_ring_create, flexjit_ring_run_*): the argument errors a machine without GPUs can
// check.
#include <catch2/catch.hpp>

#include <string>

#include "runtime/capi/flexjit.h"

namespace {

std::string last_error() { return flexjit_last_error(); }

struct Kernel {
  flexjit_runtime* rt = nullptr;
  flexjit_kernel* k = nullptr;
  Kernel() {
    REQUIRE(flexjit_runtime_create(&rt) == FLEXJIT_OK);
    REQUIRE(flexjit_compile(rt, "{\"mask_mod\": \"q >= kv\", \"dtype\": \"bf16\", \"head_dim\": 64}", &k) == FLEXJIT_OK);
  }
  ~Kernel() {
    flexjit_kernel_destroy(k);
    flexjit_runtime_destroy(rt);
  }
};

}  // namespace

TEST_CASE("C API: ring plans of virtual ranks check their arguments and their ranks' devices", "[capi][ring]") {
  Kernel kernel;
  flexjit_ring* ring = nullptr;
  CHECK(flexjit_ring_create(nullptr, 2, FLEXJIT_RING_ZIGZAG, 100, -2, &ring) == FLEXJIT_ERROR_INVALID_ARGUMENT);
  CHECK(flexjit_ring_create(kernel.k, 2, static_cast<flexjit_ring_sharding>(5), 100, -2, &ring) == FLEXJIT_ERROR_INVALID_ARGUMENT);
  CHECK(flexjit_ring_create(kernel.k, 2, FLEXJIT_RING_ZIGZAG, 100, -3, &ring) == FLEXJIT_ERROR_INVALID_ARGUMENT);
  CHECK(flexjit_ring_create(kernel.k, 0, FLEXJIT_RING_ZIGZAG, 100, -2, &ring) == FLEXJIT_ERROR_USER);
  CHECK(last_error().find("0 ranks") != std::string::npos);
  CHECK(ring == nullptr);
  REQUIRE(flexjit_ring_create(kernel.k, 2, FLEXJIT_RING_ZIGZAG, 100, -2, &ring) == FLEXJIT_OK);
  CHECK(flexjit_ring_run_forward(ring, nullptr) == FLEXJIT_ERROR_INVALID_ARGUMENT);
  flexjit_args* a[2] = {nullptr, nullptr};
  REQUIRE(flexjit_args_create(&a[0]) == FLEXJIT_OK);
  REQUIRE(flexjit_args_create(&a[1]) == FLEXJIT_OK);
  CHECK(flexjit_args_set_stream(a[0], nullptr, -2) == FLEXJIT_OK);
  CHECK(flexjit_args_set_stream(a[1], nullptr, 0) == FLEXJIT_OK);  // not the plan's device
  CHECK(flexjit_ring_run_forward(ring, a) == FLEXJIT_ERROR_USER);
  CHECK(last_error().find("rank 1's args are on cuda:0 but the ring runs on cpu") != std::string::npos);
  CHECK(flexjit_args_set_stream(a[1], nullptr, -2) == FLEXJIT_OK);
  CHECK(flexjit_ring_run_backward(ring, a) == FLEXJIT_ERROR_USER);  // no LSE set
  CHECK(last_error().find("rank 0 has no LSE") != std::string::npos);
  CHECK(flexjit_ring_check_errors(ring) == FLEXJIT_OK);  // the CPU backend: nothing to check
  CHECK(flexjit_ring_check_errors(nullptr) == FLEXJIT_ERROR_INVALID_ARGUMENT);
  flexjit_ring_destroy(ring);
  flexjit_ring_destroy(nullptr);
  flexjit_args_destroy(a[0]);
  flexjit_args_destroy(a[1]);
}
