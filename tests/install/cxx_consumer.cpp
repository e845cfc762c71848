// A C++ program built against an installed flexjit through pkg-config: the installed headers
// compile on their own, and the C++ API reports a spec's errors as CompileError.
#include <flexjit/dsl/compile_error.h>
#include <flexjit/flexjit.hpp>

#include <cstdio>

int main() {
  flexjit::dsl::Spec spec;
  spec.mask_mod = "q >= kvv";
  flexjit::Runtime rt;
  try {
    rt.compile(spec);
  } catch (const flexjit::CompileError& e) {
    if (e.diagnostics().render_text().find("did you mean `kv`") == std::string::npos) return 1;
    spec.mask_mod = "q >= kv";
    auto kernel = rt.compile(spec);
    std::printf("cxx_consumer: a bad spec gave CompileError, the fixed one compiled (%s)\n", kernel->spec().mask_mod->c_str());
    return 0;
  }
  return 1;
}
