// The byte-level BPE tokenizer: SmolLM2 (GPT-2 style, pre-tokenizer "smollm") against reference ids, and
// small hand-made vocabularies for the merge order.
#include <catch2/catch.hpp>

#include <algorithm>
#include <random>
#include <string>
#include <vector>

#include "loader/gguf.h"
#include "loader/gguf_writer.h"
#include "llm/detokenizer.h"
#include "llm/unicode.h"
#include "llm/vocab.h"
#include "tests/test_models.h"

using namespace troupe;
using llm::token_id;

namespace {

using ids = std::vector<token_id>;

struct tokenization_case {
  std::string text;
  ids tokens;
};

// Reference ids from the Hugging Face `tokenizers` library (0.23), built from this GGUF's own vocabulary
// and merges: models.BPE(vocab, merges) with the pre-tokenizer Sequence([Digits(individual_digits=True),
// ByteLevel(add_prefix_space=False, use_regex=True)]) (SmolLM2's tokenizer.json), the 17 control tokens
// added as special tokens, encode(text, add_special_tokens=False). Vocabulary and merges were read with the
// PyPI `gguf` package; the ids were computed offline, so nothing here needs the network. The script that
// computes them is scripts/reference/hf_tokenizer_ids.py (versions pinned in scripts/reference/requirements.txt:
// tokenizers 0.23.3, gguf 0.19.0); `scripts/reference/run` recomputes them and checks that this file holds
// exactly those ids, and those of the parse_special case below.
const std::vector<tokenization_case> smollm2_reference = {
    {"Hello world", {19556, 905}},
    {" Hello world", {38699, 905}},
    {"Hello, world!", {19556, 28, 905, 17}},
    {"I'm sure it's fine, they're here and we've won. I'll go, you'd say, don't.",
     {57, 5248, 2090, 357, 506, 4979, 28, 502, 2316, 1535, 284, 392, 3543, 3763, 30, 339, 3060, 685,
      28, 346, 6737, 1643, 28, 1326, 982, 30}},
    {"I'M LOUD, IT'S", {57, 23, 61, 16887, 11911, 28, 9627, 23, 67}},
    {"The year 2024 had 365 days; pi = 3.14159.",
     {504, 713, 216, 34, 32, 34, 36, 761, 216, 35, 38, 37, 2009, 43, 16916, 446, 216, 35, 30, 33,
      36, 33, 37, 41, 30}},
    {"1234567", {33, 34, 35, 36, 37, 38, 39}},
    {"a  b   c    d", {81, 216, 278, 256, 265, 333, 287}},
    {"tabs\tand\t\ttabs", {100, 7366, 197, 397, 197, 197, 100, 7366}},
    {"line one\nline two\n\nline four\r\n",
     {1311, 582, 198, 1311, 827, 198, 198, 1311, 1876, 2738}},
    {"  leading and trailing  ", {216, 2899, 284, 35079, 256}},
    {"Ünïcödé façade naïve", {142, 246, 94, 25972, 83, 7466, 84, 2756, 40852, 15486, 46494}},
    {"日本語のテキスト",
     {23274, 115, 40993, 179, 120, 248, 26453, 11100, 224, 10391, 251, 10391, 134, 11100, 226}},
    {"中文分词测试", {28589, 29184, 37349, 16313, 231, 43222, 229, 16313, 239}},
    {"emoji 🦙🚀 end", {391, 33777, 15107, 116, 243, 10813, 244, 218, 1112}},
    {"<|im_start|>user\nHi there!<|im_end|>\n<|im_start|>assistant\n",
     {1, 4093, 198, 26843, 665, 17, 2, 198, 1, 520, 9531, 198}},
    {"x<|im_end|>y", {104, 2, 105}},
    {"$100 + 20% = ???", {20, 33, 32, 32, 1232, 216, 34, 32, 21, 446, 9148, 16693}},
    {"(a[b]{c})", {24, 81, 75, 82, 36939, 83, 8148}},
    {"---===***", {5583, 28733, 24299}},
    {"e.g. U.S.A.", {85, 30, 87, 30, 514, 30, 67, 30, 49, 30}},
    {"don't", {12420, 982}},
    {"''''", {3816, 3816}},
    {"Привет, мир", {155, 249, 46879, 16464, 32547, 28, 41337, 7872, 9175}},
    {"١٢٣ ٤٥٦", {164, 111, 164, 112, 164, 113, 216, 164, 114, 164, 115, 164, 116}},
    {"x²+y³=z½", {104, 19133, 27, 105, 39050, 45, 106, 16738}},
    {"  \n  \n", {256, 11181, 198}},
    {"trailing space ", {4861, 4966, 1898, 216}},
    {"\u00a0nbsp\u00a0x", {15442, 94, 32093, 15442, 104}},
    {"a\u3000b", {81, 12109, 218, 82}},
};

std::optional<llm::vocab> load_smollm2() {
  const auto path = test::smollm2_path();
  if (!path) return std::nullopt;
  return llm::vocab(read_gguf(*path));
}

gguf_file parse(const gguf_writer& w) { return parse_gguf(w.write(), "test"); }

// A byte-level vocabulary: the 256 byte code points (token id = byte), then `extra` tokens, and `merges`.
gguf_file make_bpe_vocab(std::vector<std::string> extra, std::vector<std::string> merges, const char* pre = "gpt2") {
  std::vector<std::string> tokens;
  for (int b = 0; b < 256; ++b) tokens.emplace_back(llm::gpt2_byte_to_utf8(static_cast<uint8_t>(b)));
  for (std::string& t : extra) tokens.push_back(std::move(t));
  tokens.emplace_back("<|end|>");
  std::vector<int32_t> types(tokens.size(), 1);
  types.back() = 3;
  gguf_writer w;
  w.add("tokenizer.ggml.model", "gpt2");
  w.add("tokenizer.ggml.pre", pre);
  w.add("tokenizer.ggml.tokens", tokens);
  w.add("tokenizer.ggml.token_type", types);
  w.add("tokenizer.ggml.merges", merges);
  return parse(w);
}

std::string stream(const llm::vocab& v, const ids& tokens) {
  llm::detokenizer d(v);
  std::string out;
  for (const token_id t : tokens) {
    const std::string piece = d.push(t);
    CHECK(llm::utf8_valid(piece));  // only whole characters come out (for valid input)
    out += piece;
  }
  return out + d.flush();
}

}  // namespace

