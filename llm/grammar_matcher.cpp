// The pushdown matcher of a parsed grammar (grammar_matcher, grammar.h): its states, one step per byte,
// and the allowed-token masks for sampling; with the character-class tests its steps make.
//
// Separate from grammar.cpp (GBNF parsing): matching runs per generated token and reads a finished
// grammar only. char_class::matches and may_match are here, in the matcher's translation unit, so its
// byte steps can inline them.
#include "llm/grammar.h"

#include <algorithm>
#include <utility>

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

// ---- matching ----

namespace {
constexpr int32_t complete = -1;

bool is_end(grammar::kind k) { return k == grammar::kind::end || k == grammar::kind::alt; }
}  // namespace

namespace {
constexpr int32_t dead = -1, unknown = -2;
constexpr size_t max_frames = size_t{1} << 22, max_states = size_t{1} << 16, max_step_frames = size_t{1} << 18;

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
  std::unordered_set<int32_t> seen;
  step_frames_ = frames_.size();
  for (uint32_t a : g_->alternatives(g_->root())) {
    if (is_end(el[a].type)) {
      stacks.push_back(complete);
    } else {
      expand(push(a, complete), stacks, seen);
    }
  }
  cur_ = intern(std::move(stacks), {});
}

int32_t grammar_matcher::push(uint32_t pos, int32_t parent) const {
  const uint64_t key = (uint64_t{pos} << 32) | static_cast<uint32_t>(parent);
  const auto [it, fresh] = frame_ids_.try_emplace(key, static_cast<int32_t>(frames_.size()));
  if (fresh) {
    // A step that needs this many new frames is a grammar whose ambiguity grows without bound (nested
    // optional repetitions), refused rather than filling memory.
    if (frames_.size() - step_frames_ >= max_step_frames) {
      frame_ids_.erase(it);
      throw grammar_error("grammar: one step needs more than " + std::to_string(max_step_frames) +
                          " parser frames (nested optional repetitions that match the same text in too many ways)");
    }
    frames_.push_back({pos, parent});
    const uint32_t up = parent == complete ? 0 : frame_min_[static_cast<size_t>(parent)];
    frame_min_.push_back(std::min(UINT32_MAX / 2, rest_min_[pos] + up));
  }
  return it->second;
}

// Rule references at the top are replaced by each alternative of the rule, until a character class is on
// top (or the stack is complete).
void grammar_matcher::expand(int32_t top, std::vector<int32_t>& out, std::unordered_set<int32_t>& seen) const {
  // A work list, not recursion: a chain of optional elements is as long as the grammar makes it.
  const auto& el = g_->elements();
  std::vector<int32_t> todo = {top};
  while (!todo.empty()) {
    const int32_t t = todo.back();
    todo.pop_back();
    if (!seen.insert(t).second) continue;
    if (t == complete) {
      out.push_back(complete);
      continue;
    }
    const frame f = frames_[static_cast<size_t>(t)];
    if (el[f.pos].type == grammar::kind::chars) {
      out.push_back(t);
      continue;
    }
    const int32_t base = is_end(el[f.pos + 1].type) ? f.parent : push(f.pos + 1, f.parent);
    for (uint32_t a : g_->alternatives(el[f.pos].value)) todo.push_back(is_end(el[a].type) ? base : push(a, base));
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
  std::unordered_set<int32_t> seen;
  step_frames_ = frames_.size();
  for (int32_t t : in) {
    if (t == complete) continue;
    const frame f = frames_[static_cast<size_t>(t)];
    if (!g_->class_at(el[f.pos].value).matches(cp)) continue;
    expand(is_end(el[f.pos + 1].type) ? f.parent : push(f.pos + 1, f.parent), out, seen);
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
