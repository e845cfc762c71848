// NCCL is loaded at run time (runtime/nccl.h): without it every error says what is missing and how to provide it, and
// nothing else in flexjit needs it. CI has no NCCL, which is the case these tests pin down; where a real libnccl.so.2 is
// found, the last test checks what was loaded.
#include <catch2/catch.hpp>

#include <cstdlib>
#include <string>

#include "dsl/error.h"
#include "runtime/nccl.h"

using flexjit::runtime::load_nccl;
using flexjit::runtime::NcclLoad;

TEST_CASE("NCCL: a library that cannot be opened is reported with the fix", "[runtime][nccl]") {
  NcclLoad l = load_nccl("/nonexistent/libnccl.so.2");
  CHECK_FALSE(l.ok);
  CHECK(l.reason.find("dlopen(\"/nonexistent/libnccl.so.2\") failed") != std::string::npos);
  CHECK(l.reason.find("NCCL 2.10 or later") != std::string::npos);
  CHECK(l.reason.find("FLEXJIT_NCCL_LIBRARY") != std::string::npos);
}

TEST_CASE("NCCL: a library without NCCL's entry points is reported by name", "[runtime][nccl]") {
  NcclLoad l = load_nccl("libm.so.6");  // opens, but is not NCCL
  CHECK_FALSE(l.ok);
  CHECK(l.reason.find("libm.so.6 has no entry point ncclGetVersion") != std::string::npos);
}

TEST_CASE("NCCL: the process-wide library throws the reason, or is a recent NCCL", "[runtime][nccl]") {
  std::string why;
  if (!flexjit::runtime::nccl_available(&why)) {
    CHECK(!why.empty());
    try {
      flexjit::runtime::nccl();
      FAIL("nccl() returned without a library");
    } catch (const flexjit::Error& e) {
      CHECK(std::string(e.what()) == why);
    }
    CHECK_THROWS_AS(flexjit::runtime::check_nccl(1, "in a test"), flexjit::Error);
  } else {
    const flexjit::runtime::Nccl& n = flexjit::runtime::nccl();
    CHECK(n.version >= 21000);
    CHECK(n.ncclSend != nullptr);
    flexjit::runtime::check_nccl(0, "in a test");  // success: no throw
    CHECK_THROWS_WITH(flexjit::runtime::check_nccl(1, "in a test"), Catch::Matchers::Contains("NCCL failed in a test"));
  }
}
