// `flexjit random --shape 1,4,256,64 --dtype bf16 --out q.npy`: random test tensors, so the
// demo and users can try `run` without Python.
#include <fmt/format.h>

#include <algorithm>
#include <random>

#include "dsl/error.h"
#include "runtime/npy.h"
#include "tools/commands.h"
#include "tools/tensor_io.h"

namespace flexjit::tools {

namespace {

struct RandomOptions {
  std::string shape, dtype = "bf16", out, ints;
  unsigned seed = 0;
  bool sorted = false;
};

int run_random(const RandomOptions& o) {
  auto dt = dsl::parse_dtype(o.dtype);
  if (!dt) throw Error(fmt::format("--dtype {} is not an element type", o.dtype));
  std::mt19937 rng(o.seed);
  int64_t lo = 0, hi = 2;
  if (!o.ints.empty()) {
    char* end = nullptr;
    lo = std::strtoll(o.ints.c_str(), &end, 10);
    if (*end != ',') throw Error(fmt::format("--ints expects LO,HI, got '{}'", o.ints));
    const char* second = end + 1;
    hi = std::strtoll(second, &end, 10);
    if (*end != '\0' || end == second || hi <= lo) throw Error(fmt::format("--ints expects LO,HI with LO < HI (HI exclusive), got '{}'", o.ints));
  }
  NpyArray a = random_array(*dt, parse_shape(o.shape, "--shape"), rng, lo, hi);
  const int64_t n = a.numel();
  if (o.sorted) {
    if (*dt == dsl::DType::I32) std::sort(a.as<int32_t>(), a.as<int32_t>() + n);
    else if (*dt == dsl::DType::I64) std::sort(a.as<int64_t>(), a.as<int64_t>() + n);
    else if (*dt == dsl::DType::F32) std::sort(a.as<float>(), a.as<float>() + n);
    else throw Error("--sorted applies to i32, i64 and f32");
  }
  write_npy(o.out, a);
  return 0;
}

}  // namespace

void add_random_command(CLI::App& app, Action& action) {
  auto* cmd = app.add_subcommand("random", "Write a random tensor as .npy (normal floats, uniform ints)");
  auto o = std::make_shared<RandomOptions>();
  cmd->add_option("--shape", o->shape, "Shape, e.g. 1,4,256,64")->required();
  cmd->add_option("--dtype", o->dtype, "f32, f16, bf16, i32, i64, u8 or bool")->capture_default_str();
  cmd->add_option("--ints", o->ints, "Integer range LO,HI (HI exclusive) for integer types");
  cmd->add_flag("--sorted", o->sorted, "Sort the values (document ids)");
  cmd->add_option("--seed", o->seed, "Random seed")->capture_default_str();
  cmd->add_option("--out", o->out, "Output .npy file")->required();
  cmd->callback([o, &action] { action = [o] { return run_random(*o); }; });
}

}  // namespace flexjit::tools
