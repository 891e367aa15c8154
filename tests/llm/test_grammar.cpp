// The grammar engine: GBNF parsing and its errors, strings accepted and rejected, UTF-8 split across
// tokens, the vocabulary mask against a token-by-token check on SmolLM2's 49k pieces, and JSON Schema
// compilation (every supported keyword, refusals by name) checked by matching JSON texts.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <string>
#include <string_view>
#include <vector>

#include "loader/gguf.h"
#include "llm/generator.h"
#include "llm/grammar.h"
#include "llm/llm_context.h"
#include "llm/model.h"
#include "llm/tool_calls.h"
#include "tests/test_models.h"

using namespace troupe;
using namespace troupe::llm;

namespace {

bool matches(const std::shared_ptr<const grammar>& g, std::string_view text) {
  grammar_matcher m(g);
  return m.accept(text) && m.can_end();
}

bool gbnf_matches(std::string_view gbnf, std::string_view text) { return matches(grammar::parse(gbnf), text); }

std::string error_of(std::string_view gbnf) {
  try {
    grammar::parse(gbnf);
  } catch (const grammar_error& e) {
    return e.what();
  }
  return "no error";
}

std::string schema_error(std::string_view schema) {
  try {
    json_schema_to_gbnf(schema);
  } catch (const grammar_error& e) {
    return e.what();
  }
  return "no error";
}

bool schema_matches(std::string_view schema, std::string_view text) {
  return matches(grammar::parse(json_schema_to_gbnf(schema)), text);
}

// A hand-written reference for the answer grammar of the stories260K case,
//   root ::= ("Yes" | "No") ", the " [a-z]{1,8} " was " ("big" | "small") "."
// independent of the grammar engine: whether s is a prefix of a sentence (complete: a whole sentence).
bool answer_prefix(std::string_view s, bool complete = false) {
  size_t i = 0;
  // 1: all of lit read; 0: s ends inside lit; -1: s leaves lit.
  auto literal = [&](std::string_view lit) {
    const size_t n = std::min(lit.size(), s.size() - i);
    if (s.substr(i, n) != lit.substr(0, n)) return -1;
    i += n;
    return n == lit.size() ? 1 : 0;
  };
  auto one_of = [&](std::string_view a, std::string_view b) {  // a and b differ in their first byte
    const size_t at = i;
    const int r = literal(a);
    if (r >= 0) return r;
    i = at;
    return literal(b);
  };
  int r = one_of("Yes", "No");
  if (r == 1) r = literal(", the ");
  if (r != 1) return r == 0 && !complete;
  size_t letters = 0;
  while (i < s.size() && s[i] >= 'a' && s[i] <= 'z') {
    ++i;
    ++letters;
  }
  if (letters > 8) return false;
  if (i == s.size()) return !complete;
  if (letters == 0) return false;
  r = literal(" was ");
  if (r == 1) r = one_of("big", "small");
  if (r == 1) r = literal(".");
  if (r != 1) return r == 0 && !complete;
  return i == s.size();
}

}  // namespace

