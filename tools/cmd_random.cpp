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
  NpyArray a;
  a.dtype = *dt;
  a.shape = parse_shape(o.shape, "--shape");
  int64_t n = a.numel();
  a.data.resize(static_cast<size_t>(n) * dsl::dtype_size(*dt));
  std::mt19937 rng(o.seed);
  std::normal_distribution<float> normal(0.f, 1.f);
  int64_t lo = 0, hi = 2;
  if (!o.ints.empty()) {
    char* end = nullptr;
    lo = std::strtoll(o.ints.c_str(), &end, 10);
    if (*end != ',') throw Error(fmt::format("--ints expects LO,HI, got '{}'", o.ints));
    const char* second = end + 1;
    hi = std::strtoll(second, &end, 10);
    if (*end != '\0' || end == second || hi <= lo) throw Error(fmt::format("--ints expects LO,HI with LO < HI (HI exclusive), got '{}'", o.ints));
  }
  std::uniform_int_distribution<int64_t> ints(lo, std::max(lo, hi - 1));
  for (int64_t i = 0; i < n; ++i) {
    switch (*dt) {
      case dsl::DType::F32: a.as<float>()[i] = normal(rng); break;
      case dsl::DType::F16: a.as<uint16_t>()[i] = float_to_half(normal(rng)); break;
      case dsl::DType::BF16: a.as<uint16_t>()[i] = float_to_bf16(normal(rng)); break;
      case dsl::DType::I32: a.as<int32_t>()[i] = static_cast<int32_t>(ints(rng)); break;
      case dsl::DType::I64: a.as<int64_t>()[i] = ints(rng); break;
      case dsl::DType::U8: a.as<uint8_t>()[i] = static_cast<uint8_t>(ints(rng)); break;
      case dsl::DType::Bool: a.as<uint8_t>()[i] = static_cast<uint8_t>(ints(rng) & 1); break;
    }
  }
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
