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
// The matcher is a set of pushdown stacks, each a linked list of interned frames (equal stacks are one
// object), and the sets are interned too: they are the states of an automaton whose transitions are
// computed the first time a byte is tried and then looked up, so inside a JSON string (where the stacks
// come back to the same set after every character) a byte costs an array lookup. allowed_tokens walks the
// vocabulary's pieces in sorted order, reusing the state of the common prefix of consecutive pieces and
// skipping every piece under a dead prefix, the way one would walk a trie of the vocabulary.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "llm/sampler.h"
#include "llm/vocab.h"

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

 private:
  friend class grammar_parser;
  std::vector<element> elements_;
  std::vector<char_class> classes_;
  std::vector<std::vector<uint32_t>> alts_;
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
  // can_end()); resized to v.n_tokens(). Returns the number allowed. With `closing`, only tokens that bring
  // the text closer to a complete sentence (fewer bytes still needed at least) are allowed: an answer
  // about to run out of tokens is steered to close its brackets and strings instead of being cut off.
  size_t allowed_tokens(const vocab& v, std::vector<uint8_t>& allowed, bool closing = false) const;
  // The fewest bytes that complete the text so far (0 when can_end()).
  uint32_t bytes_to_end() const;

 private:
  struct frame {
    uint32_t pos;
    int32_t parent;
  };
  struct utf8_state {
    uint32_t cp = 0;
    uint8_t need = 0;  // continuation bytes still to come
    uint8_t len = 0;   // bytes of the character being read (0 or 1: none pending)
  };
  // A set of stacks (tops of interned frames, sorted) and the partial character: one automaton state,
  // with its transitions filled in as bytes are tried.
  struct state {
    std::vector<int32_t> stacks;  // -1: a complete (empty) stack
    utf8_state u;
    bool can_end = false, must_end = false;
    uint32_t to_end = 0;  // the fewest bytes that complete it
  };

  int32_t push(uint32_t pos, int32_t parent) const;
  // seen: the frames expanded for this state already (one frame expands to the same stacks every time, and
  // a grammar of nested optional repetitions reaches the same frame along exponentially many paths).
  void expand(int32_t top, std::vector<int32_t>& out, std::unordered_set<int32_t>& seen) const;
  int32_t intern(std::vector<int32_t> stacks, utf8_state u) const;
  // The state after byte b from state s; -1 when nothing survives.
  int32_t step(int32_t s, uint8_t b) const;
  // Bounds the memory of the automaton: past a limit, keeps only the current state (re-interned).
  void trim() const;

  std::shared_ptr<const grammar> g_;
  // The automaton, built lazily (mutable: queries fill it in; a matcher is used by one thread at a time).
  std::vector<uint32_t> rest_min_;  // [element position]: the fewest bytes that finish its alternative from there
  mutable std::vector<frame> frames_;
  mutable std::vector<uint32_t> frame_min_;  // [frame]: the fewest bytes that empty the stack from it
  mutable std::unordered_map<uint64_t, int32_t> frame_ids_;  // (pos, parent) -> frame
  mutable std::vector<state> states_;
  mutable std::vector<int32_t> next_;  // [state * 256 + byte]: next state, dead (-1) or not computed yet (-2)
  mutable std::map<std::pair<std::vector<int32_t>, uint64_t>, int32_t> state_ids_;
  mutable int32_t cur_ = 0;
  mutable size_t step_frames_ = 0;  // frames_.size() when the step being computed began
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
// For grammars that embed JSON values: the rules json_schema_to_gbnf builds for a schema, its top rule
// named `name` and its helpers name-..., without the shared rules (json-value, json-string, ws, ...) that
// json_gbnf_rules() holds and that must be added once.
std::string json_schema_gbnf_rules(std::string_view schema_json, std::string_view name);
std::string_view json_gbnf_rules();
// A GBNF literal matching exactly these bytes (quoted; quotes, backslashes and control bytes escaped).
std::string gbnf_literal(std::string_view bytes);

}  // namespace troupe::llm
