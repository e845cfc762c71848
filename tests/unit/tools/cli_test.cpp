// The flexjit CLI as users run it: exit codes, outputs, diagnostics, and the disk cache
// seen from several processes (hits, corrupt entries, concurrency, unwritable directories).
#include <catch2/catch.hpp>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>

#include "support/shell.h"
#include "support/test_paths.h"

namespace fs = std::filesystem;

namespace {

using Result = flexjit::test::ShellResult;
Result sh(const std::string& command) { return flexjit::test::run_shell(command); }

std::string fj() { return flexjit::test::cli_path(); }
std::string gallery(const char* name) { return (flexjit::test::gallery_dir() / name).string(); }

fs::path fresh_dir(const std::string& name) {
  fs::path d = fs::temp_directory_path() / ("flexjit-cli-test-" + name + "-" + std::to_string(::getpid()));
  fs::remove_all(d);
  fs::create_directories(d);
  return d;
}

}  // namespace

TEST_CASE("check: exit 0 on a good spec, 1 with caret diagnostics on a bad one", "[cli]") {
  Result ok = sh(fj() + " check " + gallery("sam_relpos.json"));
  CHECK(ok.status == 0);
  Result bad = sh(fj() + " check --score 'score + rel_h[b, h, q, kvv // 64]' --buffer 'rel_h: bf16[B, H, Sq, 64]'");
  CHECK(bad.status == 1);
  CHECK(bad.out.find("error[E0201]: unknown name `kvv`") != std::string::npos);
  CHECK(bad.out.find("^^^ did you mean `kv`?") != std::string::npos);
  Result json = sh(fj() + " --diagnostics=json check --mask 'q >= kv &&'");
  CHECK(json.status == 1);
  CHECK(json.out.find("\"code\": \"E0101\"") != std::string::npos);
  CHECK(sh(fj() + " check --help").status == 0);
  CHECK(sh(fj() + " frobnicate").status == 1);
}

