// The tokenizer on real SentencePiece vocabularies (stories260K: 512 tokens; llama-2-tiny-random: the full
// 32000-token Llama 2 vocabulary), on small hand-made vocabularies, and the streaming detokenizer.
#include <catch2/catch.hpp>

#include <random>
#include <string>
#include <vector>

#include "loader/gguf.h"
#include "loader/gguf_writer.h"
#include "llm/detokenizer.h"
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

// Token ids of the Hugging Face Llama (2) tokenizer (SentencePiece) for llama.cpp's tokenizer test
// inputs, tokenized without special tokens (add_special = false): the published reference outputs of
// llama.cpp's Llama SPM vocabulary test (models/ggml-vocab-llama-spm.gguf.out), same vocabulary as
// llama-2-tiny-random. They cover whitespace runs, newlines and tabs, byte fallback for emoji and Khmer,
// Cyrillic, CJK, digits and punctuation runs.
const std::vector<tokenization_case> llama_spm_reference = {
    {"ied 4 ½ months", {474, 287, 29871, 29946, 29871, 30226, 7378}},
    {"Führer", {383, 4000, 261}},
    {"", {}},
    {" ", {259}},
    {"  ", {1678}},
    {"   ", {268}},
    {"\t", {29871, 12}},
    {"\n", {29871, 13}},
    {"\n\n", {29871, 13, 13}},
    {"\n\n\n", {29871, 13, 13, 13}},
    {"\t\n", {29871, 12, 13}},
    {"Hello world", {15043, 3186}},
    {" Hello world", {29871, 15043, 3186}},
    {"Hello World", {15043, 2787}},
    {" Hello World", {29871, 15043, 2787}},
    {" Hello World!", {29871, 15043, 2787, 29991}},
    {"Hello, world!", {15043, 29892, 3186, 29991}},
    {" Hello, world!", {29871, 15043, 29892, 3186, 29991}},
    {" this is 🦙.cpp", {29871, 445, 338, 29871, 243, 162, 169, 156, 29889, 8223}},
    {"w048 7tuijk dsdfhu",
     {281, 29900, 29946, 29947, 29871, 29955, 9161, 13535, 18031, 2176, 6905}},
    {"нещо на Български", {1538, 4851, 665, 1386, 29713, 1305}},
    {"កាន់តែពិសេសអាចខលចេញ",
     {29871, 31849, 31324, 31934, 228, 162, 142, 228, 161, 146, 228, 162, 133, 228, 161, 153, 228,
      161, 186, 31708, 228, 162, 132, 31708, 228, 161, 165, 31324, 228, 161, 136, 228, 161, 132,
      228, 161, 158, 228, 161, 136, 228, 162, 132, 228, 161, 140}},
    {"🚀 (normal) 😶\u200d🌫\ufe0f (multiple emojis concatenated) ✅ (only emoji that has its own toke"
     "n)",
     {29871, 243, 162, 157, 131, 313, 8945, 29897, 29871, 243, 162, 155, 185, 30722, 243, 162, 143,
      174, 30598, 313, 20787, 953, 3848, 275, 16125, 630, 29897, 29871, 31681, 313, 6194, 953,
      29877, 2397, 393, 756, 967, 1914, 5993, 29897}},
    {"Hello", {15043}},
    {" Hello", {29871, 15043}},
    {"  Hello", {259, 15043}},
    {"   Hello", {1678, 15043}},
    {"    Hello", {268, 15043}},
    {"    Hello\n    Hello", {268, 15043, 13, 1678, 15043}},
    {" (", {29871, 313}},
    {"\n =", {29871, 13, 353}},
    {"' era", {525, 3152}},
    {"Hello, y'all! How are you 😁 ?我想在apple工作1314151天～",
     {15043, 29892, 343, 29915, 497, 29991, 1128, 526, 366, 29871, 243, 162, 155, 132, 1577, 30672,
      31522, 30505, 11548, 31041, 30732, 29896, 29941, 29896, 29946, 29896, 29945, 29896, 30408,
      30739}},
    {"3", {29871, 29941}},
    {"33", {29871, 29941, 29941}},
    {"333", {29871, 29941, 29941, 29941}},
    {"3333", {29871, 29941, 29941, 29941, 29941}},
    {"33333", {29871, 29941, 29941, 29941, 29941, 29941}},
    {"333333", {29871, 29941, 29941, 29941, 29941, 29941, 29941}},
    {"3333333", {29871, 29941, 29941, 29941, 29941, 29941, 29941, 29941}},
    {"33333333", {29871, 29941, 29941, 29941, 29941, 29941, 29941, 29941, 29941}},
    {"333333333", {29871, 29941, 29941, 29941, 29941, 29941, 29941, 29941, 29941, 29941}},
    {"\n \n\n \n\n\n \t \t\t \t\n  \n   \n    \n     \n🚀 (normal) 😶\u200d🌫\ufe0f (multiple emojis "
     "concatenated) ✅ 🦙🦙 3 33 333 3333 33333 333333 3333333 33333333 3.3 3..3 3...3 កាន់តែពិសេសអាច"
     "😁 ?我想在apple工作1314151天～ ------======= нещо на Български ''''''```````\"\"\"\"......!!!!!!????"
     "?? I've been 'told he's there, 'RE you sure? 'M not sure I'll make it, 'D you like some tea?"
     " We'Ve a'lL",
     {29871, 13, 29871, 13, 13, 29871, 13, 13, 13, 29871, 12, 29871, 12, 12, 29871, 12, 13, 259, 13,
      1678, 13, 268, 13, 418, 13, 243, 162, 157, 131, 313, 8945, 29897, 29871, 243, 162, 155, 185,
      30722, 243, 162, 143, 174, 30598, 313, 20787, 953, 3848, 275, 16125, 630, 29897, 29871, 31681,
      29871, 243, 162, 169, 156, 243, 162, 169, 156, 29871, 29941, 29871, 29941, 29941, 29871,
      29941, 29941, 29941, 29871, 29941, 29941, 29941, 29941, 29871, 29941, 29941, 29941, 29941,
      29941, 29871, 29941, 29941, 29941, 29941, 29941, 29941, 29871, 29941, 29941, 29941, 29941,
      29941, 29941, 29941, 29871, 29941, 29941, 29941, 29941, 29941, 29941, 29941, 29941, 29871,
      29941, 29889, 29941, 29871, 29941, 636, 29941, 29871, 29941, 856, 29941, 29871, 31849, 31324,
      31934, 228, 162, 142, 228, 161, 146, 228, 162, 133, 228, 161, 153, 228, 161, 186, 31708, 228,
      162, 132, 31708, 228, 161, 165, 31324, 228, 161, 136, 243, 162, 155, 132, 1577, 30672, 31522,
      30505, 11548, 31041, 30732, 29896, 29941, 29896, 29946, 29896, 29945, 29896, 30408, 30739,
      448, 23648, 2751, 25512, 1538, 4851, 665, 1386, 29713, 1305, 14550, 4907, 11120, 16159, 16159,
      16159, 15945, 15945, 3045, 636, 6824, 6824, 6824, 8773, 8773, 8773, 306, 29915, 345, 1063,
      525, 29873, 1025, 540, 29915, 29879, 727, 29892, 525, 1525, 366, 1854, 29973, 525, 29924, 451,
      1854, 306, 29915, 645, 1207, 372, 29892, 525, 29928, 366, 763, 777, 23429, 29973, 1334, 29915,
      29963, 29872, 263, 29915, 29880, 29931}},
};

