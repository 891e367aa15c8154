// The BPE pre-tokenizers (the split regexes, by hand) and the Unicode helpers under them.
#include <catch2/catch.hpp>

#include <random>
#include <string>
#include <vector>

#include "llm/pretokenizer.h"
#include "llm/unicode.h"

using namespace troupe::llm;

namespace {

using words = std::vector<std::string>;

words split(pre_tokenizer_type type, std::string_view text) {
  words out;
  for (const std::string_view w : pre_tokenize(type, text)) out.emplace_back(w);
  return out;
}

}  // namespace

TEST_CASE("unicode: categories and white space", "[unicode]") {
  CHECK(unicode_category_of('a') == unicode_category::letter);
  CHECK(unicode_category_of('Z') == unicode_category::letter);
  CHECK(unicode_category_of('7') == unicode_category::number);
  CHECK(unicode_category_of(' ') == unicode_category::separator);
  CHECK(unicode_category_of('!') == unicode_category::punctuation);
  CHECK(unicode_category_of('$') == unicode_category::symbol);
  CHECK(unicode_category_of('\n') == unicode_category::control);
  CHECK(unicode_category_of(0x00E9) == unicode_category::letter);       // é
  CHECK(unicode_category_of(0x4E2D) == unicode_category::letter);       // 中
  CHECK(unicode_category_of(0x0663) == unicode_category::number);       // Arabic-Indic 3
  CHECK(unicode_category_of(0x00B2) == unicode_category::number);       // ² (No)
  CHECK(unicode_category_of(0x0301) == unicode_category::mark);         // combining acute
  CHECK(unicode_category_of(0x1F999) == unicode_category::symbol);      // 🦙
  CHECK(unicode_category_of(0x0378) == unicode_category::undefined);    // unassigned
  CHECK(unicode_category_of(0xE000) == unicode_category::control);      // private use (Co)
  CHECK(unicode_category_of(0x10FFFF) == unicode_category::undefined);
  CHECK(unicode_category_of(0x110000) == unicode_category::undefined);
  for (const char32_t c : {U'\t', U'\n', U'\v', U'\f', U'\r', U' ', U'\u0085', U'\u00A0', U'\u2003', U'\u3000'}) {
    CHECK(unicode_is_whitespace(c));
  }
  for (const char32_t c : {U'a', U'\u200B', U'\u0000', U'\u001F', U'\uFEFF'}) CHECK_FALSE(unicode_is_whitespace(c));
  CHECK_FALSE(unicode_version().empty());
}

TEST_CASE("unicode: UTF-8 decoding is strict and never throws", "[unicode]") {
  const auto decode_all = [](std::string_view s) {
    std::vector<char32_t> out;
    for (size_t off = 0; off < s.size();) {
      const utf8_unit u = utf8_decode(s, off);
      out.push_back(u.cp);
      off += u.len;
    }
    return out;
  };
  const char32_t bad = invalid_code_point;
  CHECK(decode_all("a\xC3\xA9\xE4\xB8\xAD\xF0\x9F\xA6\x99") == std::vector<char32_t>{'a', 0xE9, 0x4E2D, 0x1F999});
  CHECK(decode_all("\xC0\xAF") == std::vector<char32_t>{bad, bad});           // overlong '/'
  CHECK(decode_all("\xED\xA0\x80") == std::vector<char32_t>{bad, bad, bad});  // surrogate
  CHECK(decode_all("\xF4\x90\x80\x80") == std::vector<char32_t>{bad, bad, bad, bad});  // > U+10FFFF
  CHECK(decode_all("\xE4\xB8") == std::vector<char32_t>{bad, bad});          // truncated
  CHECK(decode_all("\x80" "a") == std::vector<char32_t>{bad, 'a'});
  CHECK(utf8_encode(0x1F999) == "\xF0\x9F\xA6\x99");
  CHECK(utf8_encode(0xD800) == "\xEF\xBF\xBD");  // not encodable: U+FFFD
  CHECK(utf8_valid("h\xC3\xA9llo"));
  CHECK_FALSE(utf8_valid("h\xC3llo"));
}

TEST_CASE("unicode: incomplete UTF-8 tails", "[unicode]") {
  CHECK(utf8_incomplete_tail("") == 0);
  CHECK(utf8_incomplete_tail("abc") == 0);
  CHECK(utf8_incomplete_tail("a\xF0") == 1);
  CHECK(utf8_incomplete_tail("a\xF0\x9F") == 2);
  CHECK(utf8_incomplete_tail("a\xF0\x9F\xA6") == 3);
  CHECK(utf8_incomplete_tail("a\xF0\x9F\xA6\x99") == 0);
  CHECK(utf8_incomplete_tail("\xC3") == 1);
  CHECK(utf8_incomplete_tail("\xC3\xA9") == 0);
  CHECK(utf8_incomplete_tail("\xFF") == 0);      // never valid
  CHECK(utf8_incomplete_tail("\xC0") == 0);      // overlong lead
  CHECK(utf8_incomplete_tail("\xE0\x80") == 0);  // overlong: cannot complete
  CHECK(utf8_incomplete_tail("\xED\xA0") == 0);  // surrogate: cannot complete
  CHECK(utf8_incomplete_tail("\x80\x80") == 0);  // continuation bytes without a lead
}