TEST_CASE("dump: ast, ir with analyses, cuda and ptx", "[cli]") {
  Result ast = sh(fj() + " dump --mask 'q >= kv && q - kv < 4' --emit=ast");
  CHECK(ast.status == 0);
  CHECK(ast.out.find("(&& (>= q kv) (< (- q kv) 4))") != std::string::npos);
  Result ir = sh(fj() + " dump " + gallery("sam_relpos.json") + " --emit=ir");
  CHECK(ir.status == 0);
  CHECK(ir.out.find("load rel_h: depends on b, h, q, kv") != std::string::npos);
  CHECK(ir.out.find("hoisted: once per row and 64-wide KV tile") != std::string::npos);
  CHECK(ir.out.find("load rel_w") != std::string::npos);
  CHECK(ir.out.find("unchecked: every index proven in range") != std::string::npos);
  Result after = sh(fj() + " dump --score 'score * (2 + 3)' --emit=ir --dump-after=lower");
  CHECK(after.out.find("2 + 3") != std::string::npos);
  Result folded = sh(fj() + " dump --score 'score * (2 + 3)' --emit=ir --dump-after=fold");
  CHECK(folded.out.find("5") != std::string::npos);
  CHECK(sh(fj() + " dump --score 'score' --emit=ir --dump-after=nonsense").status == 1);
  Result grad = sh(fj() + " dump " + gallery("softcap.json") + " --emit=grad");
  CHECK(grad.status == 0);
  CHECK(grad.out.find("tanh") != std::string::npos);
  Result scatter = sh(fj() + " dump " + gallery("alibi.json") + " --grad slope --emit=grad");
  CHECK(scatter.out.find("grad_slope[h] += dS * coefficient") != std::string::npos);
  Result cuda = sh(fj() + " dump " + gallery("sam_relpos.json") + " --emit=cuda");
  CHECK(cuda.out.find("// FUSION POINT") == std::string::npos);  // the template is included, not inlined
  CHECK(cuda.out.find("struct FlexVariant") != std::string::npos);
  Result ptx = sh(fj() + " dump " + gallery("causal.json") + " --emit=ptx --arch sm_80");
  CHECK(ptx.status == 0);
  CHECK(ptx.out.find(".target sm_80") != std::string::npos);
  CHECK(ptx.out.find("mma.sync") != std::string::npos);
  // The backward module as a launch picks it: on sm_90a SAM's rel_h / rel_w are staged in the KV-major kernel
  // (one pass), deterministic too (dQ by fixed-point bulk rows); for sm_80 their row-owned gradients take the
  // query-major pass.
  Result bwd = sh(fj() + " dump " + gallery("sam_relpos.json") + " --grad rel_h --grad rel_w --backward --emit=cuda");
  CHECK(bwd.status == 0);
  CHECK(bwd.out.find("struct FlexGradVariant") != std::string::npos);
  CHECK(bwd.out.find("static constexpr bool kStagedCol = true;") != std::string::npos);
  CHECK(bwd.out.find("flexjit_bwd_qmajor") == std::string::npos);
  Result bwd80 = sh(fj() + " dump " + gallery("sam_relpos.json") + " --grad rel_h --grad rel_w --backward --arch sm_80 --emit=cuda");
  CHECK(bwd80.out.find("flexjit_bwd_qmajor") != std::string::npos);
  Result det = sh(fj() + " dump " + gallery("sam_relpos.json") + " --grad rel_h --grad rel_w --backward --deterministic --emit=cuda");
  CHECK(det.out.find("flexjit_bwd_qmajor") == std::string::npos);
  CHECK(det.out.find("/*kDqBulk=*/true") != std::string::npos);
  Result atomic = sh(fj() + " dump " + gallery("sam_relpos.json") + " --grad rel_h --backward --dq atomic --emit=cuda");
  CHECK(atomic.out.find("flexjit_bwd_qmajor") == std::string::npos);
  CHECK(sh(fj() + " dump " + gallery("causal.json") + " --backward --emit=ir").status == 1);
  // The Hopper backward is warp-specialised: register reallocation and TMA copies in its PTX.
  Result bptx = sh(fj() + " dump " + gallery("causal.json") + " --backward --emit=ptx --arch sm_90a");
  CHECK(bptx.status == 0);
  CHECK(bptx.out.find("setmaxnreg") != std::string::npos);
  CHECK(bptx.out.find("cp.async.bulk.tensor") != std::string::npos);
  // The module for strides TMA cannot describe: the 256-thread backward, no tensor maps.
  Result notma = sh(fj() + " dump " + gallery("causal.json") + " --backward --no-tma --emit=cuda --arch sm_90a");
  CHECK(notma.status == 0);
  CHECK(notma.out.find("FlexBackwardTmaMaps") == std::string::npos);
  Result bcuda = sh(fj() + " dump " + gallery("causal.json") + " --backward --emit=cuda --arch sm_90a");
  CHECK(bcuda.out.find("FlexBackwardTmaMaps") != std::string::npos);
  // A ragged batch's backward: every kernel on its sequence's view; tile classes by the mask's intervals.
  Result ragged = sh(fj() + " dump " + gallery("causal.json") + " --backward --ragged --emit=cuda --arch sm_90a");
  CHECK(ragged.status == 0);
  CHECK(ragged.out.find("flex_bwd::ragged_sequence") != std::string::npos);
  CHECK(ragged.out.find("FlexRaggedTileStateParams") != std::string::npos);
  CHECK(bcuda.out.find("ragged_sequence") == std::string::npos);
  CHECK(sh(fj() + " dump " + gallery("causal.json") + " --backward --ragged --dq qmajor --emit=cuda").status == 1);
  // The ragged-prefill forward module.
  Result varlen = sh(fj() + " dump " + gallery("causal.json") + " --varlen --emit=cuda --arch sm_90a");
  CHECK(varlen.status == 0);
  CHECK(varlen.out.find("flexjit_forward_varlen") != std::string::npos);
}

TEST_CASE("eval: Python arithmetic, round-trip floats, errors", "[cli]") {
  Result r = sh(fj() + " eval --score 'score + float((q - kv) // 4) + float((q - kv) % 4)' --at b=0,h=0,q=3,kv=10,score=0.5");
  CHECK(r.status == 0);
  CHECK(r.out == "score_mod: -0.5\n");  // 0.5 + (-7 // 4 = -2) + (-7 % 4 = 1)
  Result m = sh(fj() + " eval " + gallery("sliding_window.json") + " --at b=0,h=0,q=10,kv=3 --set window=4");
  CHECK(m.out == "mask_mod: false\n");
  Result inf = sh(fj() + " eval --score 'where(q >= kv, score, -inf)' --at b=0,h=0,q=1,kv=3,score=1");
  CHECK(inf.out == "score_mod: -inf\n");
  Result missing = sh(fj() + " eval " + gallery("document.json") + " --at b=0,h=0,q=1,kv=3");
  CHECK(missing.status == 1);
  CHECK(missing.out.find("--load doc=FILE.npy") != std::string::npos);
  fs::path d = fresh_dir("eval");
  CHECK(sh(fj() + " random --shape 8 --dtype i32 --ints 0,3 --sorted --out " + (d / "doc.npy").string()).status == 0);
  Result doc = sh(fj() + " eval " + gallery("document.json") + " --at b=0,h=0,q=0,kv=0 --load doc=" + (d / "doc.npy").string());
  CHECK(doc.status == 0);
  CHECK(doc.out == "mask_mod: true\n");
  Result oob = sh(fj() + " eval " + gallery("document.json") + " --at b=0,h=0,q=0,kv=9 --load doc=" + (d / "doc.npy").string());
  CHECK(oob.status == 1);
  CHECK(oob.out.find("doc") != std::string::npos);
}

