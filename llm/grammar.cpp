// GBNF parsing (grammar::parse, grammar.h): the text to a grammar's rules and elements. The pushdown
// matcher and the character classes it tests are in grammar_matcher.cpp; JSON Schema compilation is in
// grammar_json.cpp.
#include "llm/grammar.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <functional>

namespace troupe::llm {

// ---- parsing ----

namespace {

struct pending_rule {
  std::vector<std::vector<grammar::element>> alts;
  bool defined = false;
  size_t line = 0;
};

bool is_name_char(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-' || c == '_';
}

}  // namespace

class grammar_parser {
 public:
  explicit grammar_parser(std::string_view src) : src_(src) {}

  std::shared_ptr<const grammar> run(std::string_view root) {
    skip_space(true);
    while (pos_ < src_.size()) {
      parse_rule();
      skip_space(true);
    }
    const auto it = ids_.find(std::string(root));
    if (it == ids_.end() || !rules_[it->second].defined) {
      throw grammar_error("grammar: no rule '" + std::string(root) + "' (the start rule) is defined");
    }
    for (size_t r = 0; r < rules_.size(); ++r) {
      if (!rules_[r].defined) {
        throw grammar_error("grammar: rule '" + names_[r] + "' is used (line " + std::to_string(rules_[r].line) +
                            ") but never defined");
      }
    }
    auto g = std::make_shared<grammar>();
    g->classes_ = std::move(classes_);
    g->root_ = it->second;
    for (const pending_rule& r : rules_) {
      std::vector<uint32_t> starts;
      for (size_t a = 0; a < r.alts.size(); ++a) {
        starts.push_back(static_cast<uint32_t>(g->elements_.size()));
        g->elements_.insert(g->elements_.end(), r.alts[a].begin(), r.alts[a].end());
        g->elements_.push_back({a + 1 == r.alts.size() ? grammar::kind::end : grammar::kind::alt, 0});
      }
      g->alts_.push_back(std::move(starts));
    }
    check_left_recursion(*g);
    return g;
  }

 private:
  using element = grammar::element;
  using seq = std::vector<element>;

  [[noreturn]] void fail(const std::string& what) const {
    size_t line = 1, col = 1;
    for (size_t i = 0; i < pos_ && i < src_.size(); ++i) {
      if (src_[i] == '\n') {
        ++line;
        col = 1;
      } else {
        ++col;
      }
    }
    throw grammar_error("grammar: " + what + " at line " + std::to_string(line) + ", column " + std::to_string(col));
  }

  bool at_end() const { return pos_ >= src_.size(); }
  char peek() const { return at_end() ? '\0' : src_[pos_]; }

  // Spaces, tabs and comments; newlines too when `newlines`.
  void skip_space(bool newlines) {
    while (!at_end()) {
      const char c = src_[pos_];
      if (c == ' ' || c == '\t' || c == '\r' || (newlines && c == '\n')) {
        if (c == '\n') ++line_;
        ++pos_;
      } else if (c == '#') {
        while (!at_end() && src_[pos_] != '\n') ++pos_;
      } else {
        break;
      }
    }
  }

  std::string parse_name() {
    const size_t start = pos_;
    while (!at_end() && is_name_char(src_[pos_])) ++pos_;
    if (pos_ == start) fail("expected a rule name");
    return std::string(src_.substr(start, pos_ - start));
  }

  uint32_t rule_id(const std::string& name) {
    const auto it = ids_.find(name);
    if (it != ids_.end()) return it->second;
    if (rules_.size() >= max_rules) fail("more than " + std::to_string(max_rules) + " rules (repetitions count too)");
    const auto id = static_cast<uint32_t>(rules_.size());
    ids_.emplace(name, id);
    names_.push_back(name);
    rules_.emplace_back();
    rules_.back().line = line_now();
    return id;
  }

  size_t line_now() const { return line_; }