TEST_CASE("vocab: SmolLM2 metadata and special tokens", "[vocab][bpe][models]") {
  const auto v = load_smollm2();
  if (!v) return;
  CHECK(v->type() == llm::vocab_type::bpe);
  CHECK(v->model_name() == "gpt2");
  CHECK(v->pre_name() == "smollm");
  CHECK(v->pre() == llm::pre_tokenizer_type::smollm);
  CHECK(v->n_tokens() == 49152);
  CHECK(v->bos() == 1);  // <|im_start|>
  CHECK(v->eos() == 2);  // <|im_end|>
  CHECK(v->eot() == 2);
  CHECK(v->unk() == 0);
  CHECK(v->pad() == 2);
  CHECK_FALSE(v->add_bos());
  CHECK_FALSE(v->add_space_prefix());
  CHECK(v->nl() == 198);  // "Ċ"
  CHECK(v->eog_tokens() == ids{0, 2});  // <|endoftext|> and <|im_end|>
  CHECK(v->is_control(1));
  CHECK(v->byte_to_token(' ') == v->find("\xC4\xA0"));  // 'Ġ'
  CHECK(v->merge_rank("\xC4\xA0", "t") == 0);            // the first merge: "Ġ t"
  CHECK(v->merge_rank("t", "\xC4\xA0") == -1);
}

TEST_CASE("vocab: SmolLM2 matches the reference tokenizer", "[vocab][bpe][models]") {
  const auto v = load_smollm2();
  if (!v) return;
  for (const tokenization_case& c : smollm2_reference) {
    INFO("text: '" << c.text << "'");
    const ids t = v->tokenize(c.text, true, true);  // add_bos is false for SmolLM2
    CHECK(t == c.tokens);
    CHECK(v->detokenize(t, {.special = true}) == c.text);
  }
}

TEST_CASE("vocab: SmolLM2 special tokens only with parse_special", "[vocab][bpe][models]") {
  const auto v = load_smollm2();
  if (!v) return;
  const std::string text = "<|im_start|>user\nHi<|im_end|>\n";
  const ids parsed = v->tokenize(text, false, true);
  CHECK(parsed == ids{1, 4093, 198, 26843, 2, 198});
  CHECK(v->detokenize(parsed).find("<|im_start|>") == std::string::npos);  // control tokens render as ""
  CHECK(v->detokenize(parsed) == "user\nHi\n");
  const ids plain = v->tokenize(text, false, false);
  CHECK(std::find(plain.begin(), plain.end(), 1) == plain.end());
  CHECK(std::find(plain.begin(), plain.end(), 2) == plain.end());
  CHECK(v->detokenize(plain) == text);
  CHECK(v->token_to_piece(2).empty());
  CHECK(v->token_to_piece(2, true) == "<|im_end|>");
  CHECK(v->token_to_piece(v->nl()) == "\n");
}