TEST_CASE("grammar: literals, alternatives, classes and repetition", "[grammar]") {
  const auto g = grammar::parse(R"(root ::= ("yes" | "no") [.!]? # an answer
)");
  CHECK(matches(g, "yes"));
  CHECK(matches(g, "no!"));
  CHECK(matches(g, "yes."));
  CHECK_FALSE(matches(g, "ye"));
  CHECK_FALSE(matches(g, "yes!!"));
  CHECK_FALSE(matches(g, "maybe"));
  CHECK_FALSE(matches(g, ""));

  CHECK(gbnf_matches("root ::= [a-c]+", "abcabc"));
  CHECK_FALSE(gbnf_matches("root ::= [a-c]+", ""));
  CHECK_FALSE(gbnf_matches("root ::= [a-c]+", "abd"));
  CHECK(gbnf_matches("root ::= [^a-c]*", "xyz"));
  CHECK_FALSE(gbnf_matches("root ::= [^a-c]*", "xaz"));
  CHECK(gbnf_matches("root ::= \"x\"{2,3}", "xx"));
  CHECK(gbnf_matches("root ::= \"x\"{2,3}", "xxx"));
  CHECK_FALSE(gbnf_matches("root ::= \"x\"{2,3}", "x"));
  CHECK_FALSE(gbnf_matches("root ::= \"x\"{2,3}", "xxxx"));
  CHECK(gbnf_matches("root ::= \"ab\"{2,}", "ababab"));
  CHECK_FALSE(gbnf_matches("root ::= \"ab\"{2,}", "aba"));
  CHECK(gbnf_matches("root ::= \"a\"{3}", "aaa"));
  CHECK_FALSE(gbnf_matches("root ::= \"a\"{3}", "aaaa"));
  CHECK(gbnf_matches("root ::= . . .", "a\xC3\xA9z"));  // . is one character, not one byte
  CHECK_FALSE(gbnf_matches("root ::= . .", "a\xC3\xA9z"));
  CHECK(gbnf_matches(R"(root ::= "\x41\u00e9\n\t\"\\")", "A\xC3\xA9\n\t\"\\"));
  CHECK(gbnf_matches(R"(root ::= [\u0400-\u04FF]+)", "\xD0\x9F\xD1\x80\xD0\xB8"));  // Cyrillic
  CHECK_FALSE(gbnf_matches(R"(root ::= [\u0400-\u04FF]+)", "\xC3\xA9"));
}

TEST_CASE("grammar: rules, recursion and continuation lines", "[grammar]") {
  const auto g = grammar::parse(R"(
root   ::= list
list   ::= "[" ( item ( "," item )* )? "]"
item   ::= number
         | list
number ::= [0-9]+
)");
  CHECK(matches(g, "[]"));
  CHECK(matches(g, "[1,[2,[]],33]"));
  CHECK_FALSE(matches(g, "[1,]"));
  CHECK_FALSE(matches(g, "[[1]"));
  CHECK_FALSE(matches(g, "[a]"));
  // Right recursion is fine.
  CHECK(gbnf_matches("root ::= \"a\" root | \"b\"", "aaab"));
  CHECK(gbnf_matches("root ::= x* \"!\"\nx ::= \"a\" \"b\"?", "aab!"));
}

TEST_CASE("grammar: errors name the problem and where it is", "[grammar]") {
  CHECK_THAT(error_of("root ::= foo"), Catch::Contains("rule 'foo' is used") && Catch::Contains("never defined"));
  CHECK_THAT(error_of("start ::= \"a\""), Catch::Contains("no rule 'root'"));
  CHECK_THAT(error_of("root ::= root \"a\" | \"b\""), Catch::Contains("left-recursive"));
  CHECK_THAT(error_of("root ::= x\nx ::= \"\"? root"), Catch::Contains("left-recursive"));
  // A repetition of something that can be empty would loop forever too.
  CHECK_THAT(error_of("root ::= x* \"!\"\nx ::= \"a\"?"), Catch::Contains("left-recursive") && Catch::Contains("empty"));
  CHECK_THAT(error_of("root ::= \"abc"), Catch::Contains("unterminated literal") && Catch::Contains("line 1"));
  CHECK_THAT(error_of("root ::= [abc"), Catch::Contains("unterminated character class"));
  CHECK_THAT(error_of("root ::= \"a\"\nroot ::= \"b\""), Catch::Contains("defined twice") && Catch::Contains("line 2"));
  CHECK_THAT(error_of("root = \"a\""), Catch::Contains("expected '::='"));
  CHECK_THAT(error_of("root ::= ( \"a\""), Catch::Contains("expected ')'"));
  CHECK_THAT(error_of("root ::= \"a\"{3,2}"), Catch::Contains("n < m"));
  CHECK_THAT(error_of("root ::= \"\\q\""), Catch::Contains("unknown escape"));
  CHECK_THAT(error_of("root ::= [z-a]"), Catch::Contains("out of order"));
  // Hostile sizes are refused, never a stack overflow or an unbounded allocation.
  CHECK_THAT(error_of("root ::= " + std::string(100000, '(') + "\"a\"" + std::string(100000, ')')),
             Catch::Contains("nested deeper than 128"));
  std::string wide = "root ::=";
  for (int i = 0; i < 21; ++i) wide += " \"a\"{10000}";
  CHECK_THAT(error_of(wide), Catch::Contains("more than 200000 elements"));
  CHECK_THAT(error_of("root ::= \"a\"{10001}"), Catch::Contains("repetition count over 10000"));
  std::string chain = "root ::= r0\n";
  for (int i = 0; i < 25000; ++i) chain += "r" + std::to_string(i) + " ::= r" + std::to_string(i + 1) + " | \"x\"\n";
  CHECK_THAT(error_of(chain), Catch::Contains("more than 20000 rules"));
}

