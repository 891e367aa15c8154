#include "llm/prefix_index.h"

#include <algorithm>
#include <string>

#include "runtime/error.h"

namespace troupe::llm {

namespace {

size_t common_prefix(std::span<const token_id> a, std::span<const token_id> b) {
  const size_t n = std::min(a.size(), b.size());
  size_t i = 0;
  while (i < n && a[i] == b[i]) ++i;
  return i;
}

}  // namespace

prefix_index::prefix_index(uint32_t n_live, uint32_t n_total, uint32_t min_kept, uint64_t host_limit)
    : n_live_(n_live), n_total_(n_total), min_kept_(std::max<uint32_t>(1, min_kept)), host_limit_(host_limit), e_(n_total) {
  if (n_live == 0 || n_live > n_total) {
    throw error("prefix index: " + std::to_string(n_live) + " live sequences of " + std::to_string(n_total));
  }
}

void prefix_index::check(int32_t seq, const char* what) const {
  if (seq < 0 || static_cast<uint32_t>(seq) >= n_total_) {
    throw error(std::string("prefix index: ") + what + ": sequence " + std::to_string(seq) + " outside 0.." +
                std::to_string(n_total_ - 1));
  }
}

int32_t prefix_index::keep_slot(std::span<const token_id> tokens, int32_t except) {
  // Already in the pool: another sequence holds every one of these positions.
  for (uint32_t d = 0; d < n_total_; ++d) {
    const entry& o = e_[d];
    if (static_cast<int32_t>(d) == except || o.stable < tokens.size()) continue;
    if (common_prefix(std::span(o.tokens).first(o.stable), tokens) == tokens.size()) {
      e_[d].used = ++tick_;
      return -1;
    }
  }
  // A kept conversation these tokens continue (an earlier turn of the same one): its place.
  int32_t slot = -1;
  for (uint32_t r = n_live_; r < n_total_ && slot < 0; ++r) {
    const entry& o = e_[r];
    if (o.stable > 0 && common_prefix(std::span(o.tokens).first(o.stable), tokens) == o.stable) slot = static_cast<int32_t>(r);
  }
  // A free one.
  for (uint32_t r = n_live_; r < n_total_ && slot < 0; ++r) {
    if (e_[r].tokens.empty() && e_[r].pins == 0) slot = static_cast<int32_t>(r);
  }
  // The least recently used one that no share waits for (its conversation is dropped).
  if (slot < 0) {
    uint64_t oldest = UINT64_MAX;
    for (uint32_t r = n_live_; r < n_total_; ++r) {
      if (e_[r].pins == 0 && e_[r].used < oldest) {
        oldest = e_[r].used;
        slot = static_cast<int32_t>(r);
      }
    }
    if (slot >= 0 && !e_[static_cast<size_t>(slot)].tokens.empty()) ++st_.evictions;
  }
  return slot;
}

int32_t prefix_index::keep_decoded(int32_t seq) {
  const entry& s = e_[static_cast<size_t>(seq)];
  const std::span<const token_id> decoded = std::span(s.tokens).first(s.stable);
  const int32_t r = keep_slot(decoded, seq);
  if (r < 0) return -1;
  entry& kept = e_[static_cast<size_t>(r)];
  kept.tokens.assign(decoded.begin(), decoded.end());
  kept.stable = kept.tokens.size();
  kept.used = ++tick_;
  ++kept.pins;
  ++st_.kept_conversations;
  return r;
}

prefix_index::step_plan prefix_index::plan_step(int32_t seq, int32_t keep, std::span<const token_id> tokens) {
  std::lock_guard lock(mu_);
  check(seq, "step");
  if (!live(seq)) throw error("prefix index: a step of kept sequence " + std::to_string(seq));
  entry& s = e_[static_cast<size_t>(seq)];
  step_plan p;
  p.keep = keep;
  p.tokens.assign(tokens.begin(), tokens.end());
  if (keep < 0 || static_cast<size_t>(keep) > s.tokens.size() || tokens.empty()) {
    // The session holds more than this index knows (after a failed decode): never a donor until it forgets.
    s.tokens.clear();
    s.stable = 0;
    return p;
  }
  // Evicted while idle: the sequence holds nothing, and the whole prompt is planned from position 0.
  const bool lost = s.evicted;
  s.evicted = false;
  const size_t k = lost ? 0 : static_cast<size_t>(keep);
  std::vector<token_id> full(s.tokens.begin(), s.tokens.begin() + keep);
  full.insert(full.end(), tokens.begin(), tokens.end());
  // The longest decoded prefix of the whole prompt that another sequence holds; the last token is always
  // decoded (its logits are the step's answer). Pinned at once, so keeping what this step drops (below)
  // does not evict it.
  const size_t most = full.size() - 1;
  size_t best = k;
  int32_t donor = -1;
  for (uint32_t d = 0; d < n_total_; ++d) {
    const entry& o = e_[d];
    if (static_cast<int32_t>(d) == seq || o.stable <= best) continue;
    const size_t m = std::min(common_prefix(std::span(o.tokens).first(o.stable), full), most);
    if (m > best) {
      best = m;
      donor = static_cast<int32_t>(d);
    }
  }
  // Host memory, when it holds more of the prompt than the pool.
  saved* from_host = nullptr;
  for (saved& h : host_) {
    const size_t m = std::min(common_prefix(h.tokens, full), most);
    if (m > best) {
      best = m;
      from_host = &h;
    }
  }
  if (from_host != nullptr) {
    donor = -1;
    from_host->used = ++tick_;
    p.restore = from_host->bytes;
    p.restore_saved = static_cast<int32_t>(from_host->tokens.size());
  }
  if (donor >= 0) {
    entry& o = e_[static_cast<size_t>(donor)];
    o.used = ++tick_;
    ++o.pins;
  }
  // Positions this step drops: kept in the pool first, when worth it.
  if (k < s.stable && s.stable - k >= min_kept_) {
    p.keep_into = keep_decoded(seq);
    if (p.keep_into >= 0) p.kept = static_cast<int32_t>(s.stable);
  }
  if (lost) {  // decoded from position 0 unless shared or restored below; reused counts from the step's keep
    p.keep = 0;
    p.tokens = full;
    p.reused = -keep;
  }
  if (from_host != nullptr) {
    p.n = static_cast<int32_t>(best);
    p.keep = p.n;
    p.tokens.assign(full.begin() + static_cast<std::ptrdiff_t>(best), full.end());
    p.reused = static_cast<int32_t>(best) - keep;
    st_.restored_tokens += best - k;
    ++st_.reused_steps;
  }
  if (donor >= 0) {
    p.donor = donor;
    p.n = static_cast<int32_t>(best);
    p.keep = p.n;
    p.tokens.assign(full.begin() + static_cast<std::ptrdiff_t>(best), full.end());
    p.reused = static_cast<int32_t>(best) - keep;
    st_.reused_tokens += best - k;
    ++st_.reused_steps;
  }
  s.tokens = std::move(full);
  s.stable = donor >= 0 || from_host != nullptr ? best : std::min(s.stable, k);
  s.used = ++tick_;
  return p;
}

void prefix_index::step_done(int32_t seq, bool ok) {
  std::lock_guard lock(mu_);
  check(seq, "step_done");
  entry& s = e_[static_cast<size_t>(seq)];
  if (ok) {
    s.stable = s.tokens.size();
  } else {
    s.tokens.resize(s.stable);
  }
}

int32_t prefix_index::leader_for(int32_t seq, int32_t keep, std::span<const token_id> tokens, size_t min_gain) const {
  std::lock_guard lock(mu_);
  check(seq, "leader_for");
  const entry& s = e_[static_cast<size_t>(seq)];
  if (keep < 0 || static_cast<size_t>(keep) > s.tokens.size() || tokens.empty()) return -1;
  std::vector<token_id> full(s.tokens.begin(), s.tokens.begin() + keep);
  full.insert(full.end(), tokens.begin(), tokens.end());
  size_t decoded = static_cast<size_t>(keep);  // the most of the prompt held decoded anywhere now
  for (uint32_t d = 0; d < n_total_; ++d) {
    const entry& o = e_[d];
    if (static_cast<int32_t>(d) != seq && o.stable > decoded) {
      decoded = std::max(decoded, common_prefix(std::span(o.tokens).first(o.stable), full));
    }
  }
  for (const saved& h : host_) decoded = std::max(decoded, common_prefix(h.tokens, full));
  int32_t leader = -1;
  size_t most = decoded + min_gain;
  for (uint32_t d = 0; d < n_live_; ++d) {
    const entry& o = e_[d];
    // Nothing in progress (an idle sequence, or one evicted while idle: its tokens are what it held).
    if (static_cast<int32_t>(d) == seq || o.tokens.size() <= o.stable || o.evicted || o.idle) continue;
    const size_t m = std::min(common_prefix(o.tokens, full), full.size() - 1);
    if (m >= most) {
      most = m;
      leader = static_cast<int32_t>(d);
    }
  }
  return leader;
}

void prefix_index::retry_plain(int32_t seq) {
  std::lock_guard lock(mu_);
  check(seq, "retry_plain");
  e_[static_cast<size_t>(seq)].stable = 0;
}

std::pair<int32_t, int32_t> prefix_index::forget(int32_t seq) {
  std::lock_guard lock(mu_);
  check(seq, "forget");
  entry& s = e_[static_cast<size_t>(seq)];
  std::pair<int32_t, int32_t> out{-1, 0};
  if (live(seq) && s.stable >= min_kept_) {
    const int32_t r = keep_decoded(seq);
    if (r >= 0) out = {r, static_cast<int32_t>(s.stable)};
  }
  s.tokens.clear();
  s.stable = 0;
  s.evicted = false;
  s.idle = false;
  return out;
}

void prefix_index::shifted(int32_t seq, int32_t at, int32_t n) {
  std::lock_guard lock(mu_);
  check(seq, "shifted");
  entry& s = e_[static_cast<size_t>(seq)];
  if (at < 0 || n <= 0 || static_cast<size_t>(at) + static_cast<size_t>(n) > s.tokens.size()) {
    throw error("prefix index: sequence " + std::to_string(seq) + " shifts positions [" + std::to_string(at) + ", " +
                std::to_string(at + n) + ") of " + std::to_string(s.tokens.size()));
  }
  s.tokens.erase(s.tokens.begin() + at, s.tokens.begin() + at + n);
  // The moved positions are written again with the step: until it is done only those before `at` are known.
  s.stable = std::min(s.stable, static_cast<size_t>(at));
}

void prefix_index::shared(int32_t src, int32_t dst, int32_t n) {
  std::lock_guard lock(mu_);
  check(src, "share");
  check(dst, "share");
  const entry& from = e_[static_cast<size_t>(src)];
  entry& to = e_[static_cast<size_t>(dst)];
  to.used = ++tick_;
  to.idle = false;
  if (from.evicted && static_cast<size_t>(std::max(n, 0)) <= from.tokens.size()) {
    // The source's cells went (evicted while idle): dst gets nothing but knows the tokens its session now
    // believes it holds, so its next step is planned from position 0 (restored, shared or decoded).
    to.tokens.assign(from.tokens.begin(), from.tokens.begin() + n);
    to.stable = 0;
    to.evicted = true;
    return;
  }
  // Only what is decoded is known to be there: dst then has no step in progress (leader_for).
  const size_t m = std::min({static_cast<size_t>(std::max(n, 0)), from.tokens.size(), from.stable});
  to.tokens.assign(from.tokens.begin(), from.tokens.begin() + static_cast<std::ptrdiff_t>(m));
  to.stable = m;
  to.evicted = false;
}

void prefix_index::unpin(int32_t seq) {
  std::lock_guard lock(mu_);
  check(seq, "unpin");
  entry& s = e_[static_cast<size_t>(seq)];
  if (s.pins > 0) --s.pins;
}

int32_t prefix_index::evict_one(std::vector<token_id>* tokens) {
  std::lock_guard lock(mu_);
  return evict_locked(tokens);
}

int32_t prefix_index::evict_saving(const std::function<std::vector<uint8_t>(int32_t seq, int32_t n)>& save) {
  std::lock_guard lock(mu_);
  std::vector<token_id> tokens;
  const int32_t victim = evict_locked(host_limit_ > 0 ? &tokens : nullptr);
  if (victim >= 0 && !tokens.empty()) {
    const auto n = static_cast<int32_t>(tokens.size());
    store_locked(std::move(tokens), save(victim, n));
  }
  return victim;
}

int32_t prefix_index::evict_locked(std::vector<token_id>* tokens) {
  int32_t victim = -1;
  uint64_t oldest = UINT64_MAX;
  for (uint32_t r = n_live_; r < n_total_; ++r) {
    const entry& o = e_[r];
    if (!o.tokens.empty() && o.pins == 0 && o.used < oldest) {
      oldest = o.used;
      victim = static_cast<int32_t>(r);
    }
  }
  if (victim >= 0) {
    if (tokens != nullptr) *tokens = std::move(e_[static_cast<size_t>(victim)].tokens);
    e_[static_cast<size_t>(victim)] = entry{};
    ++st_.evictions;
    return victim;
  }
  // An idle session's sequence: its tokens stay known, its cells go.
  for (uint32_t r = 0; r < n_live_; ++r) {
    const entry& o = e_[r];
    if (o.idle && !o.evicted && o.stable > 0 && o.stable == o.tokens.size() && o.pins == 0 && o.used < oldest) {
      oldest = o.used;
      victim = static_cast<int32_t>(r);
    }
  }
  if (victim >= 0) {
    entry& o = e_[static_cast<size_t>(victim)];
    if (tokens != nullptr) tokens->assign(o.tokens.begin(), o.tokens.begin() + static_cast<std::ptrdiff_t>(o.stable));
    o.evicted = true;
    o.stable = 0;
    ++st_.idle_evictions;
  }
  return victim;
}

void prefix_index::set_idle(int32_t seq, bool idle) {
  std::lock_guard lock(mu_);
  check(seq, "set_idle");
  e_[static_cast<size_t>(seq)].idle = idle;
}

void prefix_index::store(std::vector<token_id> tokens, std::vector<uint8_t> bytes) {
  std::lock_guard lock(mu_);
  store_locked(std::move(tokens), std::move(bytes));
}

void prefix_index::store_locked(std::vector<token_id> tokens, std::vector<uint8_t> bytes) {
  if (host_limit_ == 0 || tokens.empty() || bytes.empty() || bytes.size() > host_limit_) return;
  // Already there as the start of a longer one: nothing new.
  for (const saved& h : host_) {
    if (h.tokens.size() >= tokens.size() && common_prefix(h.tokens, tokens) == tokens.size()) return;
  }
  // Earlier turns of this conversation: replaced by it.
  for (size_t i = host_.size(); i-- > 0;) {
    if (common_prefix(host_[i].tokens, tokens) == host_[i].tokens.size()) {
      host_bytes_ -= host_[i].bytes->size();
      host_.erase(host_.begin() + static_cast<std::ptrdiff_t>(i));
    }
  }
  while (!host_.empty() && host_bytes_ + bytes.size() > host_limit_) {
    const auto oldest = std::min_element(host_.begin(), host_.end(), [](const saved& a, const saved& b) { return a.used < b.used; });
    host_bytes_ -= oldest->bytes->size();
    host_.erase(oldest);
  }
  host_bytes_ += bytes.size();
  host_.push_back({std::move(tokens), std::make_shared<const std::vector<uint8_t>>(std::move(bytes)), ++tick_});
  ++st_.saved_conversations;
}

void prefix_index::clear() {
  std::lock_guard lock(mu_);
  for (entry& o : e_) o = entry{};
  host_.clear();
  host_bytes_ = 0;
}

prefix_index_stats prefix_index::stats() const {
  std::lock_guard lock(mu_);
  prefix_index_stats s = st_;
  s.kept_now = 0;
  s.kept_tokens_now = 0;
  for (uint32_t r = n_live_; r < n_total_; ++r) {
    if (e_[r].tokens.empty()) continue;
    ++s.kept_now;
    s.kept_tokens_now += e_[r].tokens.size();
  }
  s.host_entries = static_cast<uint32_t>(host_.size());
  s.host_bytes = host_bytes_;
  return s;
}

std::vector<token_id> prefix_index::tokens_of(int32_t seq) const {
  std::lock_guard lock(mu_);
  check(seq, "tokens_of");
  return e_[static_cast<size_t>(seq)].tokens;
}

}  // namespace troupe::llm
