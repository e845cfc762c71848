// The repository is self-contained: no Markdown file and no source comment points outside it
// (a sibling directory of the checkout, an absolute machine path), every relative Markdown
// link and every mentioned Markdown path names a file of the checkout, and every #anchor names
// a heading. Also: the language reference lists every diagnostic code.
#include <catch2/catch.hpp>
#include <fmt/format.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <map>
#include <regex>
#include <set>
#include <sstream>

#include "dsl/diagnostic.h"
#include "support/shell.h"
#include "support/test_paths.h"

namespace fs = std::filesystem;
namespace test = flexjit::test;

namespace {


enum class Kind { Markdown, CLike, Hash, Python };

std::optional<Kind> kind_of(const fs::path& p) {
  const std::string ext = p.extension().string(), name = p.filename().string();
  if (ext == ".md") return Kind::Markdown;
  if (ext == ".c" || ext == ".cc" || ext == ".cpp" || ext == ".h" || ext == ".hpp" || ext == ".cu" || ext == ".cuh") return Kind::CLike;
  if (ext == ".py") return Kind::Python;
  if (ext == ".sh" || ext == ".cmake" || ext == ".in" || name == "CMakeLists.txt" || name == "Makefile" || name == "run") return Kind::Hash;
  return std::nullopt;
}

// The checkout's files: git's tracked and untracked-but-not-ignored files, else a walk that
// skips hidden and build directories.
std::vector<std::string> repository_files(const fs::path& root) {
  std::vector<std::string> files;
  if (fs::exists(root / ".git")) {
    test::ShellResult r = test::run_shell(fmt::format("git -C '{}' ls-files -co --exclude-standard", root.string()));
    if (r.status == 0) {
      std::istringstream in(r.out);
      for (std::string line; std::getline(in, line);)
        if (!line.empty() && fs::is_regular_file(root / line)) files.push_back(line);
      return files;
    }
  }
  for (auto it = fs::recursive_directory_iterator(root); it != fs::recursive_directory_iterator(); ++it) {
    const std::string name = it->path().filename().string();
    if (it->is_directory() && (name[0] == '.' || name.rfind("build", 0) == 0 || fs::exists(it->path() / "CMakeCache.txt"))) {
      it.disable_recursion_pending();
      continue;
    }
    if (it->is_regular_file()) files.push_back(fs::relative(it->path(), root).string());
  }
  return files;
}

struct Segment {
  int line;
  std::string text;
};

// The text a check reads: all of a Markdown file; the comments of source files (and Python's
// docstrings), one segment per line. String and character literals are skipped, so a `//` or
// `#` inside one starts no comment.
std::vector<Segment> readable_text(const std::string& text, Kind kind) {
  std::vector<Segment> out;
  if (kind == Kind::Markdown) {
    std::istringstream in(text);
    int line = 1;
    for (std::string l; std::getline(in, l); ++line) out.push_back({line, l});
    return out;
  }
  int line = 1;
  std::string current;
  auto flush = [&] {
    if (!current.empty()) out.push_back({line, current});
    current.clear();
  };
  auto starts = [&](size_t i, const char* s) { return text.compare(i, std::char_traits<char>::length(s), s) == 0; };
  enum class State { Code, LineComment, BlockComment, Docstring } state = State::Code;
  for (size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (c == '\n') {
      flush();
      ++line;
      if (state == State::LineComment) state = State::Code;
      continue;
    }
    switch (state) {
      case State::LineComment: current += c; break;
      case State::BlockComment:
        if (starts(i, "*/")) state = State::Code, ++i;
        else current += c;
        break;
      case State::Docstring:
        if (starts(i, "\"\"\"")) state = State::Code, i += 2;
        else current += c;
        break;
      case State::Code:
        if (kind == Kind::CLike && starts(i, "//")) {
          state = State::LineComment, ++i;
        } else if (kind == Kind::CLike && starts(i, "/*")) {
          state = State::BlockComment, ++i;
        } else if (kind == Kind::Python && starts(i, "\"\"\"")) {
          state = State::Docstring, i += 2;
        } else if ((kind == Kind::Hash || kind == Kind::Python) && c == '#') {
          state = State::LineComment;
        } else if (kind == Kind::CLike && c == '"' && i > 0 && text[i - 1] == 'R') {
          // A raw string: R"delim( ... )delim".
          const size_t open = text.find('(', i);
          const std::string close = ")" + text.substr(i + 1, open - i - 1) + "\"";
          const size_t end = text.find(close, open);
          if (end == std::string::npos) return out;
          line += static_cast<int>(std::count(text.begin() + static_cast<long>(i), text.begin() + static_cast<long>(end), '\n'));
          i = end + close.size() - 1;
        } else if ((kind != Kind::Hash && (c == '"' || c == '\'')) && !(c == '\'' && i > 0 && std::isalnum(static_cast<unsigned char>(text[i - 1])))) {
          // A string or character literal on one line (a quote after a digit is a C++ digit separator).
          size_t j = i + 1;
          while (j < text.size() && text[j] != c && text[j] != '\n') j += text[j] == '\\' ? 2 : 1;
          i = j < text.size() && text[j] == '\n' ? j - 1 : j;
        }
        break;
    }
  }
  flush();
  return out;
}

// `p` made lexically normal; nullopt when it climbs above `root`.
std::optional<fs::path> inside(const fs::path& root, const fs::path& p) {
  const fs::path n = p.lexically_normal();
  const fs::path rel = n.lexically_relative(root);
  if (rel.empty() || *rel.begin() == "..") return std::nullopt;
  return n;
}

// GitHub's anchor of a heading: lower case, punctuation other than '-' and '_' dropped, spaces as '-'.
std::string slug(const std::string& heading) {
  std::string s;
  for (unsigned char c : heading) {
    if (std::isalnum(c) || c == '-' || c == '_') s += static_cast<char>(std::tolower(c));
    else if (c == ' ') s += '-';
    else if (c >= 0x80) s += static_cast<char>(c);
  }
  return s;
}

std::set<std::string> anchors_of(const fs::path& markdown) {
  std::set<std::string> out;
  std::ifstream f(markdown);
  bool fenced = false;
  for (std::string line; std::getline(f, line);) {
    if (line.rfind("```", 0) == 0) fenced = !fenced;
    if (fenced || line.empty() || line[0] != '#') continue;
    const size_t start = line.find_first_not_of('#');
    if (start == std::string::npos || line[start] != ' ') continue;
    out.insert(slug(line.substr(start + 1)));
  }
  return out;
}

struct Checker {
  fs::path root;
  std::set<std::string> basenames;
  std::map<fs::path, std::set<std::string>> anchors;
  std::vector<std::string> problems;
  // A mention that means a document of the repository: a path into one of its top-level
  // directories, or a bare upper-case name (`DECODE_NOTES.md`). Others (`$OUT/table.md`) name
  // files that scripts write.
  bool names_repository_doc(const std::string& p) const {
    const size_t slash = p.find('/');
    if (slash != std::string::npos) return fs::is_directory(root / p.substr(0, slash));
    return std::all_of(p.begin(), p.end() - 3, [](char ch) { return std::isupper(static_cast<unsigned char>(ch)) || std::isdigit(static_cast<unsigned char>(ch)) || ch == '_'; });
  }
  void report(const std::string& file, int line, const std::string& mention, const std::string& why) {
    problems.push_back(fmt::format("{}:{}: `{}` {}", file, line, mention, why));
  }