TEST_CASE("grammar: deep nesting in the text and in schemas", "[grammar]") {
  // A stack as deep as the text (nested brackets), through the automaton's memory bound (trim).
  const auto g = grammar::parse(R"g(root ::= "(" root ")" | "")g");
  grammar_matcher m(g);
  for (int i = 0; i < 20000; ++i) REQUIRE(m.accept("("));
  CHECK(m.bytes_to_end() == 20000);
  for (int i = 0; i < 20000; ++i) REQUIRE(m.accept(")"));
  CHECK(m.can_end());
  std::string deep;
  for (int i = 0; i < 200; ++i) deep += R"({"type": "array", "items": )";
  deep += "{}" + std::string(200, '}');
  CHECK_THAT(schema_error(deep), Catch::Contains("deeper than 64"));
}

TEST_CASE("grammar: bytes of one character may arrive in different tokens", "[grammar]") {
  const auto g = grammar::parse(R"(root ::= "a" [\u00e0-\u00ff] "b")");
  grammar_matcher m(g);
  CHECK(m.accept("a\xC3"));   // the first byte of U+00E9: some completion is in the class
  CHECK_FALSE(m.can_end());
  CHECK_FALSE(m.accepts("\xC2"));  // not a continuation byte
  CHECK(m.accept("\xA9"));    // U+00E9
  CHECK(m.accept("b"));
  CHECK(m.can_end());
  CHECK(m.must_end());

  grammar_matcher n(g);
  CHECK_FALSE(n.accept("a\xD0"));  // U+0400.. : no completion is in [U+00E0, U+00FF]
  CHECK(n.accept("a"));
  CHECK_FALSE(n.accept("\xC3\x80"));  // U+00C0, below the class
  CHECK_FALSE(n.accept("\xFF"));       // never valid UTF-8
  // Overlong forms and surrogates are not characters, even where their value would match.
  const auto t = grammar::parse(R"(root ::= "t" | [\uD000-\uDFFF])");
  CHECK_FALSE(grammar_matcher(t).accepts("\xF0\x80\x81\xB4"));  // 't' in four bytes
  CHECK_FALSE(grammar_matcher(t).accepts("\xC1\xB4"));
  CHECK_FALSE(grammar_matcher(t).accepts("\xE0\x81"));
  CHECK_FALSE(grammar_matcher(t).accepts("\xED\xA0"));             // U+D800..
  CHECK(grammar_matcher(t).accepts("\xED\x80\x80"));              // U+D000
}

TEST_CASE("grammar: a rejected step leaves the state as it was", "[grammar]") {
  const auto g = grammar::parse(R"(root ::= "hello" " world"?)");
  grammar_matcher m(g);
  CHECK(m.accept("hel"));
  CHECK_FALSE(m.accept("lx"));
  CHECK(m.accept("lo"));
  CHECK(m.can_end());
  CHECK_FALSE(m.must_end());
  CHECK(m.accept(" world"));
  CHECK(m.must_end());
}

TEST_CASE("grammar: the bytes still needed, and a closing mask that only allows progress", "[grammar]") {
  grammar_matcher m(grammar::parse(json_object_gbnf()));
  CHECK(m.bytes_to_end() == 2);  // {}
  REQUIRE(m.accept("{\"a\": [{\"b\": \"x"));
  CHECK(m.bytes_to_end() == 4);  // "}]}
  REQUIRE(m.accept("\xC3"));
  CHECK(m.bytes_to_end() == 5);  // the character's last byte too
  REQUIRE(m.accept("\xA9\"}]}"));
  CHECK(m.bytes_to_end() == 0);
  CHECK(m.must_end());
}