  uint32_t new_rule(const std::string& base, std::vector<seq> alts) {
    std::string name;
    do {
      name = base + "-" + std::to_string(++generated_);
    } while (ids_.count(name) != 0);
    const uint32_t id = rule_id(name);
    rules_[id].alts = std::move(alts);
    rules_[id].defined = true;
    return id;
  }

  void parse_rule() {
    const std::string name = parse_name();
    skip_space(false);
    if (src_.substr(pos_, 3) != "::=") fail("expected '::=' after rule name '" + name + "'");
    pos_ += 3;
    const uint32_t id = rule_id(name);
    if (rules_[id].defined) fail("rule '" + name + "' is defined twice");
    current_ = name;
    std::vector<seq> alts = parse_alternatives(false);
    rules_[id].alts = std::move(alts);
    rules_[id].defined = true;
    if (!at_end() && peek() != '\n') fail("unexpected character '" + std::string(1, peek()) + "'");
  }

  std::vector<seq> parse_alternatives(bool nested) {
    std::vector<seq> alts;
    alts.push_back(parse_sequence(nested));
    for (;;) {
      if (!nested) {
        // A top-level rule may continue on a following line that starts with '|'.
        const size_t save = pos_, save_line = line_;
        skip_space(true);
        if (peek() != '|') {
          pos_ = save;
          line_ = save_line;
          skip_space(false);
          break;
        }
      }
      if (peek() != '|') break;
      ++pos_;
      alts.push_back(parse_sequence(nested));
    }
    return alts;
  }

  uint32_t decode_utf8() {
    const auto b0 = static_cast<uint8_t>(src_[pos_]);
    size_t n = b0 < 0x80 ? 1 : (b0 >> 5) == 6 ? 2 : (b0 >> 4) == 14 ? 3 : (b0 >> 3) == 30 ? 4 : 0;
    if (n == 0 || pos_ + n > src_.size()) fail("invalid UTF-8");
    uint32_t cp = n == 1 ? b0 : b0 & (0x7F >> n);
    for (size_t i = 1; i < n; ++i) {
      const auto b = static_cast<uint8_t>(src_[pos_ + i]);
      if ((b & 0xC0) != 0x80) fail("invalid UTF-8");
      cp = (cp << 6) | (b & 0x3F);
    }
    pos_ += n;
    return cp;
  }

  uint32_t parse_hex(size_t digits) {
    uint32_t v = 0;
    for (size_t i = 0; i < digits; ++i) {
      const char c = peek();
      int d = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
      if (d < 0) fail("expected " + std::to_string(digits) + " hex digits");
      v = v * 16 + static_cast<uint32_t>(d);
      ++pos_;
    }
    if (v > 0x10FFFF) fail("code point out of range");
    return v;
  }

  // One character of a literal or class, escapes decoded.
  uint32_t parse_char() {
    if (at_end()) fail("unexpected end of grammar");
    if (src_[pos_] != '\\') return decode_utf8();
    ++pos_;
    if (at_end()) fail("unexpected end after '\\'");
    const char c = src_[pos_++];
    switch (c) {
      case 'n': return '\n';
      case 't': return '\t';
      case 'r': return '\r';
      case '0': return 0;
      case 'x': return parse_hex(2);
      case 'u': return parse_hex(4);
      case 'U': return parse_hex(8);
      case '\\': case '"': case '\'': case '[': case ']': case '-': case '^': case '/': case '.': return static_cast<uint8_t>(c);
      default: --pos_; fail("unknown escape '\\" + std::string(1, c) + "'");
    }
  }

  uint32_t add_class(grammar::char_class c) {
    for (uint32_t cp = 0; cp < 128; ++cp) {
      bool in = false;
      for (const auto& [lo, hi] : c.ranges) in = in || (cp >= lo && cp <= hi);
      if (in != c.negated) c.ascii[cp >> 6] |= uint64_t{1} << (cp & 63);
    }
    classes_.push_back(std::move(c));
    return static_cast<uint32_t>(classes_.size() - 1);
  }

