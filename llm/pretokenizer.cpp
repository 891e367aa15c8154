#include "llm/pretokenizer.h"

#include <cstdint>
#include <utility>

#include "llm/unicode.h"

namespace troupe::llm {
namespace {

// What the split regexes distinguish about a character.
enum class kind : uint8_t { none, letter, number, space, other };

struct unit {
  size_t offset;  // byte offset in the text
  char32_t cp;    // invalid_code_point for an invalid byte
  kind k;
};

using range = std::pair<size_t, size_t>;  // [first, last) in units

kind kind_of(char32_t cp) {
  if (cp == invalid_code_point) return kind::other;
  if (unicode_is_whitespace(cp)) return kind::space;
  switch (unicode_category_of(cp)) {
    case unicode_category::letter: return kind::letter;
    case unicode_category::number: return kind::number;
    default: return kind::other;
  }
}

char32_t ascii_lower(char32_t c) { return (c >= 'A' && c <= 'Z') ? c + ('a' - 'A') : c; }

// The units of one word being split, with out-of-range access answering "none".
class fragment {
 public:
  fragment(const std::vector<unit>& units, range r, std::vector<range>& out)
      : units_(units), first_(r.first), end_(r.second), prev_(r.first), out_(out) {}

  size_t first() const { return first_; }
  size_t end() const { return end_; }
  kind k(size_t i) const { return i < end_ ? units_[i].k : kind::none; }
  char32_t cp(size_t i) const { return i < end_ ? units_[i].cp : invalid_code_point; }
  // Ends a word at `to` (text since the previous cut); returns to.
  size_t cut(size_t to) {
    if (to > prev_) out_.emplace_back(prev_, to);
    prev_ = to;
    return to;
  }
  // Marks [from, to) as a match: the text before it becomes a word of its own.
  size_t match(size_t from, size_t to) {
    cut(from);
    return cut(to);
  }
  void finish() { cut(end_); }

