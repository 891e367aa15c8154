// UTF-8 and the bits of Unicode the tokenizers need: code point categories (for the BPE pre-tokenizer
// regexes' \p{L}, \p{N}, \s) and GPT-2's byte <-> code point mapping.
//
//   size_t off = 0;
//   while (off < s.size()) {
//     utf8_unit u = utf8_decode(s, off);         // never throws; an invalid byte is a unit of its own
//     if (unicode_category_of(u.cp) == unicode_category::letter) ...
//     off += u.len;
//   }
//   std::string_view g = gpt2_byte_to_utf8(' ');   // "Ġ"
//
// The category table is generated from Python's unicodedata by scripts/gen-unicode-tables.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace troupe::llm {

// The first letter of a code point's general category; `undefined` for unassigned code points (Cn).
enum class unicode_category : uint8_t {
  undefined = 0,
  number = 1,       // \p{N}: Nd, Nl, No
  letter = 2,       // \p{L}: Lu, Ll, Lt, Lm, Lo
  separator = 3,    // \p{Z}
  mark = 4,         // \p{M}
  punctuation = 5,  // \p{P}
  symbol = 6,       // \p{S}
  control = 7,      // \p{C} other than Cn: Cc, Cf, Cs, Co
};

unicode_category unicode_category_of(char32_t cp);
// The White_Space property (what regex \s matches): \t \n \v \f \r, space, U+0085, U+00A0, U+1680,
// U+2000..U+200A, U+2028, U+2029, U+202F, U+205F, U+3000.
bool unicode_is_whitespace(char32_t cp);
// The Unicode version of the category table.
std::string_view unicode_version();

// A code point that does not exist: what utf8_decode returns for an invalid byte.
constexpr char32_t invalid_code_point = 0xFFFFFFFF;

// One decoded unit of UTF-8 text: a code point and its length in bytes, or (cp == invalid_code_point,
// len == 1) for a byte that does not start a valid, complete, shortest-form sequence.
struct utf8_unit {
  char32_t cp = invalid_code_point;
  uint8_t len = 1;
};

// Length a sequence starting with `lead` claims: 1 for ASCII, continuation and invalid bytes; 2..4 else.
size_t utf8_sequence_length(uint8_t lead);
// Decodes the unit at `offset` (< s.size()). Never throws.
utf8_unit utf8_decode(std::string_view s, size_t offset);
// Appends the UTF-8 encoding of cp (<= 0x10FFFF; anything else appends U+FFFD).
void utf8_append(std::string& out, char32_t cp);
std::string utf8_encode(char32_t cp);
// Number of bytes at the end of `s` that form the start of a valid UTF-8 sequence still missing its
// continuation bytes (0..3); 0 when s ends on a complete sequence or on invalid bytes.
size_t utf8_incomplete_tail(std::string_view s);
// True when all of `s` is valid UTF-8.
bool utf8_valid(std::string_view s);

// GPT-2 byte-level BPE: each byte is shown as a printable code point (printable Latin-1 bytes as
// themselves, the other 68 bytes as U+0100.. in byte order; ' ' -> U+0120 'Ġ', '\n' -> U+010A 'Ċ').
// The UTF-8 of the code point for byte b.
std::string_view gpt2_byte_to_utf8(uint8_t b);
// The byte a code point stands for, or -1 when cp is not one of the 256.
int gpt2_byte_from_code_point(char32_t cp);

namespace detail {
struct unicode_range {
  uint32_t first;  // runs to the next range's first code point
  uint8_t category;
};
struct unicode_span {
  uint32_t first, last;  // inclusive
};
// Generated tables (unicode_tables.cpp).
extern const char unicode_tables_version[];
extern const unicode_range unicode_category_ranges[];
extern const size_t unicode_category_range_count;
extern const unicode_span unicode_white_space[];
extern const size_t unicode_white_space_count;
}  // namespace detail

}  // namespace troupe::llm
