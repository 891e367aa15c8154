// Constrained sampling: a grammar in GBNF (llama.cpp's notation) compiled to rules, and a matcher that
// follows the text generated so far and says, at each step, which tokens of the vocabulary may come next.
//
//   auto g = llm::grammar::parse(R"(root ::= "yes" | "no" | "maybe" [.!]?)");   // throws grammar_error
//   llm::grammar_matcher m(g);
//   m.accept("ma");               // true: a prefix of "maybe"
//   m.can_end();                  // false: "ma" is not a whole answer
//   std::vector<uint8_t> allowed;
//   m.allowed_tokens(vocab, allowed);   // allowed[id] != 0: the token's bytes keep the text in the language
//
// The notation: `name ::= alternatives` per rule (a rule may continue on lines that start with `|`),
// "literals" with \n \t \r \\ \" \xHH \uHHHH \UHHHHHHHH escapes, [a-z0-9_] and [^"\\] character classes,
// `.` (any character), rule names, ( groups ), postfix * + ? {m} {m,} {m,n}, # comments. Rules that refer
// to themselves before consuming a character (left recursion) are refused, as are undefined names.
//
// Matching runs on bytes, so a token may end inside a UTF-8 character: the matcher keeps the partial
// character and allows a token only when some completion of it can match. Tokens whose piece is empty
// (control tokens) are never allowed, except the end-of-generation tokens once the text is complete.
//
// The matcher is a set of pushdown stacks (each a persistent linked list in an arena, so a step shares
// structure instead of copying); allowed_tokens walks the vocabulary's pieces in sorted order, reusing the
// state of the common prefix of consecutive pieces and skipping every piece under a dead prefix, the way
// one would walk a trie of the vocabulary.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "runtime/llm/sampler.h"
#include "runtime/llm/vocab.h"

namespace troupe::llm {

// A grammar that does not parse, names an undefined rule, recurses on the left, or a JSON schema using a
// keyword the compiler does not support. A sampling_error, so the HTTP API answers 400.
class grammar_error : public sampling_error {
 public:
  using sampling_error::sampling_error;
};

class grammar {
 public:
  // Compiles GBNF text; `root` names the start rule. Throws grammar_error with the line and column.
  static std::shared_ptr<const grammar> parse(std::string_view gbnf, std::string_view root = "root");

  enum class kind : uint8_t { end, alt, rule_ref, chars };
  struct element {
    kind type;
    uint32_t value;  // rule_ref: rule index; chars: class index
  };
  struct char_class {
    bool negated = false;
    std::vector<std::pair<uint32_t, uint32_t>> ranges;  // inclusive code point ranges
    uint64_t ascii[2] = {0, 0};                         // code points 0..127, negation applied
    bool matches(uint32_t cp) const;
    // Whether some code point in [lo, hi] matches (a partial UTF-8 character).
    bool may_match(uint32_t lo, uint32_t hi) const;
  };

  const std::vector<element>& elements() const { return elements_; }
  const char_class& class_at(uint32_t i) const { return classes_[i]; }
  // Positions of the first element of each alternative of rule r.
  const std::vector<uint32_t>& alternatives(uint32_t r) const { return alts_[r]; }
  uint32_t root() const { return root_; }
  size_t n_rules() const { return alts_.size(); }
  const std::string& rule_name(uint32_t r) const { return names_[r]; }

 private:
  friend class grammar_parser;
  std::vector<element> elements_;
  std::vector<char_class> classes_;
  std::vector<std::vector<uint32_t>> alts_;
  std::vector<std::string> names_;
  uint32_t root_ = 0;
};

class grammar_matcher {
 public:
  explicit grammar_matcher(std::shared_ptr<const grammar> g);

  // Feeds bytes; false (and the state unchanged) when they leave the language.
  bool accept(std::string_view bytes);
  // Whether accept(bytes) would succeed (the state unchanged).
  bool accepts(std::string_view bytes) const;
  // The text so far is a whole sentence of the grammar.
  bool can_end() const;
  // Nothing but the end can follow (every stack is complete).
  bool must_end() const;

  // allowed[id] = 1 for each token of v whose piece may come next (end-of-generation tokens when
  // can_end()); resized to v.n_tokens(). Returns the number allowed.
  size_t allowed_tokens(const vocab& v, std::vector<uint8_t>& allowed) const;

  // Stacks now (for tests and diagnostics).
  size_t n_stacks() const { return stacks_.size(); }

 private:
  struct frame {
    uint32_t pos;
    int32_t parent;
  };
  struct utf8_state {
    uint32_t cp = 0;
    uint8_t need = 0;  // continuation bytes still to come
  };
  struct scratch;

  int32_t push(std::vector<frame>& arena, uint32_t pos, int32_t parent) const;
  void expand(std::vector<frame>& arena, int32_t top, std::vector<int32_t>& out) const;
  // One byte over `in` into `out`; false when nothing survives.
  bool step(std::vector<frame>& arena, const std::vector<int32_t>& in, utf8_state& u, uint8_t byte,
            std::vector<int32_t>& out) const;
  void compact();

  std::shared_ptr<const grammar> g_;
  std::vector<frame> arena_;
  std::vector<int32_t> stacks_;  // top frame of each stack; -1: a complete (empty) stack
  utf8_state utf8_;
};

// GBNF of any JSON object (response_format json_object): whitespace between tokens bounded.
std::string_view json_object_gbnf();
// GBNF for the values a JSON Schema describes (response_format json_schema). Supported keywords: type (a
// name or a list of names), properties (generated in the schema's order), required, additionalProperties
// (extra properties are never generated, so the answer validates either way), items, prefixItems,
// minItems, maxItems, enum, const, anyOf and oneOf (alternatives), minLength, maxLength, $ref to
// "#/$defs/..." or "#/definitions/...", and the annotations (title, description, default, examples,
// $schema, $id, $comment, strict). Anything else (pattern, format, minimum, multipleOf, allOf, not, ...)
// throws grammar_error naming the keyword and where it is ("properties.age.minimum").
std::string json_schema_to_gbnf(std::string_view schema_json);

}  // namespace troupe::llm