TEST_CASE("grammar: the vocabulary mask equals checking every token on its own (SmolLM2)", "[grammar][models]") {
  const auto path = test::smollm2_path();
  if (!path) return;
  const vocab v(read_gguf(*path));
  const auto g = grammar::parse(json_object_gbnf());
  grammar_matcher m(g);
  // A few states of a JSON object being written: the start, inside a key, after a colon, inside a string
  // value mid-character, after a nested value, complete.
  const std::vector<std::string> steps = {"", "{", "\"na", "me\"", ": ", "\"caf\xC3", "\xA9\"", ", \"n\": [1, 2.5e",
                                          "3], \"o\": {\"x\": true}", "}"};
  std::vector<uint8_t> allowed;
  for (const std::string& s : steps) {
    REQUIRE(m.accept(s));
    const size_t n = m.allowed_tokens(v, allowed);
    size_t expected = 0;
    size_t mismatches = 0;
    for (token_id t = 0; t < v.n_tokens(); ++t) {
      const std::string piece = v.token_to_piece(t);
      bool ok = !piece.empty() && !v.is_control(t) && m.accepts(piece);
      if (v.is_eog(t)) ok = m.can_end();
      expected += ok ? 1 : 0;
      if (ok != (allowed[static_cast<size_t>(t)] != 0)) ++mismatches;
    }
    INFO("after '" << s << "'");
    CHECK(mismatches == 0);
    CHECK(n == expected);
    if (s.empty()) CHECK(n > 0);
  }
  CHECK(m.must_end());
  // Closing: inside a string value, only pieces that leave fewer bytes to the end.
  grammar_matcher c(g);
  REQUIRE(c.accept("{\"a\": \"b"));
  const size_t closing = c.allowed_tokens(v, allowed, true);
  CHECK(closing > 0);
  CHECK(closing < c.allowed_tokens(v, allowed) / 100);
  c.allowed_tokens(v, allowed, true);
  for (token_id t = 0; t < v.n_tokens(); ++t) {
    if (!allowed[static_cast<size_t>(t)]) continue;
    grammar_matcher after = c;
    REQUIRE(after.accept(v.token_to_piece(t)));
    CHECK(after.bytes_to_end() < c.bytes_to_end());
  }
  // Complete: only end-of-generation tokens.
  m.allowed_tokens(v, allowed);
  for (token_id t = 0; t < v.n_tokens(); ++t) CHECK((allowed[static_cast<size_t>(t)] != 0) == v.is_eog(t));
}

TEST_CASE("grammar: any JSON object (response_format json_object)", "[grammar][json]") {
  const auto g = grammar::parse(json_object_gbnf());
  CHECK(matches(g, "{}"));
  CHECK(matches(g, R"({"a": 1, "b": [true, false, null, -0.5e+3, "x\"\\\u00e9"], "c": {"d": {}}})"));
  CHECK(matches(g, "{\n  \"a\": \"caf\xC3\xA9\"\n}"));
  CHECK_FALSE(matches(g, "[1]"));          // an object, not any value
  CHECK_FALSE(matches(g, R"({"a": 01})"));  // no leading zeros
  CHECK_FALSE(matches(g, R"({"a": 1,})"));
  CHECK_FALSE(matches(g, R"({'a': 1})"));
  CHECK_FALSE(matches(g, "{\"a\": \"line\nbreak\"}"));  // control characters must be escaped
  CHECK_FALSE(matches(g, "```json\n{}"));
}