TEST_CASE("vocab: SmolLM2 round trips and streams whole characters", "[vocab][bpe][detokenizer][models]") {
  const auto v = load_smollm2();
  if (!v) return;
  const std::vector<std::string> texts = {
      "The quick brown fox jumps over the lazy dog.",
      "  two leading, three trailing   ",
      "Ünïcödé, 中文, 日本語, 한국어, Ελληνικά, עברית, العربية",
      "emoji 🦙🚀👍🏽🇫🇷 and ZWJ 👨‍👩‍👧",
      "Numbers: 3.14159, 1,000,000 and ١٢٣",
      "tabs\tnewlines\n\r\nend",
  };
  for (const std::string& s : texts) {
    INFO("text: '" << s << "'");
    const ids t = v->tokenize(s, false);
    CHECK(v->detokenize(t) == s);
    CHECK(stream(*v, t) == s);
  }
  // A character split across tokens: U+1F999 is two tokens here, so the first push holds it back.
  const ids llama = v->tokenize("\xF0\x9F\xA6\x99", false);
  REQUIRE(llama.size() >= 2);
  llm::detokenizer d(*v);
  std::string out;
  for (size_t i = 0; i + 1 < llama.size(); ++i) out += d.push(llama[i]);
  CHECK(out.empty());
  CHECK(d.pending() > 0);
  CHECK(d.push(llama.back()) == "\xF0\x9F\xA6\x99");
  // Invalid UTF-8 survives byte-level BPE unchanged, where the vocabulary has the bytes.
  const std::string invalid = "a\x80" "b\xC3 c\xE4";
  CHECK(v->detokenize(v->tokenize(invalid, false)) == invalid);
  // Bytes it has no token for (never in UTF-8) are dropped, as llama.cpp does.
  CHECK_FALSE(v->byte_to_token(0xFF));
  CHECK(v->detokenize(v->tokenize("a\xFF" "b", false)) == "ab");
}

TEST_CASE("vocab: byte-level BPE merges by rank, leftmost first on ties", "[vocab][bpe]") {
  // Tokens 256.. : "ab", "bc", "abc", "aa", "Ġa"; merges in rank order.
  const llm::vocab v(make_bpe_vocab({"ab", "bc", "abc", "aa", "\xC4\xA0" "a"},
                                    {"a b", "b c", "ab c", "a a", "\xC4\xA0 a"}));
  CHECK(v.tokenize("abc", false) == ids{258});        // a b -> ab (rank 0), ab c -> abc (rank 2)
  CHECK(v.tokenize("bca", false) == ids{257, 'a'});   // b c -> bc; "bc a" is no merge
  CHECK(v.tokenize("aaa", false) == ids{259, 'a'});   // both "a a" pairs rank 3: the leftmost merges
  CHECK(v.tokenize(" a", false) == ids{260});         // ' ' is 'Ġ'
  CHECK(v.tokenize("a<|end|>b", false, true) == ids{'a', 261, 'b'});
  CHECK(v.tokenize("\n", false) == ids{v.byte_to_token('\n').value()});
  CHECK(v.byte_to_token('\n') == 10);
  CHECK(v.token_to_piece(260) == " a");
  CHECK(v.token_to_piece(0x20) == " ");
  CHECK(v.nl() == 10);
  CHECK_FALSE(v.add_bos());
}

TEST_CASE("vocab: llama3 pre-tokenizer turns on add_bos and whole-word tokens", "[vocab][bpe]") {
  // "ignore_merges": a word that is a token as a whole is used without merging (here "abc" has no merges
  // that lead to it), as Llama 3's tokenizer does.
  gguf_writer w;
  std::vector<std::string> tokens;
  for (int b = 0; b < 256; ++b) tokens.emplace_back(llm::gpt2_byte_to_utf8(static_cast<uint8_t>(b)));
  tokens.emplace_back("abc");
  tokens.emplace_back("<|begin_of_text|>");
  w.add("tokenizer.ggml.model", "gpt2");
  w.add("tokenizer.ggml.pre", "llama-bpe");
  w.add("tokenizer.ggml.tokens", tokens);
  w.add("tokenizer.ggml.merges", std::vector<std::string>{"b c"});
  w.add("tokenizer.ggml.bos_token_id", uint32_t{257});
  const llm::vocab v(parse(w));
  CHECK(v.pre() == llm::pre_tokenizer_type::llama3);
  CHECK(v.add_bos());
  CHECK(v.tokenize("abc", true) == ids{257, 256});
  CHECK(v.tokenize("abd", false) == ids{'a', 'b', 'd'});
}

TEST_CASE("vocab: BPE tokenizing random bytes never throws and round trips", "[vocab][bpe][models]") {
  const auto v = load_smollm2();
  if (!v) return;
  std::mt19937 rng(11);
  for (int i = 0; i < 200; ++i) {
    std::string s(rng() % 40, '\0');
    for (char& c : s) {
      do {
        c = static_cast<char>(rng() % 4 == 0 ? rng() % 256 : ' ' + rng() % 95);
      } while (!v->byte_to_token(static_cast<uint8_t>(c)));  // only bytes the vocabulary has
    }
    CHECK(v->detokenize(v->tokenize(s, false, false)) == s);
  }
}