  element single(uint32_t cp) {
    grammar::char_class c;
    c.ranges.push_back({cp, cp});
    return {grammar::kind::chars, add_class(std::move(c))};
  }

  seq parse_sequence(bool nested) {
    seq out;
    for (;;) {
      skip_space(nested);
      if (at_end()) break;
      const char c = peek();
      seq item;
      if (c == '"') {
        ++pos_;
        while (peek() != '"') {
          if (at_end() || peek() == '\n') fail("unterminated literal");
          item.push_back(single(parse_char()));
        }
        ++pos_;
      } else if (c == '[') {
        ++pos_;
        grammar::char_class cls;
        if (peek() == '^') {
          cls.negated = true;
          ++pos_;
        }
        while (peek() != ']') {
          if (at_end() || peek() == '\n') fail("unterminated character class");
          const uint32_t lo = parse_char();
          uint32_t hi = lo;
          if (peek() == '-' && pos_ + 1 < src_.size() && src_[pos_ + 1] != ']') {
            ++pos_;
            hi = parse_char();
            if (hi < lo) fail("character range out of order");
          }
          cls.ranges.push_back({lo, hi});
        }
        ++pos_;
        item.push_back({grammar::kind::chars, add_class(std::move(cls))});
      } else if (c == '.') {
        ++pos_;
        grammar::char_class any;
        any.negated = true;  // [^] : every character
        item.push_back({grammar::kind::chars, add_class(std::move(any))});
      } else if (is_name_char(c)) {
        const size_t save = pos_;
        const std::string name = parse_name();
        // `name ::=` starts the next rule (a rule written right after another without a blank line).
        skip_space(false);
        if (src_.substr(pos_, 3) == "::=") {
          pos_ = save;
          break;
        }
        item.push_back({grammar::kind::rule_ref, rule_id(name)});
      } else if (c == '(') {
        ++pos_;
        if (++depth_ > max_depth) fail("groups nested deeper than " + std::to_string(max_depth));
        std::vector<seq> alts = parse_alternatives(true);
        --depth_;
        skip_space(true);
        if (peek() != ')') fail("expected ')'");
        ++pos_;
        item.push_back({grammar::kind::rule_ref, new_rule(current_, std::move(alts))});
      } else {
        break;  // '|', ')', newline, or something the caller reports
      }
      parse_postfix(item);
      n_elements_ += item.size();
      if (n_elements_ > max_elements) fail("more than " + std::to_string(max_elements) + " elements (repetitions count too)");
      out.insert(out.end(), item.begin(), item.end());
    }
    return out;
  }

  uint32_t parse_count() {
    skip_space(false);
    if (!(peek() >= '0' && peek() <= '9')) fail("expected a number");
    uint64_t v = 0;
    while (peek() >= '0' && peek() <= '9') {
      v = v * 10 + static_cast<uint64_t>(peek() - '0');
      if (v > max_repeat) fail("repetition count over " + std::to_string(max_repeat));
      ++pos_;
    }
    skip_space(false);
    return static_cast<uint32_t>(v);
  }

  void parse_postfix(seq& item) {
    const char c = peek();
    if (c != '*' && c != '+' && c != '?' && c != '{') return;
    ++pos_;
    uint32_t min = 0, max = UINT32_MAX;
    if (c == '+') min = 1;
    if (c == '?') max = 1;
    if (c == '{') {
      min = parse_count();
      max = min;
      if (peek() == ',') {
        ++pos_;
        skip_space(false);
        max = peek() == '}' ? UINT32_MAX : parse_count();
      }
      if (peek() != '}') fail("expected '}'");
      ++pos_;
      if (max < min) fail("repetition {m,n} with n < m");
    }
    // The item as one element (a rule of its own when it is longer).
    element x = item.size() == 1 ? item[0] : element{grammar::kind::rule_ref, new_rule(current_, {item})};
    seq out(min, x);
    if (max == UINT32_MAX) {
      // x* : star ::= x star | ""
      const uint32_t star = new_rule(current_, {});
      rules_[star].alts = {{x, {grammar::kind::rule_ref, star}}, {}};
      out.push_back({grammar::kind::rule_ref, star});
    } else if (max > min) {
      // Up to (max - min) more: opt_k ::= x opt_{k-1} | "" , built from the innermost out.
      uint32_t inner = new_rule(current_, {{x}, {}});
      for (uint32_t k = 1; k < max - min; ++k) inner = new_rule(current_, {{x, {grammar::kind::rule_ref, inner}}, {}});
      out.push_back({grammar::kind::rule_ref, inner});
    }
    item = std::move(out);
  }