 private:
  const std::vector<unit>& units_;
  size_t first_, end_, prev_;
  std::vector<range>& out_;
};

// The length of a contraction ('s 't 're 've 'm 'll 'd) at i, or 0. fold: match letters case-insensitively.
size_t contraction_at(const fragment& f, size_t i, bool fold) {
  if (f.cp(i) != '\'') return 0;
  const auto c = [&](size_t j) { return fold ? ascii_lower(f.cp(j)) : f.cp(j); };
  const char32_t a = c(i + 1);
  if (a == 's' || a == 't' || a == 'm' || a == 'd') return 2;
  const char32_t b = c(i + 2);
  if ((a == 'r' && b == 'e') || (a == 'v' && b == 'e') || (a == 'l' && b == 'l')) return 3;
  return 0;
}

// Whitespace at the end of a run that is followed by non-space stays for the next word: \s+(?!\S).
size_t whitespace_run_end(const fragment& f, size_t pos) {
  size_t n = 0;
  while (f.k(pos + n) == kind::space) ++n;
  if (n > 1 && pos + n < f.end()) return pos + n - 1;  // \s+(?!\S)
  return pos + n;                                      // \s+
}

// 's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
void split_gpt2(fragment& f) {
  for (size_t pos = f.first(); pos < f.end();) {
    if (const size_t n = contraction_at(f, pos, false)) {
      pos = f.cut(pos + n);
      continue;
    }
    const size_t q = f.cp(pos) == ' ' ? pos + 1 : pos;  // the optional leading space
    const kind kq = f.k(q);
    if (kq == kind::letter || kq == kind::number || kq == kind::other) {
      size_t end = q;
      while (f.k(end) == kq) ++end;
      pos = f.cut(end);
      continue;
    }
    const size_t end = whitespace_run_end(f, pos);
    pos = f.cut(end > pos ? end : pos + 1);
  }
  f.finish();
}

// (?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,max_digits}| ?[^\s\p{L}\p{N}]+[\r\n]*|
// \s*[\r\n]+|\s+(?!\S)|\s+
void split_llama3(fragment& f, size_t max_digits) {
  const auto is_newline = [&](size_t i) { return f.cp(i) == '\r' || f.cp(i) == '\n'; };
  for (size_t pos = f.first(); pos < f.end();) {
    if (const size_t n = contraction_at(f, pos, true)) {
      pos = f.cut(pos + n);
      continue;
    }
    const kind k = f.k(pos);
    // [^\r\n\p{L}\p{N}]?\p{L}+
    if (!is_newline(pos) && k != kind::number && (k == kind::letter || f.k(pos + 1) == kind::letter)) {
      size_t end = pos + 1;
      while (f.k(end) == kind::letter) ++end;
      pos = f.cut(end);
      continue;
    }
    // \p{N}{1,max_digits}
    if (k == kind::number) {
      size_t end = pos;
      while (f.k(end) == kind::number && end - pos < max_digits) ++end;
      pos = f.cut(end);
      continue;
    }
    // ' ?[^\s\p{L}\p{N}]+[\r\n]*'
    const size_t q = f.cp(pos) == ' ' ? pos + 1 : pos;
    if (f.k(q) == kind::other) {
      size_t end = q;
      while (f.k(end) == kind::other) ++end;
      while (is_newline(end)) ++end;
      pos = f.cut(end);
      continue;
    }
    // \s*[\r\n]+ : the whitespace run up to its last newline
    size_t n = 0, last_newline_end = 0;
    while (f.k(pos + n) == kind::space) {
      if (is_newline(pos + n)) last_newline_end = pos + n + 1;
      ++n;
    }
    if (last_newline_end > 0) {
      pos = f.cut(last_newline_end);
      continue;
    }
    const size_t end = whitespace_run_end(f, pos);
    pos = f.cut(end > pos ? end : pos + 1);
  }
  f.finish();
}

// Runs of characters satisfying `pred` become words: whole runs (chunk == 0), or consecutive pieces of
// exactly `chunk` characters, the shorter rest staying with the surrounding text (regex X{chunk}).
template <class Pred>
void split_runs(fragment& f, Pred pred, size_t chunk) {
  for (size_t pos = f.first(); pos < f.end();) {
    if (!pred(f.cp(pos), f.k(pos))) {
      ++pos;
      continue;
    }
    size_t end = pos;
    while (end < f.end() && pred(f.cp(end), f.k(end))) ++end;
    if (chunk == 0) {
      f.match(pos, end);
    } else {
      for (; pos + chunk <= end; pos += chunk) f.match(pos, pos + chunk);
    }
    pos = end;
  }
  f.finish();
}

bool is_number(char32_t, kind k) { return k == kind::number; }
bool is_ascii_digit(char32_t c, kind) { return c >= '0' && c <= '9'; }
// [\p{P}\$\+<=>\^~\|]
bool is_punct_or_operator(char32_t c, kind) {
  if (c == invalid_code_point) return false;
  if (c == '$' || c == '+' || c == '<' || c == '=' || c == '>' || c == '^' || c == '~' || c == '|') return true;
  return unicode_category_of(c) == unicode_category::punctuation;
}

enum class stage { gpt2, llama3, qwen2, isolate_digits, punct_runs, number_runs, ascii_digit_triples };

void run_stage(stage s, fragment& f) {
  switch (s) {
    case stage::gpt2: split_gpt2(f); return;
    case stage::llama3: split_llama3(f, 3); return;
    case stage::qwen2: split_llama3(f, 1); return;
    case stage::isolate_digits: split_runs(f, is_number, 1); return;
    case stage::punct_runs: split_runs(f, is_punct_or_operator, 0); return;
    case stage::number_runs: split_runs(f, is_number, 0); return;
    case stage::ascii_digit_triples: split_runs(f, is_ascii_digit, 3); return;
  }
}

std::vector<stage> stages_of(pre_tokenizer_type type) {
  switch (type) {
    case pre_tokenizer_type::gpt2: return {stage::gpt2};
    case pre_tokenizer_type::llama3: return {stage::llama3};
    case pre_tokenizer_type::qwen2: return {stage::qwen2};
    case pre_tokenizer_type::smollm: return {stage::isolate_digits, stage::gpt2};
    case pre_tokenizer_type::default_bpe:
      return {stage::punct_runs, stage::gpt2, stage::number_runs, stage::ascii_digit_triples};
  }
  return {stage::gpt2};
}

}  // namespace

std::optional<pre_tokenizer_type> pre_tokenizer_from_name(std::string_view name) {
  if (name == "gpt2" || name == "gpt-2") return pre_tokenizer_type::gpt2;
  if (name == "llama3" || name == "llama-v3" || name == "llama-bpe") return pre_tokenizer_type::llama3;
  if (name == "qwen2") return pre_tokenizer_type::qwen2;
  if (name == "smollm") return pre_tokenizer_type::smollm;
  if (name == "default") return pre_tokenizer_type::default_bpe;
  return std::nullopt;
}

std::vector<std::string_view> pre_tokenize(pre_tokenizer_type type, std::string_view text) {
  std::vector<unit> units;
  units.reserve(text.size());
  for (size_t off = 0; off < text.size();) {
    const utf8_unit u = utf8_decode(text, off);
    units.push_back({off, u.cp, kind_of(u.cp)});
    off += u.len;
  }

  std::vector<range> words;
  if (!units.empty()) words.emplace_back(0, units.size());
  for (const stage s : stages_of(type)) {
    std::vector<range> next;
    next.reserve(words.size() * 2);
    for (const range& r : words) {
      fragment f(units, r, next);
      run_stage(s, f);
    }
    words = std::move(next);
  }

  std::vector<std::string_view> out;
  out.reserve(words.size());
  for (const auto& [first, last] : words) {
    const size_t begin = units[first].offset;
    const size_t end = last < units.size() ? units[last].offset : text.size();
    out.push_back(text.substr(begin, end - begin));
  }
  return out;
}

}  // namespace troupe::llm