TEST_CASE("grammar: JSON Schema types, properties and required", "[grammar][json]") {
  const char* person = R"({"type": "object",
    "properties": {"name": {"type": "string"}, "age": {"type": "integer"}, "height": {"type": "number"},
                   "member": {"type": "boolean"}, "nick": {"type": ["string", "null"]}},
    "required": ["name", "age"], "additionalProperties": false})";
  CHECK(schema_matches(person, R"({"name": "Ann", "age": 31})"));
  CHECK(schema_matches(person, R"({"name": "Ann", "age": -4, "height": 1.7, "member": true, "nick": null})"));
  CHECK(schema_matches(person, R"({"name": "Ann", "age": 3, "nick": "A"})"));
  CHECK_FALSE(schema_matches(person, R"({"name": "Ann"})"));                    // age is required
  CHECK_FALSE(schema_matches(person, R"({"age": 3, "name": "Ann"})"));          // the schema's order
  CHECK_FALSE(schema_matches(person, R"({"name": "Ann", "age": 3.5})"));        // integer
  CHECK_FALSE(schema_matches(person, R"({"name": 5, "age": 3})"));
  CHECK_FALSE(schema_matches(person, R"({"name": "Ann", "age": 3, "member": "yes"})"));
  CHECK_FALSE(schema_matches(person, R"({"name": "Ann", "age": 3, "other": 1})"));  // no extra keys
  CHECK_FALSE(schema_matches(person, R"({"name": "Ann", "age": 3,})"));
  // Only optional properties: the empty object and any ordered subset.
  const char* opt = R"({"properties": {"a": {"type": "integer"}, "b": {"type": "integer"}, "c": {"type": "integer"}}})";
  CHECK(schema_matches(opt, "{}"));
  CHECK(schema_matches(opt, R"({"b": 2})"));
  CHECK(schema_matches(opt, R"({"a": 1, "c": 3})"));
  CHECK_FALSE(schema_matches(opt, R"({, "c": 3})"));
  CHECK_FALSE(schema_matches(opt, R"({"c": 3, "a": 1})"));
}

