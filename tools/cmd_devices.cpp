// `flexjit devices`: the CUDA devices flexjit can use (exit 1 when there are none, so
// scripts can pick the CPU backend).
#include <fmt/format.h>

#include "runtime/cuda_driver.h"
#include "runtime/device.h"
#include "tools/commands.h"

namespace flexjit::tools {

void add_devices_command(CLI::App& app, Action& action) {
  auto* cmd = app.add_subcommand("devices", "List CUDA devices (exit status 1 when there are none)");
  cmd->callback([&action] {
    action = [] {
      int n = runtime::device_count();
      if (n == 0) {
        fmt::print("no CUDA device: {}\n", runtime::cuda_driver_unavailable_reason());
        return 1;
      }
      for (int i = 0; i < n; ++i) {
        const runtime::DeviceInfo& d = runtime::device_info(i);
        fmt::print("cuda:{}  {}  compute {}.{}  {} SMs  compiles for {}\n", i, d.name, d.cc_major, d.cc_minor, d.sm_count, d.arch);
      }
      return 0;
    };
  });
}

}  // namespace flexjit::tools