TEST_CASE("unicode: GPT-2 byte to code point mapping", "[unicode]") {
  CHECK(gpt2_byte_to_utf8('a') == "a");
  CHECK(gpt2_byte_to_utf8(' ') == "\xC4\xA0");   // U+0120 'Ġ'
  CHECK(gpt2_byte_to_utf8('\n') == "\xC4\x8A");  // U+010A 'Ċ'
  CHECK(gpt2_byte_to_utf8(0x00) == "\xC4\x80");  // U+0100
  CHECK(gpt2_byte_to_utf8(0xAD) == "\xC5\x83");  // soft hyphen: the 68th, U+0143
  CHECK(gpt2_byte_to_utf8(0xE9) == "\xC3\xA9");  // printable Latin-1 maps to itself
  for (int b = 0; b < 256; ++b) {
    const std::string s(gpt2_byte_to_utf8(static_cast<uint8_t>(b)));
    CHECK(gpt2_byte_from_code_point(utf8_decode(s, 0).cp) == b);
  }
  CHECK(gpt2_byte_from_code_point(0x0144) == -1);
  CHECK(gpt2_byte_from_code_point(0x20) == -1);  // ' ' is shown as U+0120, not itself
}

TEST_CASE("pretokenizer: names", "[pretokenizer]") {
  CHECK(pre_tokenizer_from_name("smollm") == pre_tokenizer_type::smollm);
  CHECK(pre_tokenizer_from_name("llama-bpe") == pre_tokenizer_type::llama3);
  CHECK(pre_tokenizer_from_name("llama3") == pre_tokenizer_type::llama3);
  CHECK(pre_tokenizer_from_name("qwen2") == pre_tokenizer_type::qwen2);
  CHECK(pre_tokenizer_from_name("gpt-2") == pre_tokenizer_type::gpt2);
  CHECK(pre_tokenizer_from_name("default") == pre_tokenizer_type::default_bpe);
  CHECK_FALSE(pre_tokenizer_from_name("deepseek-llm"));
}

TEST_CASE("pretokenizer: gpt2", "[pretokenizer]") {
  const auto t = pre_tokenizer_type::gpt2;
  CHECK(split(t, "Hello world's  end!!\n") == words{"Hello", " world", "'s", " ", " end", "!!", "\n"});
  CHECK(split(t, "I'M 12345 ok") == words{"I", "'", "M", " 12345", " ok"});  // contractions are lower case
  CHECK(split(t, "they're we've I'll you'd") == words{"they", "'re", " we", "'ve", " I", "'ll", " you", "'d"});
  CHECK(split(t, "a\t\tb") == words{"a", "\t", "\t", "b"});
  CHECK(split(t, "a   ") == words{"a", "   "});
  CHECK(split(t, " ?! x") == words{" ?!", " x"});
  CHECK(split(t, "naïve 中文 ١٢٣") == words{"naïve", " 中文", " ١٢٣"});
  CHECK(split(t, "").empty());
}

TEST_CASE("pretokenizer: llama3 and qwen2", "[pretokenizer]") {
  const auto l3 = pre_tokenizer_type::llama3;
  CHECK(split(l3, "I'M 12345 ok\n\n  x") == words{"I", "'M", " ", "123", "45", " ok", "\n\n", " ", " x"});
  CHECK(split(l3, "\tabc,def") == words{"\tabc", ",def"});       // [^\r\n\p{L}\p{N}]?\p{L}+
  CHECK(split(l3, "x?!\n\ny") == words{"x", "?!\n\n", "y"});      // punctuation takes the newlines
  CHECK(split(l3, "a \n b") == words{"a", " \n", " b"});         // \s*[\r\n]+
  CHECK(split(l3, "end  ") == words{"end", "  "});
  const auto q2 = pre_tokenizer_type::qwen2;
  CHECK(split(q2, "I'M 12345 ok") == words{"I", "'M", " ", "1", "2", "3", "4", "5", " ok"});
}

TEST_CASE("pretokenizer: smollm isolates every digit", "[pretokenizer]") {
  const auto t = pre_tokenizer_type::smollm;
  CHECK(split(t, "abc123 x") == words{"abc", "1", "2", "3", " x"});
  CHECK(split(t, "year 2024!") == words{"year", " ", "2", "0", "2", "4", "!"});
  CHECK(split(t, "x²") == words{"x", "²"});
}

TEST_CASE("pretokenizer: default (llama.cpp's fallback)", "[pretokenizer]") {
  const auto t = pre_tokenizer_type::default_bpe;
  CHECK(split(t, "a+b=12345!") == words{"a", "+", "b", "=", "123", "45", "!"});
  CHECK(split(t, "hello, world") == words{"hello", ",", " world"});
}

TEST_CASE("pretokenizer: words cover any bytes exactly", "[pretokenizer]") {
  std::mt19937 rng(3);
  const pre_tokenizer_type types[] = {pre_tokenizer_type::gpt2, pre_tokenizer_type::llama3, pre_tokenizer_type::qwen2,
                                      pre_tokenizer_type::smollm, pre_tokenizer_type::default_bpe};
  for (int i = 0; i < 300; ++i) {
    std::string s(rng() % 30, '\0');
    for (char& c : s) c = static_cast<char>(rng() % 3 == 0 ? rng() % 256 : ' ' + rng() % 95);
    for (const auto t : types) {
      std::string joined;
      for (const std::string_view w : pre_tokenize(t, s)) {
        CHECK_FALSE(w.empty());
        joined += w;
      }
      CHECK(joined == s);
    }
  }
  CHECK(split(pre_tokenizer_type::gpt2, "a\xFF" "b") == words{"a", "\xFF", "b"});
}
