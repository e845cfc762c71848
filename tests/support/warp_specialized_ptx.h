// The PTX of a generated module, and the instructions that make a Hopper kernel warp-specialised in it.
#pragma once
#include <catch2/catch.hpp>

#include <string>

#include "compiler/codegen/kernel_source.h"
#include "runtime/nvrtc.h"

namespace flexjit::test {

// Compiles the module for sm_90a and checks its PTX for register reallocation both ways, TMA copies and wgmma.
inline std::string check_warp_specialized_ptx(const KernelSource& module) {
  runtime::NvrtcRequest req;
  req.source = module.source;
  req.program_name = module.name + ".cu";
  req.arch = "sm_90a";
  req.want_ptx = true;
  const runtime::NvrtcOutput out = runtime::NvrtcCompiler().compile(req);
  CHECK(out.ptx.find("setmaxnreg.dec.sync.aligned.u32") != std::string::npos);
  CHECK(out.ptx.find("setmaxnreg.inc.sync.aligned.u32") != std::string::npos);
  CHECK(out.ptx.find("cp.async.bulk.tensor") != std::string::npos);
  CHECK(out.ptx.find("wgmma.mma_async") != std::string::npos);
  return out.ptx;
}

}  // namespace flexjit::test
