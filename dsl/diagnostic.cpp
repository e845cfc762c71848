#include "dsl/diagnostic.h"

#include <fmt/format.h>

#include <algorithm>
#include <nlohmann/json.hpp>

namespace flexjit::dsl {

std::string diag_code_string(DiagCode code) { return fmt::format("E{:04d}", static_cast<int>(code)); }

void Diagnostics::report(DiagCode code, std::shared_ptr<const Source> src, Span span, std::string message,
                         std::string label, std::vector<std::string> notes) {
  list_.push_back(Diagnostic{code, std::move(message), std::move(src), span, std::move(label), std::move(notes)});
}

void Diagnostics::append(const Diagnostics& other) {
  list_.insert(list_.end(), other.list_.begin(), other.list_.end());
}

std::string render_text(const Diagnostic& d) {
  std::string out = fmt::format("error[{}]: {}\n", diag_code_string(d.code), d.message);
  if (!d.source) {
    for (const std::string& n : d.notes) out += fmt::format("  = note: {}\n", n);
    return out;
  }
  const Source& src = *d.source;
  SourceLoc b = src.loc(d.span.begin);
  std::string gutter(std::to_string(b.line).size(), ' ');
  out += fmt::format("{}--> {}:{}:{}\n", gutter, src.name(), b.line, b.col);
  out += fmt::format("{} |\n", gutter);
  std::string_view line = src.line_text(b.line);
  out += fmt::format("{} | {}\n", b.line, line);
  // The caret covers the span up to the end of its first line, and at least one column.
  uint32_t line_end_col = static_cast<uint32_t>(line.size()) + 1;
  SourceLoc e = src.loc(d.span.end);
  uint32_t end_col = e.line == b.line ? e.col : line_end_col;
  uint32_t width = std::max<uint32_t>(1, end_col > b.col ? end_col - b.col : 1);
  std::string pad;
  for (uint32_t i = 0; i + 1 < b.col && i < line.size(); ++i) pad += line[i] == '\t' ? '\t' : ' ';
  out += fmt::format("{} | {}{}{}{}\n", gutter, pad, std::string(width, '^'), d.label.empty() ? "" : " ", d.label);
  for (const std::string& n : d.notes) out += fmt::format("{} = note: {}\n", gutter, n);
  return out;
}

std::string Diagnostics::render_text() const {
  std::string out;
  for (const Diagnostic& d : list_) out += dsl::render_text(d);
  if (list_.size() > 1) out += fmt::format("{} errors\n", list_.size());
  return out;
}

std::string Diagnostics::render_json() const {
  nlohmann::json arr = nlohmann::json::array();
  for (const Diagnostic& d : list_) {
    nlohmann::json j;
    j["code"] = diag_code_string(d.code);
    j["severity"] = "error";
    j["message"] = d.message;
    j["label"] = d.label;
    j["notes"] = d.notes;
    if (d.source) {
      SourceLoc b = d.source->loc(d.span.begin), e = d.source->loc(d.span.end);
      j["file"] = d.source->name();
      j["line"] = b.line;
      j["col"] = b.col;
      j["end_line"] = e.line;
      j["end_col"] = e.col;
      j["source_line"] = std::string(d.source->line_text(b.line));
    }
    arr.push_back(std::move(j));
  }
  // Source text may hold invalid UTF-8 (fuzzed input): replace it rather than throw.
  return arr.dump(2, ' ', false, nlohmann::json::error_handler_t::replace);
}

}  // namespace flexjit::dsl
