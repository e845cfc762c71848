// A spec: the user's score_mod / mask_mod text plus buffer and parameter declarations and
// the attention configuration, read from a JSON file or assembled from CLI flags.
#pragma once
#include <optional>
#include <string>
#include <vector>

#include "dsl/decl.h"
#include "dsl/diagnostic.h"

namespace flexjit::dsl {

struct Spec {
  std::string name = "spec";
  std::optional<std::string> score_mod;  // program text, or none
  std::optional<std::string> mask_mod;
  std::vector<BufferDecl> buffers;
  std::vector<ParamDecl> params;
  DType dtype = DType::BF16;  // element type of q, k, v and o
  int head_dim = 128;         // D of q and k
  int head_dim_v = 0;         // D of v and o; 0 means head_dim
  int gqa_group = 0;          // query heads per KV head when fixed by the spec; 0 = taken from the launch

  int value_head_dim() const { return head_dim_v ? head_dim_v : head_dim; }
  const BufferDecl* find_buffer(const std::string& n) const;
  const ParamDecl* find_param(const std::string& n) const;
};

// Head dimensions the GPU kernels support natively.
const std::vector<int>& supported_head_dims();

// Reads a spec from JSON text:
//   {"name": "sam", "score_mod": "...", "mask_mod": "...",
//    "buffers": ["rel_h: bf16[B, H, Sq, 64]", ...]  (or {"rel_h": "bf16[B, H, Sq, 64]"}),
//    "params": ["window: int", "const cap: float = 30"], "grad": ["rel_h"],
//    "dtype": "bf16", "head_dim": 64, "head_dim_v": 64, "gqa_group": 4}
// Errors go to diags (code E0401 for the file's structure, E03xx for declarations).
std::optional<Spec> parse_spec_json(const std::string& text, const std::string& file_name, Diagnostics& diags);

// Adds declarations given as strings (spec files and CLI flags share this); reports
// duplicates and bad head dims. Returns false if anything was reported.
bool add_buffer(Spec& spec, const std::string& decl, const std::string& source_name, Diagnostics& diags);
bool add_param(Spec& spec, const std::string& decl, const std::string& source_name, Diagnostics& diags, bool force_const = false);
bool validate_spec(const Spec& spec, const std::string& source_name, Diagnostics& diags);

// The spec as JSON (what `parse_spec_json` reads).
std::string spec_to_json(const Spec& spec);

}  // namespace flexjit::dsl
