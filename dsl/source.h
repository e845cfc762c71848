// Source text of one program (score_mod, mask_mod or a declaration) and positions within it.
#pragma once
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace flexjit::dsl {

// A resolved position: byte offset plus 1-based line and column.
struct SourceLoc {
  uint32_t offset = 0;
  uint32_t line = 1;
  uint32_t col = 1;
};

// A half-open byte range [begin, end) within one Source.
struct Span {
  uint32_t begin = 0;
  uint32_t end = 0;
};

class Source {
 public:
  Source(std::string name, std::string text);

  const std::string& name() const { return name_; }
  const std::string& text() const { return text_; }
  SourceLoc loc(uint32_t offset) const;
  // The text of a 1-based line, without its newline.
  std::string_view line_text(uint32_t line) const;
  uint32_t line_count() const { return static_cast<uint32_t>(line_starts_.size()); }

 private:
  std::string name_;
  std::string text_;
  std::vector<uint32_t> line_starts_;
};

}  // namespace flexjit::dsl