std::optional<llm::vocab> load_vocab(const char* file) {
  const auto path = test::model_path(file);
  if (!path) return std::nullopt;
  return llm::vocab(read_gguf(*path));
}

// A hand-made SentencePiece vocabulary: <unk> <s> </s>, the 256 byte tokens <0x00>..<0xFF> (ids 3..258),
// then the pieces given with their scores (ids from 259), then a user-defined "<|user|>".
struct spm_piece {
  const char* text;
  float score;
};
gguf_file make_spm_vocab(std::initializer_list<spm_piece> pieces, bool with_bytes = true) {
  std::vector<std::string> tokens = {"<unk>", "<s>", "</s>"};
  std::vector<float> scores = {0, 0, 0};
  std::vector<int32_t> types = {2, 3, 3};
  if (with_bytes) {
    static constexpr char hex[] = "0123456789ABCDEF";
    for (int b = 0; b < 256; ++b) {
      tokens.push_back(std::string("<0x") + hex[b >> 4] + hex[b & 15] + ">");
      scores.push_back(0);
      types.push_back(6);
    }
  }
  for (const spm_piece& p : pieces) {
    tokens.emplace_back(p.text);
    scores.push_back(p.score);
    types.push_back(1);
  }
  tokens.emplace_back("<|user|>");
  scores.push_back(0);
  types.push_back(4);
  gguf_writer w;
  w.add("tokenizer.ggml.model", "llama");
  w.add("tokenizer.ggml.tokens", tokens);
  w.add("tokenizer.ggml.scores", scores);
  w.add("tokenizer.ggml.token_type", types);
  return parse_gguf(w.write(), "spm-test");
}

