// The annotated IR listing of `flexjit dump --emit=ir`: each mod's IR with, for every load,
// what it depends on, the stage it is hoisted to and whether its indices are proven in range.
#pragma once
#include <string>

#include "compiler/passes/range_analysis.h"
#include "compiler/spec_ir.h"

namespace flexjit {

// Range analysis of both mods over the forward kernel's index domains.
RangeInfo analyze_ir_ranges(const SpecIR& ir);

// `with_analyses`: annotate loads (dependence, stage for the default tile size, range facts).
std::string ir_report(const SpecIR& ir, bool with_analyses, int tile_size = 64);

}  // namespace flexjit