  void check_file(const std::string& rel, Kind kind) {
    std::ifstream f(root / rel);
    std::stringstream ss;
    ss << f.rdbuf();
    const fs::path dir = (root / rel).parent_path();
    static const std::regex absolute(R"((?:^|[^\w.~/-])(/(?:work|home)/[^\s)\]>'"`]*))");
    static const std::regex climbing(R"((?:^|[\s`'"(\[<=,;:])((?:\.\./)+[\w.-][\w./-]*))");
    static const std::regex link(R"(\[[^\]]*\]\(([^)\s]+)\))");
    static const std::regex markdown_path(R"((?:^|[^\w./-])([\w.-][\w./-]*\.md)(?![\w/]))");
    for (const Segment& seg : readable_text(ss.str(), kind)) {
      for (std::sregex_iterator m(seg.text.begin(), seg.text.end(), absolute), e; m != e; ++m)
        report(rel, seg.line, (*m)[1], "is an absolute path outside the repository");
      for (std::sregex_iterator m(seg.text.begin(), seg.text.end(), climbing), e; m != e; ++m) {
        std::string p = (*m)[1];
        while (!p.empty() && p.back() == '.') p.pop_back();  // a sentence's full stop
        auto from_file = inside(root, dir / p);
        if (!from_file) report(rel, seg.line, p, "leaves the repository");
        else if (!fs::exists(*from_file) && !inside(root, root / p)) report(rel, seg.line, p, "does not exist here and leaves the repository from its root");
      }
      if (kind == Kind::Markdown) {
        for (std::sregex_iterator m(seg.text.begin(), seg.text.end(), link), e; m != e; ++m) check_link(rel, seg.line, (*m)[1], dir);
      }
      for (std::sregex_iterator m(seg.text.begin(), seg.text.end(), markdown_path), e; m != e; ++m) {
        const std::string p = (*m)[1];
        if (p.rfind("../", 0) == 0 || !names_repository_doc(p)) continue;
        const bool found = p.find('/') == std::string::npos ? basenames.count(p) > 0 : fs::exists(root / p) || fs::exists(dir / p);
        if (!found) report(rel, seg.line, p, "names a Markdown file that is not in the repository");
      }
    }
  }

  void check_link(const std::string& rel, int line, const std::string& target, const fs::path& dir) {
    if (target.find("://") != std::string::npos || target.rfind("mailto:", 0) == 0) return;
    const size_t hash = target.find('#');
    const std::string path = target.substr(0, hash), anchor = hash == std::string::npos ? "" : target.substr(hash + 1);
    const fs::path resolved = path.empty() ? root / rel : dir / path;
    auto in = inside(root, resolved);
    if (!in) return report(rel, line, target, "is a link that leaves the repository");
    if (!fs::exists(*in)) return report(rel, line, target, "is a link to a file that does not exist");
    if (anchor.empty() || in->extension() != ".md") return;
    auto it = anchors.find(*in);
    if (it == anchors.end()) it = anchors.emplace(*in, anchors_of(*in)).first;
    if (!it->second.count(anchor)) report(rel, line, target, "is a link to a heading that does not exist");
  }
};

}  // namespace

TEST_CASE("no Markdown file or source comment points outside the repository or at a missing file", "[docs]") {
  Checker c;
  c.root = fs::canonical(test::source_dir());
  const std::vector<std::string> files = repository_files(c.root);
  REQUIRE(files.size() > 100);
  for (const std::string& f : files) c.basenames.insert(fs::path(f).filename().string());
  int checked = 0;
  for (const std::string& f : files)
    if (auto kind = kind_of(f)) {
      c.check_file(f, *kind);
      ++checked;
    }
  INFO(checked << " files read");
  std::string all;
  for (const std::string& p : c.problems) all += p + "\n";
  INFO(all);
  CHECK(c.problems.empty());
}

TEST_CASE("the checker finds what leaves the repository", "[docs]") {
  const fs::path root = fs::temp_directory_path() / ("flexjit-links-" + std::to_string(::getpid()));
  fs::create_directories(root / "docs");
  std::ofstream(root / "docs" / "A.md") << "# Title\n\n## A section\n\n[ok](A.md#a-section) [bad anchor](#nope) [out](../../x.md)\n"
                                           "see /work/shared/DSL.md and `../shared/ANCHORS.md`, docs/Missing.md, B.md\n";
  std::ofstream(root / "code.cpp") << "int x = 1;  // as ../outside/y.md says; docs/A.md is fine\nconst char* s = \"/work/ok-in-code\";\n";
  Checker c;
  c.root = root;
  c.basenames = {"A.md", "code.cpp"};
  c.check_file("docs/A.md", Kind::Markdown);
  c.check_file("code.cpp", Kind::CLike);
  std::string all;
  for (const std::string& p : c.problems) all += p + "\n";
  INFO(all);
  CHECK(c.problems.size() == 8);  // the link that climbs out is reported twice: as a link and as a path
  for (const char* expected : {"`#nope` is a link to a heading", "`../../x.md` is a link that leaves", "`/work/shared/DSL.md` is an absolute",
                               "`../shared/ANCHORS.md` does not exist here", "`docs/Missing.md` names", "`B.md` names",
                               "code.cpp:1: `../outside/y.md` leaves"})
    CHECK(all.find(expected) != std::string::npos);
  fs::remove_all(root);
}

TEST_CASE("the language reference and DIAGNOSTICS.md list every diagnostic code", "[docs]") {
  const fs::path docs = test::source_dir() / "docs";
  auto read = [](const fs::path& p) {
    std::ifstream f(p);
    std::stringstream ss;
    ss << f.rdbuf();
    return ss.str();
  };
  const std::string language = read(docs / "LANGUAGE.md"), diagnostics = read(docs / "DIAGNOSTICS.md");
#define FLEXJIT_EXPECT_DOCUMENTED(name, number, text)                                 \
  {                                                                                   \
    const std::string row = fmt::format("| E{:04d} | {} |", number, #name);           \
    INFO(row);                                                                        \
    CHECK(language.find(row) != std::string::npos);                                   \
    CHECK(diagnostics.find(row) != std::string::npos);                                \
  }
  FLEXJIT_DIAGNOSTIC_CODES(FLEXJIT_EXPECT_DOCUMENTED)
#undef FLEXJIT_EXPECT_DOCUMENTED
}
