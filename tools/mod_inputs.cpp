#include "tools/mod_inputs.h"

#include <fmt/format.h>

#include "compiler/ir/ir_mutator.h"
#include "dsl/error.h"

namespace flexjit::tools {

std::pair<std::string, std::string> split_assignment(const std::string& s, const char* flag) {
  size_t eq = s.find('=');
  if (eq == std::string::npos || eq == 0 || eq + 1 == s.size())
    throw Error(fmt::format("{} expects NAME=VALUE, but got '{}'", flag, s));
  return {s.substr(0, eq), s.substr(eq + 1)};
}

std::vector<BufferView> ModInputs::buffer_views() const {
  std::vector<BufferView> views(arrays.size());
  for (size_t i = 0; i < arrays.size(); ++i)
    if (buffer_shapes[i]) views[i] = BufferView{arrays[i].dtype, arrays[i].data.data(), arrays[i].shape, contiguous_strides(arrays[i].shape)};
  return views;
}

ModInputs read_mod_inputs(const dsl::Spec& spec, const std::vector<std::string>& sets, const std::vector<std::string>& loads) {
  ModInputs in;
  for (const std::string& s : sets) {
    auto [k, v] = split_assignment(s, "--set");
    in.values[k] = v;
  }
  in.arrays.resize(spec.buffers.size());
  in.buffer_shapes.resize(spec.buffers.size());
  for (const std::string& l : loads) {
    auto [name, path] = split_assignment(l, "--load");
    int bi = -1;
    for (size_t i = 0; i < spec.buffers.size(); ++i)
      if (spec.buffers[i].name == name) bi = static_cast<int>(i);
    if (bi < 0) throw Error(fmt::format("--load names `{}`, which is not a declared buffer", name));
    in.arrays[bi] = read_npy(path);
    const dsl::BufferDecl& decl = spec.buffers[bi];
    if (in.arrays[bi].dtype != decl.dtype)
      throw Error(fmt::format("buffer `{}` is declared {} but '{}' holds {}", name, decl.str(), path, dsl::dtype_name(in.arrays[bi].dtype)));
    in.buffer_shapes[bi] = in.arrays[bi].shape;
  }
  return in;
}

void require_mod_inputs(const SpecIR& ir, const BoundValues& bound, const ModInputs& inputs) {
  std::vector<ir::Expr> roots;
  if (ir.score_mod) roots.push_back(ir.score_mod);
  if (ir.mask_mod) roots.push_back(ir.mask_mod);
  ir::for_each_node(roots, [&](const ir::Expr& e) {
    if (const ir::Symbol* s = e.as<ir::Symbol>())
      if (!bound.symbol_bound[s->index])
        throw Error(fmt::format("the spec uses shape symbol `{}`: give it with --set {}=N or load a buffer that has it", s->name, s->name));
    if (const ir::Param* p = e.as<ir::Param>())
      if (!inputs.values.count(p->name) && !ir.spec().params[p->index].has_value)
        throw Error(fmt::format("the spec uses runtime parameter `{}`: give it with --set {}=VALUE", p->name, p->name));
    if (const ir::Load* l = e.as<ir::Load>())
      if (!inputs.buffer_shapes[l->buffer]) throw Error(fmt::format("the spec loads buffer `{}`: give its data with --load {}=FILE.npy", l->name, l->name));
  });
}

}  // namespace flexjit::tools
