// GBNF parsing and the pushdown matcher (grammar.h). JSON Schema compilation: grammar_json.cpp.
#include "runtime/llm/grammar.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <functional>

namespace troupe::llm {

// ---- character classes ----

bool grammar::char_class::matches(uint32_t cp) const {
  if (cp < 128) return (ascii[cp >> 6] >> (cp & 63)) & 1;
  bool in = false;
  for (const auto& [lo, hi] : ranges) {
    if (cp >= lo && cp <= hi) {
      in = true;
      break;
    }
  }
  return in != negated;
}

bool grammar::char_class::may_match(uint32_t lo, uint32_t hi) const {
  if (!negated) {
    for (const auto& [a, b] : ranges) {
      if (a <= hi && b >= lo) return true;
    }
    return false;
  }
  // Negated: some code point of [lo, hi] lies outside every range. Walk the ranges covering lo onwards.
  std::vector<std::pair<uint32_t, uint32_t>> r = ranges;
  std::sort(r.begin(), r.end());
  uint32_t next = lo;  // the lowest code point not yet known to be covered
  for (const auto& [a, b] : r) {
    if (a > next) break;
    if (b >= next) {
      if (b >= hi) return false;
      next = b + 1;
    }
  }
  return next <= hi;
}

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
    g->names_ = names_;
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

// ---- matching ----

namespace {
constexpr int32_t complete = -1;

bool is_end(grammar::kind k) { return k == grammar::kind::end || k == grammar::kind::alt; }
}  // namespace

namespace {
constexpr int32_t dead = -1, unknown = -2;
constexpr size_t max_frames = size_t{1} << 22, max_states = size_t{1} << 16;

uint64_t utf8_key(uint32_t cp, uint8_t need, uint8_t len) {
  return (uint64_t{cp} << 16) | (uint64_t{need} << 8) | len;
}
}  // namespace

grammar_matcher::grammar_matcher(std::shared_ptr<const grammar> g) : g_(std::move(g)) {
  if (!g_) throw grammar_error("grammar: no grammar given to the matcher");
  const auto& el = g_->elements();
  // The fewest bytes of each rule and of each alternative's rest (a fixed point; a character is >= 1 byte).
  constexpr uint32_t inf = UINT32_MAX / 4;
  std::vector<uint32_t> rule_min(g_->n_rules(), inf);
  rest_min_.assign(el.size() + 1, 0);
  for (bool changed = true; changed;) {
    changed = false;
    for (size_t p = el.size(); p-- > 0;) {
      uint32_t v = 0;
      if (!is_end(el[p].type)) {
        const uint32_t e = el[p].type == grammar::kind::chars ? 1 : rule_min[el[p].value];
        v = std::min(inf, e + rest_min_[p + 1]);
      }
      if (v != rest_min_[p]) {
        rest_min_[p] = v;
        changed = true;
      }
    }
    for (uint32_t r = 0; r < g_->n_rules(); ++r) {
      uint32_t best = inf;
      for (uint32_t a : g_->alternatives(r)) best = std::min(best, rest_min_[a]);
      if (best != rule_min[r]) {
        rule_min[r] = best;
        changed = true;
      }
    }
  }
  std::vector<int32_t> stacks;
  for (uint32_t a : g_->alternatives(g_->root())) {
    if (is_end(el[a].type)) {
      stacks.push_back(complete);
    } else {
      expand(push(a, complete), stacks);
    }
  }
  cur_ = intern(std::move(stacks), {});
}

int32_t grammar_matcher::push(uint32_t pos, int32_t parent) const {
  const uint64_t key = (uint64_t{pos} << 32) | static_cast<uint32_t>(parent);
  const auto [it, fresh] = frame_ids_.try_emplace(key, static_cast<int32_t>(frames_.size()));
  if (fresh) {
    frames_.push_back({pos, parent});
    const uint32_t up = parent == complete ? 0 : frame_min_[static_cast<size_t>(parent)];
    frame_min_.push_back(std::min(UINT32_MAX / 2, rest_min_[pos] + up));
  }
  return it->second;
}

// Rule references at the top are replaced by each alternative of the rule, until a character class is on
// top (or the stack is complete).
void grammar_matcher::expand(int32_t top, std::vector<int32_t>& out) const {
  if (top == complete) {
    out.push_back(complete);
    return;
  }
  const auto& el = g_->elements();
  const frame f = frames_[static_cast<size_t>(top)];
  if (el[f.pos].type == grammar::kind::chars) {
    out.push_back(top);
    return;
  }
  const int32_t base = is_end(el[f.pos + 1].type) ? f.parent : push(f.pos + 1, f.parent);
  for (uint32_t a : g_->alternatives(el[f.pos].value)) {
    if (is_end(el[a].type)) {
      expand(base, out);
    } else {
      expand(push(a, base), out);
    }
  }
}

int32_t grammar_matcher::intern(std::vector<int32_t> stacks, utf8_state u) const {
  std::sort(stacks.begin(), stacks.end());
  stacks.erase(std::unique(stacks.begin(), stacks.end()), stacks.end());
  auto key = std::make_pair(stacks, utf8_key(u.cp, u.need, u.len));
  const auto it = state_ids_.find(key);
  if (it != state_ids_.end()) return it->second;
  state st;
  st.u = u;
  st.can_end = u.need == 0 && !stacks.empty() && stacks.front() == complete;
  st.must_end = u.need == 0 && !stacks.empty() && stacks.back() == complete;
  st.to_end = UINT32_MAX;
  for (const int32_t t : stacks) st.to_end = std::min(st.to_end, t == complete ? 0u : frame_min_[static_cast<size_t>(t)]);
  if (u.need > 0) st.to_end += u.need - 1u;  // the pending character counted as one byte, needs `need` more
  st.stacks = std::move(stacks);
  states_.push_back(std::move(st));
  next_.resize(states_.size() * 256, unknown);
  const auto id = static_cast<int32_t>(states_.size() - 1);
  state_ids_.emplace(std::move(key), id);
  return id;
}

int32_t grammar_matcher::step(int32_t s, uint8_t b) const {
  {
    const int32_t known = next_[static_cast<size_t>(s) * 256 + b];
    if (known != unknown) return known;
  }
  utf8_state u = states_[static_cast<size_t>(s)].u;
  const auto result = [&](int32_t next) {
    next_[static_cast<size_t>(s) * 256 + b] = next;
    return next;
  };
  if (u.need == 0) {
    if (b < 0x80) {
      u = {b, 0, 0};
    } else if ((b & 0xE0) == 0xC0 && b >= 0xC2) {
      u = {static_cast<uint32_t>(b & 0x1F), 1, 2};
    } else if ((b & 0xF0) == 0xE0) {
      u = {static_cast<uint32_t>(b & 0x0F), 2, 3};
    } else if ((b & 0xF8) == 0xF0 && b <= 0xF4) {
      u = {static_cast<uint32_t>(b & 0x07), 3, 4};
    } else {
      return result(dead);  // a continuation byte or an invalid lead byte
    }
  } else {
    if ((b & 0xC0) != 0x80) return result(dead);
    u.cp = (u.cp << 6) | (b & 0x3F);
    --u.need;
  }
  const auto& el = g_->elements();
  const std::vector<int32_t> in = states_[static_cast<size_t>(s)].stacks;  // a copy: interning may move states_
  std::vector<int32_t> out;
  if (u.len > 1) {
    // The code points this sequence can still become, without overlong forms and surrogates.
    static constexpr uint32_t min_of[5] = {0, 0, 0x80, 0x800, 0x10000};
    const uint32_t shift = 6u * u.need;
    const uint32_t lo = std::max(u.cp << shift, min_of[u.len]);
    const uint32_t hi = std::min((u.cp << shift) | ((1u << shift) - 1), 0x10FFFFu);
    if (lo > hi || (lo >= 0xD800 && hi <= 0xDFFF)) return result(dead);
    if (u.need > 0) {
      // Part of a character: keep the stacks some completion of it can match.
      for (int32_t t : in) {
        if (t == complete) continue;
        if (g_->class_at(el[frames_[static_cast<size_t>(t)].pos].value).may_match(lo, hi)) out.push_back(t);
      }
      return result(out.empty() ? dead : intern(std::move(out), u));
    }
  }
  const uint32_t cp = u.cp;
  for (int32_t t : in) {
    if (t == complete) continue;
    const frame f = frames_[static_cast<size_t>(t)];
    if (!g_->class_at(el[f.pos].value).matches(cp)) continue;
    expand(is_end(el[f.pos + 1].type) ? f.parent : push(f.pos + 1, f.parent), out);
  }
  return result(out.empty() ? dead : intern(std::move(out), {}));
}

void grammar_matcher::trim() const {
  if (frames_.size() <= max_frames && states_.size() <= max_states) return;
  // Copy the current state's stacks into fresh tables; everything else is dropped.
  const state cur = states_[static_cast<size_t>(cur_)];
  std::vector<frame> old = std::move(frames_);
  frames_.clear();
  frame_min_.clear();
  frame_ids_.clear();
  states_.clear();
  state_ids_.clear();
  next_.clear();
  // Iterative: a stack may be as deep as the text is long (nested brackets).
  const auto copy = [&](int32_t t) -> int32_t {
    std::vector<uint32_t> chain;
    for (; t != complete; t = old[static_cast<size_t>(t)].parent) chain.push_back(old[static_cast<size_t>(t)].pos);
    int32_t top = complete;
    for (auto it = chain.rbegin(); it != chain.rend(); ++it) top = push(*it, top);
    return top;
  };
  std::vector<int32_t> stacks;
  for (int32_t t : cur.stacks) stacks.push_back(copy(t));
  cur_ = intern(std::move(stacks), cur.u);
}

bool grammar_matcher::accepts(std::string_view bytes) const {
  int32_t s = cur_;
  for (const char c : bytes) {
    s = step(s, static_cast<uint8_t>(c));
    if (s == dead) return false;
  }
  return true;
}

bool grammar_matcher::accept(std::string_view bytes) {
  trim();
  int32_t s = cur_;
  for (const char c : bytes) {
    s = step(s, static_cast<uint8_t>(c));
    if (s == dead) return false;
  }
  cur_ = s;
  return true;
}

bool grammar_matcher::can_end() const { return states_[static_cast<size_t>(cur_)].can_end; }
bool grammar_matcher::must_end() const { return states_[static_cast<size_t>(cur_)].must_end; }
uint32_t grammar_matcher::bytes_to_end() const { return states_[static_cast<size_t>(cur_)].to_end; }
size_t grammar_matcher::n_stacks() const { return states_[static_cast<size_t>(cur_)].stacks.size(); }

size_t grammar_matcher::allowed_tokens(const vocab& v, std::vector<uint8_t>& allowed, bool closing) const {
  trim();
  allowed.assign(static_cast<size_t>(v.n_tokens()), 0);
  size_t n = 0;
  if (can_end()) {
    for (token_id t : v.eog_tokens()) {
      if (t >= 0 && t < v.n_tokens() && !allowed[static_cast<size_t>(t)]) {
        allowed[static_cast<size_t>(t)] = 1;
        ++n;
      }
    }
  }
  if (must_end()) return n;
  const vocab::piece_index& sp = v.sorted_pieces();
  // level[d]: the state after the first d bytes of the current piece, valid for d <= `valid`.
  std::vector<int32_t> level(1, cur_);
  size_t valid = 0;
  size_t dead_depth = SIZE_MAX;  // a prefix of this length of the previous piece matched nothing
  for (size_t i = 0; i < sp.order.size(); ++i) {
    const size_t common = sp.lcp[i];
    if (dead_depth != SIZE_MAX && common >= dead_depth) continue;  // under a dead prefix: dead too
    dead_depth = SIZE_MAX;
    const std::string_view piece = sp.text[i];
    valid = std::min(valid, common);
    if (level.size() < piece.size() + 1) level.resize(piece.size() + 1);
    bool ok = true;
    for (size_t d = valid; d < piece.size(); ++d) {
      const int32_t next = step(level[d], static_cast<uint8_t>(piece[d]));
      if (next == dead) {
        dead_depth = d + 1;
        valid = d;
        ok = false;
        break;
      }
      level[d + 1] = next;
      valid = d + 1;
    }
    if (ok && closing && states_[static_cast<size_t>(level[piece.size()])].to_end >= states_[static_cast<size_t>(cur_)].to_end) {
      ok = false;  // no nearer to the end
    }
    if (ok) {
      allowed[static_cast<size_t>(sp.order[i])] = 1;
      ++n;
    }
  }
  return n;
}

}  // namespace troupe::llm