gguf_file parse(const gguf_writer& w) { return parse_gguf(w.write(), "test"); }

// Everything detokenizer::push returns plus the final flush.
std::string stream(const llm::vocab& v, const ids& tokens, llm::detokenize_options options = {}) {
  llm::detokenizer d(v, options);
  std::string out;
  for (const token_id t : tokens) out += d.push(t);
  return out + d.flush();
}

const ids stories_prompt = {1, 403, 407, 261, 378};  // "Once upon a time", BOS added
const ids stories_generated = {432, 383, 286, 261, 376, 298, 315, 421, 395, 317, 426, 338, 401, 396, 267, 337,
                               410, 408, 419, 292, 411, 322, 265, 282, 295, 433, 426, 385, 328, 432, 358, 394};
const char* const stories_text =
    "Once upon a time, there was a little girl named Lily. She loved to play outside in the park. One day, she saw";

}  // namespace

TEST_CASE("vocab: stories260K metadata and special tokens", "[vocab][models]") {
  const auto v = load_vocab("stories260K.gguf");
  if (!v) return;
  CHECK(v->type() == llm::vocab_type::spm);
  CHECK(v->model_name() == "llama");
  CHECK(v->n_tokens() == 512);
  CHECK(v->bos() == 1);
  CHECK(v->eos() == 2);
  CHECK(v->unk() == 0);
  CHECK(v->pad() == llm::token_null);  // stored as 0xFFFFFFFF
  CHECK(v->eot() == llm::token_null);
  CHECK(v->nl() == 3 + '\n');  // <0x0A>
  CHECK(v->add_bos());
  CHECK_FALSE(v->add_eos());
  CHECK(v->add_space_prefix());
  CHECK(v->is_eog(2));
  CHECK_FALSE(v->is_eog(1));
  CHECK_FALSE(v->is_eog(-1));
  CHECK(v->eog_tokens() == ids{2});
  CHECK(v->byte_to_token('A') == 3 + 'A');
  CHECK(v->text(1) == "<s>");
  CHECK(v->type_of(0) == llm::token_type::unknown);
  CHECK(v->is_control(2));
  CHECK(v->is_byte(3));
}

TEST_CASE("vocab: stories260K tokenizes the reference sentence", "[vocab][models]") {
  const auto v = load_vocab("stories260K.gguf");
  if (!v) return;
  CHECK(v->tokenize("Once upon a time, there was a little girl named Lily.", true) ==
        ids{1, 403, 407, 261, 378, 432, 383, 286, 261, 376, 298, 315, 421, 395, 317, 426});
  CHECK(v->tokenize("Once upon a time", true) == stories_prompt);
  CHECK(v->tokenize("Once upon a time", false) == ids{403, 407, 261, 378});
  CHECK(v->tokenize("", true) == ids{1});
  CHECK(v->tokenize("", false).empty());
}

TEST_CASE("vocab: stories260K detokenizes the reference generation", "[vocab][detokenizer][models]") {
  const auto v = load_vocab("stories260K.gguf");
  if (!v) return;
  ids all = stories_prompt;
  all.insert(all.end(), stories_generated.begin(), stories_generated.end());
  CHECK(v->detokenize(all, {.strip_leading_space = true}) == stories_text);
  CHECK(v->detokenize(all) == std::string(" ") + stories_text);  // the prefixed space kept
  CHECK(v->detokenize(all, {.special = true}) == std::string("<s> ") + stories_text);
  CHECK(stream(*v, all, {.strip_leading_space = true}) == stories_text);
  // The continuation alone, as a chat loop streams it after the prompt.
  CHECK(stream(*v, stories_generated) ==
        ", there was a little girl named Lily. She loved to play outside in the park. One day, she saw");
}