TEST_CASE("compile fills the disk cache; a second compile is a hit; corrupt entries recompile", "[cli][cache]") {
  fs::path cache = fresh_dir("cache");
  std::string env = "FLEXJIT_CACHE_DIR=" + cache.string() + " ";
  Result first = sh(env + fj() + " compile " + gallery("causal.json") + " --arch sm_80");
  REQUIRE(first.status == 0);
  CHECK(first.out.find("compiled") != std::string::npos);
  auto t0 = std::chrono::steady_clock::now();
  Result second = sh(env + fj() + " compile " + gallery("causal.json") + " --arch sm_80");
  double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  CHECK(second.out.find("disk") != std::string::npos);
  CHECK(s < 0.5);
  Result ls = sh(env + fj() + " cache ls");
  CHECK(ls.out.find("sm_80") != std::string::npos);
  // Corrupt every entry: the next compile removes and recompiles them.
  for (const auto& e : fs::recursive_directory_iterator(cache))
    if (e.path().extension() == ".bin") std::ofstream(e.path(), std::ios::binary | std::ios::trunc) << "garbage";
  Result third = sh(env + fj() + " compile " + gallery("causal.json") + " --arch sm_80");
  CHECK(third.status == 0);
  CHECK(third.out.find("compiled") != std::string::npos);
  CHECK(sh(env + fj() + " compile " + gallery("causal.json") + " --arch sm_80").out.find("disk") != std::string::npos);
  Result cleared = sh(env + fj() + " cache clear");
  CHECK(cleared.out.find("removed") != std::string::npos);
  CHECK(sh(env + fj() + " cache info").out.find("entries: 0") != std::string::npos);
}

TEST_CASE("compile --decode --kv-dtype builds the FP8 decode module a plan of those heads loads", "[cli][cache]") {
  std::string env = "FLEXJIT_CACHE_DIR=" + fresh_dir("fp8-decode").string() + " ";
  Result r = sh(env + fj() + " compile " + gallery("causal.json") + " --arch sm_80 --decode 32,8 --kv-dtype fp8");
  INFO(r.out);
  CHECK(r.status == 0);
  CHECK(r.out.find("causal_decode_bf16_d128_mt1_st3_f8e4m3") != std::string::npos);
  Result bad = sh(env + fj() + " compile " + gallery("causal.json") + " --arch sm_80 --decode 32,8 --kv-dtype f16");
  CHECK(bad.status != 0);
  CHECK(bad.out.find("--kv-dtype `f16` is not a KV cache type of a bf16 spec") != std::string::npos);
}

TEST_CASE("several processes compiling one kernel at once all succeed and compile it once", "[cli][cache]") {
  fs::path cache = fresh_dir("race");
  std::string env = "FLEXJIT_CACHE_DIR=" + cache.string() + " ";
  std::string one = env + fj() + " compile " + gallery("alibi.json") + " --arch sm_80";
  Result r = sh("(" + one + " & " + one + " & " + one + " & " + one + " & wait) ");
  CHECK(r.out.find("error") == std::string::npos);
  size_t compiled = 0, pos = 0;
  while ((pos = r.out.find(": compiled", pos)) != std::string::npos) ++compiled, ++pos;
  size_t hits = 0;
  pos = 0;
  while ((pos = r.out.find(": disk", pos)) != std::string::npos) ++hits, ++pos;
  INFO(r.out);
  CHECK(compiled == 1);
  CHECK(hits == 3);
}

TEST_CASE("an unwritable cache directory still works, with one warning", "[cli][cache]") {
  fs::path d = fresh_dir("ro");
  std::ofstream(d / "file") << "x";  // a directory below a regular file can never be created
  std::string env = "FLEXJIT_CACHE_DIR=" + (d / "file" / "cache").string() + " ";
  Result r = sh(env + fj() + " compile " + gallery("causal.json") + " --arch sm_80");
  CHECK(r.status == 0);
  size_t warnings = 0, pos = 0;
  while ((pos = r.out.find("warn", pos)) != std::string::npos) ++warnings, ++pos;
  INFO(r.out);
  CHECK(warnings >= 1);
  CHECK(r.out.find("compiled") != std::string::npos);
}