  // A rule that can reach itself without consuming a character never terminates in a pushdown matcher.
  void check_left_recursion(const grammar& g) {
    const size_t n = g.n_rules();
    // nullable[r]: the rule can match the empty string (fixed point).
    std::vector<bool> nullable(n, false);
    for (bool changed = true; changed;) {
      changed = false;
      for (uint32_t r = 0; r < n; ++r) {
        if (nullable[r]) continue;
        for (uint32_t p : g.alternatives(r)) {
          bool all = true;
          for (; g.elements()[p].type != grammar::kind::end && g.elements()[p].type != grammar::kind::alt; ++p) {
            const element& e = g.elements()[p];
            if (e.type == grammar::kind::chars || !nullable[e.value]) {
              all = false;
              break;
            }
          }
          if (all) {
            nullable[r] = true;
            changed = true;
            break;
          }
        }
      }
    }
    // first[r]: rules r may enter before consuming a character.
    std::vector<std::vector<uint32_t>> first(n);
    for (uint32_t r = 0; r < n; ++r) {
      for (uint32_t p : g.alternatives(r)) {
        for (; g.elements()[p].type == grammar::kind::rule_ref; ++p) {
          first[r].push_back(g.elements()[p].value);
          if (!nullable[g.elements()[p].value]) break;
        }
      }
    }
    std::vector<uint8_t> mark(n, 0);  // 0 unseen, 1 on the path, 2 done
    // Depth-first with an explicit stack (rule chains may be long): (rule, next edge to follow).
    std::vector<std::pair<uint32_t, size_t>> path;
    for (uint32_t root = 0; root < n; ++root) {
      if (mark[root] != 0) continue;
      mark[root] = 1;
      path.push_back({root, 0});
      while (!path.empty()) {
        auto& [r, edge] = path.back();
        if (edge == first[r].size()) {
          mark[r] = 2;
          path.pop_back();
          continue;
        }
        const uint32_t s = first[r][edge++];
        if (mark[s] == 1) {
          std::string chain;
          bool on = false;
          for (const auto& [q, e] : path) {
            on = on || q == s;
            if (on) chain += names_[q] + " -> ";
          }
          throw grammar_error("grammar: rule '" + names_[s] + "' is left-recursive (" + chain + names_[s] +
                              "; a repetition of something that can be empty is too)");
        }
        if (mark[s] == 0) {
          mark[s] = 1;
          path.push_back({s, 0});
        }
      }
    }
  }

  // Bounds that keep a hostile grammar from exhausting the stack or memory.
  static constexpr uint32_t max_depth = 128, max_repeat = 10000;
  static constexpr size_t max_rules = 20000, max_elements = 200000;

  std::string_view src_;
  size_t pos_ = 0;
  size_t line_ = 1;
  uint32_t depth_ = 0;
  size_t n_elements_ = 0;
  std::map<std::string, uint32_t> ids_;
  std::vector<std::string> names_;
  std::vector<pending_rule> rules_;
  std::vector<grammar::char_class> classes_;
  std::string current_;
  uint32_t generated_ = 0;
};

std::shared_ptr<const grammar> grammar::parse(std::string_view gbnf, std::string_view root) {
  return grammar_parser(gbnf).run(root);
}

}  // namespace troupe::llm