TEST_CASE("vocab: Llama 2 SentencePiece matches the reference tokenizer", "[vocab][models]") {
  const auto v = load_vocab("llama-2-tiny-random.gguf");
  if (!v) return;
  REQUIRE(v->n_tokens() == 32000);
  for (const tokenization_case& c : llama_spm_reference) {
    INFO("text: '" << c.text << "'");
    CHECK(v->tokenize(c.text, false) == c.tokens);
    ids with_bos = {1};
    with_bos.insert(with_bos.end(), c.tokens.begin(), c.tokens.end());
    CHECK(v->tokenize(c.text, true) == with_bos);
  }
}

TEST_CASE("vocab: Llama 2 byte fallback", "[vocab][models]") {
  const auto v = load_vocab("llama-2-tiny-random.gguf");
  if (!v) return;
  // U+1F999 (llama) has no token: "▁" then its four UTF-8 bytes F0 9F A6 99 as <0xF0> ... (id = 3 + byte).
  CHECK(v->tokenize("\xF0\x9F\xA6\x99", false) == ids{29871, 3 + 0xF0, 3 + 0x9F, 3 + 0xA6, 3 + 0x99});
  for (const token_id id : {3 + 0xF0, 3 + 0x9F}) CHECK(v->is_byte(id));
  // Invalid UTF-8 goes through the byte tokens as it is and comes back unchanged, spaces after it too.
  const std::string invalid = "a\xFF\xFE" "b\xC3 c";
  const ids t = v->tokenize(invalid, false);
  CHECK(t == ids{263, 3 + 0xFF, 3 + 0xFE, 29890, 3 + 0xC3, 274});
  CHECK(v->detokenize(t, {.strip_leading_space = true}) == invalid);
}

TEST_CASE("vocab: Llama 2 round trips", "[vocab][models]") {
  const auto v = load_vocab("llama-2-tiny-random.gguf");
  if (!v) return;
  const std::vector<std::string> texts = {
      "Hello world",
      " leading space",
      "trailing space ",
      "multiple   spaces    inside",
      "line one\nline two\n\n\nline five\r\n",
      "\ttabs\tand\t\tmore",
      "Accents: àéîõü ÀÉÎÕÜ ç ñ ß œ",
      "Ελληνικά και Русский текст",
      "中文：我想在苹果工作。日本語のテキスト、한국어",
      "Emoji: 🦙🚀😀👍🏽 and a flag 🇫🇷",
      "Math ∑∫√∞ ≠ ≤ ≥ and arrows → ←",
      "Code: for (int i = 0; i < n; ++i) { x[i] = y[i] * 2; }",
      "Numbers 0123456789 3.14159 1e-10",
      "   ",
      "\n",
      "x",
      "<s> and </s> as text",
  };
  for (const std::string& s : texts) {
    INFO("text: '" << s << "'");
    const ids t = v->tokenize(s, true);
    CHECK(v->detokenize(t, {.strip_leading_space = true}) == s);
    CHECK(stream(*v, t, {.strip_leading_space = true}) == s);
  }
}

TEST_CASE("vocab: special tokens in the text", "[vocab][models]") {
  const auto v = load_vocab("llama-2-tiny-random.gguf");
  if (!v) return;
  // As the reference tokenizer does with special tokens parsed (llama.cpp's tinyllama vocabulary test):
  // the text after a special token gets the space prefix again.
  CHECK(v->tokenize("a</s>b", false, true) == ids{263, 2, 289});
  CHECK(v->tokenize("a</s> b", false, true) == ids{263, 2, 29871, 289});
  CHECK(v->tokenize("abc</s> def ghi", false, true) == ids{25638, 2, 29871, 822, 330, 2918});
  CHECK(v->tokenize("</s>", true, true) == ids{1, 2});
  // Without parse_special, control tokens are text.
  const ids as_text = v->tokenize("a</s>b", false, false);
  CHECK(std::find(as_text.begin(), as_text.end(), 2) == as_text.end());
  CHECK(v->detokenize(as_text, {.strip_leading_space = true}) == "a</s>b");
}

