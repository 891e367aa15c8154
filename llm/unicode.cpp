#include "llm/unicode.h"

#include <algorithm>
#include <array>

namespace troupe::llm {

unicode_category unicode_category_of(char32_t cp) {
  if (cp > 0x10FFFF) return unicode_category::undefined;
  if (cp < 0x80) {
    // ASCII fast path: a small table built once from the generated ranges.
    static const std::array<uint8_t, 128> ascii = [] {
      std::array<uint8_t, 128> a{};
      size_t r = 0;
      for (uint32_t c = 0; c < 128; ++c) {
        while (r + 1 < detail::unicode_category_range_count && detail::unicode_category_ranges[r + 1].first <= c) ++r;
        a[c] = detail::unicode_category_ranges[r].category;
      }
      return a;
    }();
    return static_cast<unicode_category>(ascii[cp]);
  }
  const detail::unicode_range* begin = detail::unicode_category_ranges;
  const detail::unicode_range* end = begin + detail::unicode_category_range_count;
  // The last range whose first code point is <= cp (the table starts at 0).
  const auto it = std::upper_bound(begin, end, static_cast<uint32_t>(cp),
                                   [](uint32_t v, const detail::unicode_range& r) { return v < r.first; });
  return static_cast<unicode_category>((it - 1)->category);
}

bool unicode_is_whitespace(char32_t cp) {
  for (size_t i = 0; i < detail::unicode_white_space_count; ++i) {
    const detail::unicode_span& s = detail::unicode_white_space[i];
    if (cp < s.first) return false;
    if (cp <= s.last) return true;
  }
  return false;
}

std::string_view unicode_version() { return detail::unicode_tables_version; }

size_t utf8_sequence_length(uint8_t lead) {
  if (lead < 0xC0) return 1;  // ASCII, or a continuation byte on its own
  if (lead < 0xE0) return 2;
  if (lead < 0xF0) return 3;
  if (lead < 0xF8) return 4;
  return 1;
}

utf8_unit utf8_decode(std::string_view s, size_t offset) {
  const auto byte = [&](size_t i) { return static_cast<uint8_t>(s[offset + i]); };
  const uint8_t b0 = byte(0);
  if (b0 < 0x80) return {b0, 1};
  const size_t n = utf8_sequence_length(b0);
  if (n == 1 || offset + n > s.size()) return {};
  char32_t cp = b0 & (0xFF >> (n + 1));
  for (size_t i = 1; i < n; ++i) {
    const uint8_t b = byte(i);
    if ((b & 0xC0) != 0x80) return {};
    cp = (cp << 6) | (b & 0x3F);
  }
  // Overlong forms, surrogates and code points beyond U+10FFFF are invalid.
  static constexpr char32_t min_for_length[5] = {0, 0, 0x80, 0x800, 0x10000};
  if (cp < min_for_length[n] || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return {};
  return {cp, static_cast<uint8_t>(n)};
}

void utf8_append(std::string& out, char32_t cp) {
  if (cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) cp = 0xFFFD;
  if (cp < 0x80) {
    out.push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out.push_back(static_cast<char>(0xC0 | (cp >> 6)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out.push_back(static_cast<char>(0xE0 | (cp >> 12)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else {
    out.push_back(static_cast<char>(0xF0 | (cp >> 18)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
}

std::string utf8_encode(char32_t cp) {
  std::string s;
  utf8_append(s, cp);
  return s;
}

size_t utf8_incomplete_tail(std::string_view s) {
  // Look back at most 3 bytes for the lead byte of the last sequence.
  const size_t n = s.size();
  for (size_t back = 1; back <= 3 && back <= n; ++back) {
    const uint8_t b = static_cast<uint8_t>(s[n - back]);
    if ((b & 0xC0) == 0x80) continue;  // a continuation byte: keep looking for the lead
    const size_t need = utf8_sequence_length(b);
    if (need <= back) return 0;  // ASCII, an invalid byte, or a sequence that is already complete
    // A lead byte whose sequence is not finished yet: hold it back only if what we have can still
    // become valid (the checks utf8_decode makes on the second byte).
    if (back >= 2) {
      const uint8_t b1 = static_cast<uint8_t>(s[n - back + 1]);
      if ((b == 0xE0 && b1 < 0xA0) || (b == 0xED && b1 > 0x9F) || (b == 0xF0 && b1 < 0x90) ||
          (b == 0xF4 && b1 > 0x8F) || b > 0xF4 || b == 0xC0 || b == 0xC1) {
        return 0;
      }
    } else if (b == 0xC0 || b == 0xC1 || b > 0xF4) {
      return 0;
    }
    return back;
  }
  return 0;
}

bool utf8_valid(std::string_view s) {
  for (size_t off = 0; off < s.size();) {
    const utf8_unit u = utf8_decode(s, off);
    if (u.cp == invalid_code_point) return false;
    off += u.len;
  }
  return true;
}

namespace {

constexpr size_t gpt2_code_points = 256 + 68;  // the mapped code points are all below this

struct gpt2_tables {
  std::array<std::string, 256> utf8_of_byte;
  std::array<int16_t, gpt2_code_points> byte_of_cp{};
  gpt2_tables() {
    const auto printable = [](int b) { return (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE; };
    byte_of_cp.fill(-1);
    char32_t next = 256;
    for (int b = 0; b < 256; ++b) {
      const char32_t cp = printable(b) ? static_cast<char32_t>(b) : next++;
      utf8_of_byte[b] = utf8_encode(cp);
      byte_of_cp[cp] = static_cast<int16_t>(b);
    }
  }
};

const gpt2_tables& gpt2() {
  static const gpt2_tables t;
  return t;
}

}  // namespace

std::string_view gpt2_byte_to_utf8(uint8_t b) { return gpt2().utf8_of_byte[b]; }

int gpt2_byte_from_code_point(char32_t cp) { return cp < gpt2_code_points ? gpt2().byte_of_cp[cp] : -1; }

}  // namespace troupe::llm
