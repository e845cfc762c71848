// The C API's ring plans (flexjit_ring_create, flexjit_ring_create_nccl, flexjit_ring_run_*): the argument errors a
// machine without GPUs can check, and what a plan of one process per GPU needs (the NCCL runs are left:
// docs/notes/RING_NOTES.md).
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

TEST_CASE("C API: a ring of one process per GPU needs a GPU, NCCL and exactly one of a unique id and a communicator",
          "[capi][ring][nccl]") {
  Kernel kernel;
  flexjit_ring* ring = nullptr;
  unsigned char id[128] = {};
  CHECK(flexjit_nccl_unique_id(nullptr) == FLEXJIT_ERROR_INVALID_ARGUMENT);
  CHECK(flexjit_ring_create_nccl(nullptr, 2, 0, FLEXJIT_RING_ZIGZAG, 100, 0, id, nullptr, &ring) == FLEXJIT_ERROR_INVALID_ARGUMENT);
  CHECK(flexjit_ring_create_nccl(kernel.k, 2, 0, FLEXJIT_RING_ZIGZAG, 100, -1, id, nullptr, &ring) == FLEXJIT_ERROR_INVALID_ARGUMENT);
  CHECK(last_error().find("this process's GPU") != std::string::npos);
  CHECK(flexjit_ring_create_nccl(kernel.k, 2, 0, FLEXJIT_RING_ZIGZAG, 100, 0, nullptr, nullptr, &ring) == FLEXJIT_ERROR_INVALID_ARGUMENT);
  CHECK(flexjit_ring_create_nccl(kernel.k, 2, 0, FLEXJIT_RING_ZIGZAG, 100, 0, id, id, &ring) == FLEXJIT_ERROR_INVALID_ARGUMENT);
  CHECK(last_error().find("exactly one of unique_id") != std::string::npos);
  CHECK(flexjit_ring_create_nccl(kernel.k, 2, 5, FLEXJIT_RING_ZIGZAG, 100, 0, id, nullptr, &ring) == FLEXJIT_ERROR_USER);
  CHECK(last_error().find("rank 5 is not one of the ring's 2 ranks") != std::string::npos);
  // Valid arguments on a machine without a GPU: NCCL's absence, or the driver's (FLEXJIT_ERROR_NO_DEVICE).
  if (flexjit_device_count() == 0) {
    const flexjit_status st = flexjit_ring_create_nccl(kernel.k, 2, 0, FLEXJIT_RING_ZIGZAG, 100, 0, id, nullptr, &ring);
    INFO(last_error());
    CHECK((st == FLEXJIT_ERROR_NO_DEVICE || (st == FLEXJIT_ERROR_USER && last_error().find("NCCL") != std::string::npos)));
    CHECK(ring == nullptr);
  }
}