TEST_CASE("vocab: token_to_piece", "[vocab][models]") {
  const auto v = load_vocab("llama-2-tiny-random.gguf");
  if (!v) return;
  CHECK(v->text(15043) == "\xE2\x96\x81Hello");
  CHECK(v->token_to_piece(15043) == " Hello");
  CHECK(v->token_to_piece(13) == "\n");  // <0x0A>
  CHECK(v->token_to_piece(1).empty());
  CHECK(v->token_to_piece(1, true) == "<s>");
  CHECK(v->token_to_piece(0).empty());
  CHECK(v->token_to_piece(0, true) == "<unk>");
  CHECK_THROWS_AS(v->token_to_piece(-1), llm::vocab_error);
  CHECK_THROWS_AS(v->token_to_piece(32000), llm::vocab_error);
  CHECK_THROWS_AS(v->detokenize(ids{1, 32000}), llm::vocab_error);
}

TEST_CASE("detokenizer: holds back a character split across byte tokens", "[detokenizer][models]") {
  const auto v = load_vocab("llama-2-tiny-random.gguf");
  if (!v) return;
  llm::detokenizer d(*v);
  CHECK(d.push(29871) == " ");
  CHECK(d.push(3 + 0xF0).empty());
  CHECK(d.pending() == 1);
  CHECK(d.push(3 + 0x9F).empty());
  CHECK(d.push(3 + 0xA6).empty());
  CHECK(d.pending() == 3);
  CHECK(d.push(3 + 0x99) == "\xF0\x9F\xA6\x99");
  CHECK(d.pending() == 0);

  // An incomplete character followed by text is passed on as it is, never dropped.
  CHECK(d.push(3 + 0xC3).empty());
  CHECK(d.push(263) == "\xC3 a");
  // Bytes that can never start a character are not held.
  CHECK(d.push(3 + 0xFF) == "\xFF");
  // flush() hands over what is held back.
  CHECK(d.push(3 + 0xE4).empty());
  CHECK(d.flush() == "\xE4");
  CHECK(d.pending() == 0);

  // The leading space after BOS, when asked.
  llm::detokenizer s(*v, {.strip_leading_space = true});
  CHECK(s.push(1).empty());
  CHECK(s.push(15043) == "Hello");
  CHECK(s.push(15043) == " Hello");
  s.reset();
  CHECK(s.push(15043) == "Hello");
}

TEST_CASE("vocab: SentencePiece merges by score, leftmost first on ties", "[vocab]") {
  const llm::vocab v(make_spm_vocab({{"\xE2\x96\x81", -1},        // 259 ▁
                                     {"a", -2},                   // 260
                                     {"b", -3},                   // 261
                                     {"c", -4},                   // 262
                                     {"ab", -5},                  // 263
                                     {"bc", -0.5f},               // 264
                                     {"\xE2\x96\x81" "a", -6},    // 265 ▁a
                                     {"x", -2},                   // 266
                                     {"xx", -1}}));               // 267
  // ▁ a b c: "bc" (-0.5) beats "▁a" (-6) and "ab" (-5); then "▁a" merges; "▁abc" is no token.
  CHECK(v.tokenize("abc", false) == ids{265, 264});
  // ▁ x x x: both "xx" pairs score -1; the leftmost merges first.
  CHECK(v.tokenize("xxx", false) == ids{259, 267, 266});
  // No token for 'é' (C3 A9): byte fallback.
  CHECK(v.tokenize("\xC3\xA9", false) == ids{259, 3 + 0xC3, 3 + 0xA9});
  // The user-defined token is matched even without parse_special; the text after it gets the prefix.
  const token_id user = v.n_tokens() - 1;
  CHECK(v.tokenize("a<|user|>b", false) == ids{265, user, 259, 261});
  // So text after a special token does not round-trip: the prefixed space stays (as in llama.cpp).
  CHECK(v.detokenize(v.tokenize("a<|user|>b", true), {.strip_leading_space = true}) == "a<|user|> b");
  // Control tokens only with parse_special.
  CHECK(v.tokenize("<s>", false, true) == ids{1});
}

TEST_CASE("vocab: SentencePiece without byte tokens uses <unk>", "[vocab]") {
  const llm::vocab v(make_spm_vocab({{"\xE2\x96\x81", -1}, {"a", -2}}, /*with_bytes=*/false));
  CHECK(v.tokenize("a\xC3\xA9", false) == ids{3, 4, 0, 0});
  CHECK(v.nl() == llm::token_null);
}