TEST_CASE("grammar: JSON Schema enum, const, arrays, nesting, anyOf, $ref and lengths", "[grammar][json]") {
  CHECK(schema_matches(R"({"enum": ["red", "green", 3, null]})", "\"green\""));
  CHECK(schema_matches(R"({"enum": ["red", "green", 3, null]})", "3"));
  CHECK_FALSE(schema_matches(R"({"enum": ["red", "green"]})", "\"blue\""));
  CHECK(schema_matches(R"({"const": {"k": [1, "x"]}})", R"({"k":[1,"x"]})"));
  CHECK_FALSE(schema_matches(R"({"const": "a"})", "\"b\""));

  const char* arr = R"({"type": "array", "items": {"type": "integer"}, "minItems": 1, "maxItems": 3})";
  CHECK(schema_matches(arr, "[1]"));
  CHECK(schema_matches(arr, "[1, 2, 3]"));
  CHECK_FALSE(schema_matches(arr, "[]"));
  CHECK_FALSE(schema_matches(arr, "[1, 2, 3, 4]"));
  CHECK_FALSE(schema_matches(arr, "[1, \"2\"]"));
  CHECK(schema_matches(R"({"type": "array"})", R"([1, "a", {}])"));
  CHECK(schema_matches(R"({"prefixItems": [{"type": "string"}, {"type": "number"}], "items": false})", R"(["a", 2])"));
  CHECK_FALSE(schema_matches(R"({"prefixItems": [{"type": "string"}, {"type": "number"}], "items": false})", R"([2, "a"])"));

  const char* nested = R"({"type": "object", "properties": {"user": {"type": "object",
      "properties": {"id": {"type": "integer"}, "tags": {"type": "array", "items": {"type": "string"}}},
      "required": ["id", "tags"]}}, "required": ["user"]})";
  CHECK(schema_matches(nested, R"({"user": {"id": 7, "tags": ["a", "b"]}})"));
  CHECK_FALSE(schema_matches(nested, R"({"user": {"id": 7}})"));

  const char* any = R"({"anyOf": [{"type": "integer"}, {"type": "object", "properties": {"x": {"type": "boolean"}}, "required": ["x"]}]})";
  CHECK(schema_matches(any, "12"));
  CHECK(schema_matches(any, R"({"x": false})"));
  CHECK_FALSE(schema_matches(any, "\"12\""));
  CHECK(schema_matches(R"({"oneOf": [{"type": "null"}, {"type": "boolean"}]})", "null"));

  const char* ref = R"({"$defs": {"node": {"type": "object", "properties": {"v": {"type": "integer"},
      "next": {"anyOf": [{"$ref": "#/$defs/node"}, {"type": "null"}]}}, "required": ["v", "next"]}},
      "$ref": "#/$defs/node"})";
  CHECK(schema_matches(ref, R"({"v": 1, "next": {"v": 2, "next": null}})"));
  CHECK_FALSE(schema_matches(ref, R"({"v": 1, "next": {"v": 2}})"));
  CHECK(schema_matches(R"({"definitions": {"a": {"type": "boolean"}}, "properties": {"x": {"$ref": "#/definitions/a"}}})", R"({"x": true})"));

  const char* len = R"({"type": "string", "minLength": 2, "maxLength": 3})";
  CHECK(schema_matches(len, "\"ab\""));
  CHECK(schema_matches(len, "\"\\u00e9bc\""));
  CHECK_FALSE(schema_matches(len, "\"a\""));
  CHECK_FALSE(schema_matches(len, "\"abcd\""));
  CHECK(schema_matches(R"({"type": "string", "nullable": true})", "null"));
  CHECK(schema_matches(R"({"type": "object", "additionalProperties": {"type": "integer"}})", R"({"p": 1, "q": 2})"));
  CHECK_FALSE(schema_matches(R"({"type": "object", "additionalProperties": {"type": "integer"}})", R"({"p": "1"})"));
  CHECK(schema_matches(R"({"title": "T", "description": "d", "$schema": "x", "type": "boolean", "default": true})", "true"));
  CHECK(schema_matches("{}", "[1, {\"a\": null}]"));
}

TEST_CASE("grammar: JSON Schema keywords that are not supported are refused by name", "[grammar][json]") {
  CHECK_THAT(schema_error(R"({"type": "object", "properties": {"age": {"type": "integer", "minimum": 0}}})"),
             Catch::Contains("'minimum'") && Catch::Contains("properties.age.minimum"));
  CHECK_THAT(schema_error(R"({"type": "string", "pattern": "^a"})"), Catch::Contains("'pattern'"));
  CHECK_THAT(schema_error(R"({"type": "string", "format": "date-time"})"), Catch::Contains("'format'"));
  CHECK_THAT(schema_error(R"({"allOf": [{"type": "string"}]})"), Catch::Contains("'allOf'"));
  CHECK_THAT(schema_error(R"({"type": "array", "items": {"not": {}}})"), Catch::Contains("items.not"));
  CHECK_THAT(schema_error(R"({"type": "strin"})"), Catch::Contains("unknown type 'strin'"));
  CHECK_THAT(schema_error(R"({"$ref": "#/$defs/missing"})"), Catch::Contains("does not name a definition"));
  CHECK_THAT(schema_error(R"({"$ref": "http://example.com/s.json"})"), Catch::Contains("$ref"));
  CHECK_THAT(schema_error("{\"type\": "), Catch::Contains("not valid JSON"));
  CHECK_THAT(schema_error(R"({"type": "array", "minItems": -1})"), Catch::Contains("'minItems'"));
  CHECK_THAT(schema_error("false"), Catch::Contains("matches nothing"));
}

TEST_CASE("grammar: the hand-written reference of the stories260K answer grammar agrees with the engine", "[grammar]") {
  const auto g = grammar::parse(R"(root ::= ("Yes" | "No") ", the " [a-z]{1,8} " was " ("big" | "small") "." )");
  for (std::string_view text : {"", "Y", "No", "No,", "Yes, the ", "Yes, the c", "Yes, the abcdefgh", "Yes, the abcdefghi",
                                "No, the cat", "No, the cat ", "No, the cat w", "No, the cat was s", "No, the cat was small",
                                "No, the cat was small.", "No, the cat was small..", "No, the  cat", "No, the Cat",
                                "Yes, the dog was big.", "Yes, the dog was bigs", "Maybe", " Yes", "Yes the"}) {
    INFO("'" << text << "'");
    CHECK(answer_prefix(text) == grammar_matcher(g).accepts(text));
    CHECK(answer_prefix(text, true) == matches(g, text));
  }
}

TEST_CASE("grammar: answers sampled under a grammar are in its language and end with it (stories260K)", "[grammar][models]") {
  const auto path = test::model_path("stories260K.gguf");
  if (!path) return;
  auto m = model::load(*path);
  const vocab v(m->meta());
  llm_context ctx(*m, {.n_ctx = 256, .n_threads = 2});
  const char* gbnf = R"(root ::= ("Yes" | "No") ", the " [a-z]{1,8} " was " ("big" | "small") "." )";
  const auto g = grammar::parse(gbnf);
  const auto prompt = v.tokenize("Once upon a time", true);
  // The log-probabilities are those of the constrained distribution: every top candidate is a token the
  // grammar allows after the text so far (the pieces of the tokens before it), by the hand-written
  // reference above; an end-of-generation token only once the sentence is complete.
  size_t n_candidates = 0;
  auto check_candidates = [&](const generate_result& r) {
    std::string text;
    for (const token_logprob& lp : r.logprobs) {
      for (const token_prob& c : lp.top) {
        INFO("after '" << text << "': candidate " << c.token << " '" << c.text << "', log-probability " << c.logprob);
        CHECK(c.logprob > -INFINITY);
        if (v.is_eog(c.token)) CHECK(answer_prefix(text, true));
        else CHECK((!c.text.empty() && answer_prefix(text + c.text)));
        ++n_candidates;
      }
      text += lp.text;
    }
  };
  for (uint32_t seed = 1; seed <= 6; ++seed) {
    generator gen(ctx, v, 0);
    gen.reset();  // the sequence's cells from the previous answer
    generate_params p;
    p.temperature = 1.0f;
    p.seed = seed;
    p.max_tokens = 64;
    p.grammar = gbnf;
    p.logprobs = generate_params::max_logprobs;
    const generate_result r = gen.generate(prompt, p);
    INFO("seed " << seed << ": '" << r.text << "'");
    CHECK(r.finish == "stop");
    CHECK(matches(g, r.text));
    check_candidates(r);
  }
  // Greedy: the same text twice, and a grammar error before anything is decoded. Its log-probabilities
  // are those of every token the mask left (no top-k / top-p / min-p filter removes any), so a banned token
  // that kept a finite logit would be among the top 20 wherever the grammar allows fewer.
  generator gen(ctx, v, 0);
  gen.reset();
  generate_params p = generate_params::greedy(64);
  p.grammar = gbnf;
  p.logprobs = generate_params::max_logprobs;
  const generate_result greedy = gen.generate(prompt, p);
  INFO("greedy: '" << greedy.text << "'");
  CHECK(matches(g, greedy.text));
  check_candidates(greedy);
  CHECK(n_candidates > 100);
  gen.reset();
  CHECK(gen.generate(prompt, p).text == greedy.text);
  p.grammar = "root ::= nothing";
  CHECK_THROWS_AS(gen.generate(prompt, p), grammar_error);
}

TEST_CASE("tool calls: the forced-call grammar accepts exactly well-formed calls, and they parse back", "[grammar][tools]") {
  const std::vector<tool_function> tools = {
      {"get_weather", "weather", R"({"type": "object", "properties": {"city": {"type": "string"}, "unit": {"enum": ["c", "f"]}}, "required": ["city", "unit"]})"},
      {"now", "", "{}"}};
  for (const tool_syntax syn : {tool_syntax::hermes, tool_syntax::llama3}) {
    INFO((syn == tool_syntax::hermes ? "hermes" : "llama3"));
    const auto one = grammar::parse(tool_call_gbnf(syn, tools, false));
    const auto many = grammar::parse(tool_call_gbnf(syn, tools, true));
    const std::vector<tool_call> calls = {{"", "get_weather", R"({"city":"Paris","unit":"c"})"}, {"", "now", "{}"}};
    const std::string first = render_tool_calls(syn, std::span(calls).first(1));
    const std::string both = render_tool_calls(syn, calls);
    CHECK(matches(one, first));
    CHECK_FALSE(matches(one, both));
    CHECK(matches(many, both));
    const std::string bad_arg = render_tool_calls(syn, std::vector<tool_call>{{"", "get_weather", R"({"city":"Paris","unit":"k"})"}});
    CHECK_FALSE(matches(one, bad_arg));
    const std::string unknown = render_tool_calls(syn, std::vector<tool_call>{{"", "other", "{}"}});
    CHECK_FALSE(matches(one, unknown));
    const tool_output out = parse_tool_calls(syn, both, tools);
    REQUIRE(out.calls.size() == 2);
    CHECK(out.calls[0].name == "get_weather");
    CHECK(out.calls[0].arguments == R"({"city":"Paris","unit":"c"})");
    CHECK(out.calls[1].name == "now");
    CHECK(out.content.empty());
    // Plain text is content; an unknown function is not a call.
    CHECK(parse_tool_calls(syn, "It is sunny.", tools).calls.empty());
    CHECK(parse_tool_calls(syn, "It is sunny.", tools).content == "It is sunny.");
    CHECK(parse_tool_calls(syn, unknown, tools).calls.empty());
  }
  // Hermes: text around calls is content; an unclosed call at the end still parses; streaming holds back
  // what may begin a call.
  const tool_output mixed = parse_tool_calls(tool_syntax::hermes, "Let me check.\n<tool_call>\n{\"name\": \"now\", \"arguments\": {}}", tools);
  REQUIRE(mixed.calls.size() == 1);
  CHECK(mixed.content == "Let me check.");
  CHECK(streamable_content(tool_syntax::hermes, "Hello <tool") == 6);
  CHECK(streamable_content(tool_syntax::hermes, "Hello <tool_call>\n{") == 6);
  CHECK(streamable_content(tool_syntax::hermes, "Hello") == 5);
  CHECK(streamable_content(tool_syntax::llama3, " {\"na") == 0);
  CHECK(streamable_content(tool_syntax::llama3, "Sure") == 4);
  CHECK_THROWS_WITH(tool_call_gbnf(tool_syntax::hermes, std::vector<tool_function>{{"f", "", R"({"type": "string", "format": "uri"})"}}, false),
                    Catch::Contains("function 'f'") && Catch::Contains("'format'"));
  // The tool prompt names every function with its schema; results become the family's turns.
  CHECK_THAT(tools_prompt(tool_syntax::hermes, tools), Catch::Contains("<tools>") && Catch::Contains("\"get_weather\""));
  CHECK(render_tool_result(tool_syntax::llama3, "21").role == "ipython");
  CHECK(render_tool_result(tool_syntax::hermes, "21").content == "<tool_response>\n21\n</tool_response>");
  CHECK(tool_syntax_for("llama3") == tool_syntax::llama3);
  CHECK(tool_syntax_for("chatml") == tool_syntax::hermes);
}

TEST_CASE("grammar: a grammar whose ambiguity doubles with each rule is refused, not expanded into memory", "[llm][grammar]") {
  // r20 reaches the same optional "a" along 2^20 paths, each a different parser stack.
  std::string text = "root ::= r20 \"!\"\nr0 ::= \"a\"?\n";
  for (int k = 1; k <= 20; ++k) text += "r" + std::to_string(k) + " ::= r" + std::to_string(k - 1) + " r" + std::to_string(k - 1) + "\n";
  const auto g = llm::grammar::parse(text);
  CHECK_THROWS_WITH(llm::grammar_matcher{g}, Catch::Contains("parser frames"));
  // Twelve levels (4,096 paths) are fine: 0 to 4,096 a's, then "!".
  std::string small = "root ::= r12 \"!\"\nr0 ::= \"a\"?\n";
  for (int k = 1; k <= 12; ++k) small += "r" + std::to_string(k) + " ::= r" + std::to_string(k - 1) + " r" + std::to_string(k - 1) + "\n";
  llm::grammar_matcher m(llm::grammar::parse(small));
  CHECK(m.accept("aaa!"));
  CHECK(m.can_end());
}
