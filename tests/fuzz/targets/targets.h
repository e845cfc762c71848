// The fuzz targets: one function per untrusted input of flexjit. Each runs one input and
// returns "" when the input was handled as documented (accepted, or rejected with an error),
// else a description of the violation. libFuzzer drives them (libfuzzer_entry.cpp aborts on a
// violation) and corpus_replay_test.cpp replays every checked-in input in the ordinary builds.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace flexjit::fuzz {

// score_mod, mask_mod and extra declarations, NUL-separated, through parsing, checking,
// lowering, the passes, CUDA code generation (forward, backward, decode) and the interpreter.
std::string run_frontend(const uint8_t* data, size_t size);
// A spec file's text through parse_spec_json (what `flexjit check SPEC` and flexjit_compile read).
std::string run_spec_json(const uint8_t* data, size_t size);
// A .npy image through parse_npy.
std::string run_npy(const uint8_t* data, size_t size);
// A disk-cache entry file through DiskCache::load and list (header, key text, JSON blob,
// checksum, cubin). The first byte chooses whether the checksum is recomputed first, so the
// fuzzer also reaches what lies behind it.
std::string run_disk_cache(const uint8_t* data, size_t size);
// A sequence of C API calls with shapes, strides, dtypes and null pointers taken from the
// input, launched on the CPU backend (only in builds with it).
std::string run_capi(const uint8_t* data, size_t size);

struct Target {
  const char* name;  // also the corpus directory: tests/fuzz/corpus/<name>
  std::string (*run)(const uint8_t* data, size_t size);
};
const std::vector<Target>& all_targets();

}  // namespace flexjit::fuzz
