// The C API's dQ strategy setter (flexjit_args_set_backward_dq): the modes it takes and the errors it gives.
#include <catch2/catch.hpp>

#include <string>

#include "runtime/capi/flexjit.h"

TEST_CASE("C API: flexjit_args_set_backward_dq takes the three modes and rejects others", "[capi][backward]") {
  flexjit_args* a = nullptr;
  REQUIRE(flexjit_args_create(&a) == FLEXJIT_OK);
  for (flexjit_bwd_dq m : {FLEXJIT_BWD_DQ_AUTO, FLEXJIT_BWD_DQ_ATOMIC, FLEXJIT_BWD_DQ_QUERY_MAJOR}) CHECK(flexjit_args_set_backward_dq(a, m) == FLEXJIT_OK);
  CHECK(flexjit_args_set_backward_dq(a, static_cast<flexjit_bwd_dq>(7)) == FLEXJIT_ERROR_INVALID_ARGUMENT);
  CHECK(std::string(flexjit_last_error()).find("FLEXJIT_BWD_DQ_AUTO") != std::string::npos);
  CHECK(flexjit_args_set_backward_dq(nullptr, FLEXJIT_BWD_DQ_ATOMIC) == FLEXJIT_ERROR_INVALID_ARGUMENT);
  flexjit_args_destroy(a);
}