TEST_CASE("vocab: invalid vocabularies are refused with the key and value", "[vocab]") {
  const auto message_of = [](const gguf_writer& w) -> std::string {
    try {
      llm::vocab v(parse(w));
    } catch (const troupe::error& e) {
      return e.what();
    }
    return "no error";
  };
  {
    gguf_writer w;
    w.add("tokenizer.ggml.model", "bert");
    w.add("tokenizer.ggml.tokens", std::vector<std::string>{"[PAD]", "a"});
    CHECK_THROWS_AS(llm::vocab(parse(w)), llm::vocab_error);
    CHECK_THAT(message_of(w), Catch::Contains("'bert'") && Catch::Contains("tokenizer.ggml.model"));
  }
  {
    gguf_writer w;
    w.add("tokenizer.ggml.tokens", std::vector<std::string>{"a"});
    CHECK_THROWS_AS(llm::vocab(parse(w)), gguf_error);
    CHECK_THAT(message_of(w), Catch::Contains("tokenizer.ggml.model"));
  }
  {
    gguf_writer w;
    w.add("tokenizer.ggml.model", "llama");
    w.add("tokenizer.ggml.tokens", std::vector<std::string>{"<unk>", "<s>", "</s>"});
    w.add("tokenizer.ggml.scores", std::vector<float>{0, 0});
    CHECK_THAT(message_of(w), Catch::Contains("tokenizer.ggml.scores has 2 entries"));
  }
  {
    gguf_writer w;
    w.add("tokenizer.ggml.model", "llama");
    w.add("tokenizer.ggml.tokens", std::vector<std::string>{"<unk>", "<s>", "<s>"});
    CHECK_THAT(message_of(w), Catch::Contains("duplicate token '<s>'"));
  }
  {
    gguf_writer w;
    w.add("tokenizer.ggml.model", "llama");
    w.add("tokenizer.ggml.tokens", std::vector<std::string>{"<unk>", "<s>", "</s>"});
    w.add("tokenizer.ggml.scores", std::vector<int32_t>{0, 0, 0});
    CHECK_THROWS_AS(llm::vocab(parse(w)), gguf_error);  // scores must be float32
  }
  {
    gguf_writer w;
    w.add("tokenizer.ggml.model", "gpt2");
    w.add("tokenizer.ggml.pre", "foo-bar");
    w.add("tokenizer.ggml.tokens", std::vector<std::string>{"a", "b"});
    w.add("tokenizer.ggml.merges", std::vector<std::string>{"a b"});
    CHECK_THAT(message_of(w), Catch::Contains("'foo-bar'") && Catch::Contains("tokenizer.ggml.pre"));
  }
  {
    gguf_writer w;
    w.add("tokenizer.ggml.model", "gpt2");
    w.add("tokenizer.ggml.pre", "gpt2");
    w.add("tokenizer.ggml.tokens", std::vector<std::string>{"a", "b"});
    CHECK_THAT(message_of(w), Catch::Contains("tokenizer.ggml.merges"));
  }
  {
    gguf_writer w;
    w.add("tokenizer.ggml.model", "gpt2");
    w.add("tokenizer.ggml.pre", "gpt2");
    w.add("tokenizer.ggml.tokens", std::vector<std::string>{"a", "b"});
    w.add("tokenizer.ggml.merges", std::vector<std::string>{"a b"});
    w.add("tokenizer.ggml.add_bos_token", true);
    CHECK_THAT(message_of(w), Catch::Contains("add_bos_token is true but there is no BOS token"));
  }
}

TEST_CASE("vocab: tokenizing random bytes never throws and round trips", "[vocab][models]") {
  const auto v = load_vocab("llama-2-tiny-random.gguf");
  if (!v) return;
  std::mt19937 rng(7);
  for (int i = 0; i < 200; ++i) {
    std::string s(rng() % 40, '\0');
    for (char& c : s) c = static_cast<char>(rng() % 4 == 0 ? rng() % 256 : ' ' + rng() % 95);
    const ids t = v->tokenize(s, true, true);
    if (s.find("<s>") == std::string::npos && s.find("</s>") == std::string::npos &&
        s.find("<unk>") == std::string::npos) {
      CHECK(v->detokenize(t, {.strip_leading_space = true}) == s);
    }
  }
}
