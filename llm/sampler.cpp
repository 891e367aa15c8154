#include "llm/sampler.h"

#include <algorithm>
#include <cmath>
#include <deque>
#include <limits>
#include <sstream>
#include <unordered_map>

namespace troupe::llm {
namespace {

bool higher(const token_candidate& a, const token_candidate& b) {
  return a.logit > b.logit || (a.logit == b.logit && a.id < b.id);
}

template <class T>
std::string str(T v) {
  std::ostringstream os;
  os << v;
  return os.str();
}

[[noreturn]] void bad_param(std::string_view name, std::string_view range, const std::string& got) {
  throw sampling_error("sampling: " + std::string(name) + " must be " + std::string(range) + ", got " + got);
}

void check_finite(std::string_view name, float v) {
  if (!std::isfinite(v)) bad_param(name, "a finite number", str(v));
}

// ---- stages ----

class penalties_stage final : public sampler_stage_i {
 public:
  penalties_stage(int32_t last_n, float repeat, float frequency, float presence)
      : last_n_(static_cast<size_t>(last_n)), repeat_(repeat), frequency_(frequency), presence_(presence) {}
  std::string_view name() const override { return "penalties"; }

  void apply(candidates& c) override {
    if (last_n_ == 0 || counts_.empty()) return;
    if (repeat_ == 1.0f && frequency_ == 0.0f && presence_ == 0.0f) return;
    for (token_candidate& t : c.data) {
      const auto it = counts_.find(t.id);
      if (it == counts_.end()) continue;
      const int n = it->second;
      t.logit = t.logit <= 0.0f ? t.logit * repeat_ : t.logit / repeat_;
      t.logit -= static_cast<float>(n) * frequency_ + presence_;
    }
    c.sorted = false;
  }

  void accept(token_id id) override {
    if (last_n_ == 0) return;
    history_.push_back(id);
    ++counts_[id];
    if (history_.size() > last_n_) {
      const token_id old = history_.front();
      history_.pop_front();
      if (--counts_[old] == 0) counts_.erase(old);
    }
  }

  void reset() override {
    history_.clear();
    counts_.clear();
  }

 private:
  size_t last_n_;
  float repeat_, frequency_, presence_;
  std::deque<token_id> history_;
  std::unordered_map<token_id, int> counts_;
};

class top_k_stage final : public sampler_stage_i {
 public:
  explicit top_k_stage(int32_t k) : k_(static_cast<size_t>(k)) {}
  std::string_view name() const override { return "top_k"; }
  void apply(candidates& c) override {
    const size_t k = (k_ == 0 || k_ > c.data.size()) ? c.data.size() : k_;
    if (!c.sorted) {
      std::partial_sort(c.data.begin(), c.data.begin() + static_cast<std::ptrdiff_t>(k), c.data.end(), higher);
    }
    c.data.resize(k);
    c.sorted = true;
  }

 private:
  size_t k_;
};

class top_p_stage final : public sampler_stage_i {
 public:
  top_p_stage(float p, size_t min_keep) : p_(p), min_keep_(min_keep) {}
  std::string_view name() const override { return "top_p"; }
  void apply(candidates& c) override {
    if (p_ >= 1.0f) return;
    c.softmax();
    double cum = 0.0;
    size_t keep = c.data.size();
    for (size_t i = 0; i < c.data.size(); ++i) {
      cum += c.data[i].p;
      if (cum >= p_ && i + 1 >= min_keep_) {
        keep = i + 1;
        break;
      }
    }
    c.data.resize(keep);
  }

 private:
  float p_;
  size_t min_keep_;
};

class min_p_stage final : public sampler_stage_i {
 public:
  min_p_stage(float p, size_t min_keep) : p_(p), min_keep_(min_keep) {}
  std::string_view name() const override { return "min_p"; }
  void apply(candidates& c) override {
    if (p_ <= 0.0f || c.data.empty()) return;
    c.sort();
    // p_i >= p * p_max  <=>  logit_i >= logit_max + log(p)
    const float min_logit = c.data.front().logit + std::log(p_);
    size_t keep = 0;
    while (keep < c.data.size() && c.data[keep].logit >= min_logit) ++keep;
    c.data.resize(std::min(c.data.size(), std::max(keep, min_keep_)));
  }

 private:
  float p_;
  size_t min_keep_;
};

class temperature_stage final : public sampler_stage_i {
 public:
  explicit temperature_stage(float t) : t_(t) {}
  std::string_view name() const override { return "temperature"; }
  void apply(candidates& c) override {
    if (c.data.empty()) return;
    if (t_ == 0.0f) {
      c.sort();
      const float max = c.data.front().logit;
      size_t keep = 1;
      while (keep < c.data.size() && c.data[keep].logit == max) ++keep;
      c.data.resize(keep);
      return;
    }
    for (token_candidate& t : c.data) t.logit /= t_;
  }

 private:
  float t_;
};

class greedy_stage final : public sampler_stage_i {
 public:
  std::string_view name() const override { return "greedy"; }
  void apply(candidates& c) override {
    if (c.data.empty()) return;
    c.selected = std::min_element(c.data.begin(), c.data.end(), higher)->id;
  }
};

class dist_stage final : public sampler_stage_i {
 public:
  explicit dist_stage(uint32_t seed) : seed_(seed), rng_(seed) {}
  std::string_view name() const override { return "dist"; }
  void apply(candidates& c) override {
    if (c.data.empty()) return;
    c.softmax();
    // A uniform draw in [0, 1) from the top 24 bits of one mt19937 output: the same on every platform.
    const double u = static_cast<double>(rng_() >> 8) * (1.0 / 16777216.0);
    double cum = 0.0;
    for (const token_candidate& t : c.data) {
      cum += t.p;
      if (u < cum) {
        c.selected = t.id;
        return;
      }
    }
    c.selected = c.data.back().id;  // rounding left u >= the sum
  }
  void reset() override { rng_.seed(seed_); }

 private:
  uint32_t seed_;
  std::mt19937 rng_;
};

}  // namespace

// ---- candidates ----

void candidates::assign(std::span<const float> logits) {
  if (logits.empty()) throw sampling_error("sampling: no logits (the vocabulary is empty)");
  if (logits.size() > static_cast<size_t>(std::numeric_limits<token_id>::max())) {
    throw sampling_error("sampling: too many logits");
  }
  data.resize(logits.size());
  for (size_t i = 0; i < logits.size(); ++i) {
    const float l = logits[i];
    if (std::isnan(l) || l == std::numeric_limits<float>::infinity()) {
      throw sampling_error("sampling: logit of token " + std::to_string(i) + " is " + str(l));
    }
    data[i] = {static_cast<token_id>(i), l, 0.0f};
  }
  sorted = false;
  selected = token_null;
}

void candidates::sort() {
  if (sorted) return;
  std::sort(data.begin(), data.end(), higher);
  sorted = true;
}

void candidates::softmax() {
  if (data.empty()) throw sampling_error("sampling: no candidates left");
  sort();
  const float max = data.front().logit;
  if (max == -std::numeric_limits<float>::infinity()) throw sampling_error("sampling: every logit is -inf");
  double sum = 0.0;
  for (token_candidate& t : data) {
    t.p = std::exp(t.logit - max);
    sum += t.p;
  }
  for (token_candidate& t : data) t.p = static_cast<float>(t.p / sum);
}

// ---- factories ----

std::unique_ptr<sampler_stage_i> make_penalties(int32_t last_n, float repeat, float frequency, float presence) {
  if (last_n < 0) bad_param("penalty_last_n", ">= 0", str(last_n));
  check_finite("repeat_penalty", repeat);
  if (repeat <= 0.0f) bad_param("repeat_penalty", "> 0", str(repeat));
  check_finite("frequency_penalty", frequency);
  check_finite("presence_penalty", presence);
  return std::make_unique<penalties_stage>(last_n, repeat, frequency, presence);
}

std::unique_ptr<sampler_stage_i> make_top_k(int32_t k) {
  if (k < 0) bad_param("top_k", ">= 0 (0: off)", str(k));
  return std::make_unique<top_k_stage>(k);
}

std::unique_ptr<sampler_stage_i> make_top_p(float p, size_t min_keep) {
  if (!(p > 0.0f && p <= 1.0f)) bad_param("top_p", "in (0, 1]", str(p));
  return std::make_unique<top_p_stage>(p, std::max<size_t>(min_keep, 1));
}

std::unique_ptr<sampler_stage_i> make_min_p(float p, size_t min_keep) {
  if (!(p >= 0.0f && p <= 1.0f)) bad_param("min_p", "in [0, 1]", str(p));
  return std::make_unique<min_p_stage>(p, std::max<size_t>(min_keep, 1));
}

std::unique_ptr<sampler_stage_i> make_temperature(float t) {
  if (!(t >= 0.0f) || !std::isfinite(t)) bad_param("temperature", ">= 0 and finite", str(t));
  return std::make_unique<temperature_stage>(t);
}

std::unique_ptr<sampler_stage_i> make_greedy() { return std::make_unique<greedy_stage>(); }

std::unique_ptr<sampler_stage_i> make_dist(uint32_t seed) { return std::make_unique<dist_stage>(seed); }

namespace {

class logit_bias_stage final : public sampler_stage_i {
 public:
  explicit logit_bias_stage(std::vector<token_bias> b)
      : biases_(std::move(b)),
        bans_(std::any_of(biases_.begin(), biases_.end(), [](const token_bias& x) { return x.bias <= -100.0f; })) {}
  std::string_view name() const override { return "logit_bias"; }
  void apply(candidates& c) override {
    // Candidates arrive as assign() left them (id i at index i) when this stage runs first; otherwise
    // search by id.
    for (const token_bias& b : biases_) {
      token_candidate* t = nullptr;
      const auto i = static_cast<size_t>(b.token);
      if (b.token >= 0 && i < c.data.size() && c.data[i].id == b.token) {
        t = &c.data[i];
      } else {
        for (token_candidate& x : c.data) {
          if (x.id == b.token) {
            t = &x;
            break;
          }
        }
      }
      if (t == nullptr) continue;
      t->logit = b.bias <= -100.0f ? -INFINITY : t->logit + b.bias;
    }
    if (!biases_.empty()) c.sorted = false;
    if (bans_ && std::none_of(c.data.begin(), c.data.end(), [](const token_candidate& x) { return x.logit > -INFINITY; })) {
      throw sampling_error("sampling: 'logit_bias' leaves no token to choose (every candidate is banned)");
    }
  }

 private:
  std::vector<token_bias> biases_;
  bool bans_;
};

}  // namespace

std::unique_ptr<sampler_stage_i> make_logit_bias(std::vector<token_bias> biases) {
  return std::make_unique<logit_bias_stage>(std::move(biases));
}

// ---- params and chain ----

void sampling_params::validate() const {
  if (!(temperature >= 0.0f) || !std::isfinite(temperature)) {
    bad_param("temperature", ">= 0 and finite (0: greedy)", str(temperature));
  }
  if (top_k < 0) bad_param("top_k", ">= 0 (0: off)", str(top_k));
  if (!(top_p > 0.0f && top_p <= 1.0f)) bad_param("top_p", "in (0, 1] (1: off)", str(top_p));
  if (!(min_p >= 0.0f && min_p <= 1.0f)) bad_param("min_p", "in [0, 1] (0: off)", str(min_p));
  if (penalty_last_n < 0) bad_param("penalty_last_n", ">= 0 (0: off)", str(penalty_last_n));
  check_finite("repeat_penalty", repeat_penalty);
  if (repeat_penalty <= 0.0f) bad_param("repeat_penalty", "> 0 (1: off)", str(repeat_penalty));
  check_finite("frequency_penalty", frequency_penalty);
  check_finite("presence_penalty", presence_penalty);
  for (const token_bias& b : logit_bias) {
    if (b.token < 0) bad_param("logit_bias", "token ids >= 0", str(b.token));
    if (!(b.bias >= -100.0f && b.bias <= 100.0f)) bad_param("logit_bias", "biases in [-100, 100]", str(b.bias));
  }
}

sampler_chain::sampler_chain(const sampling_params& p) {
  p.validate();
  if (!p.logit_bias.empty()) add(make_logit_bias(p.logit_bias));
  const bool penalties_on =
      p.penalty_last_n > 0 && (p.repeat_penalty != 1.0f || p.frequency_penalty != 0.0f || p.presence_penalty != 0.0f);
  if (penalties_on) add(make_penalties(p.penalty_last_n, p.repeat_penalty, p.frequency_penalty, p.presence_penalty));
  if (p.temperature == 0.0f) {
    add(make_greedy());
    return;
  }
  if (p.top_k > 0) add(make_top_k(p.top_k));
  if (p.top_p < 1.0f) add(make_top_p(p.top_p));
  if (p.min_p > 0.0f) add(make_min_p(p.min_p));
  add(make_temperature(p.temperature));
  add(make_dist(p.seed));
}

sampler_chain& sampler_chain::add(std::unique_ptr<sampler_stage_i> stage) {
  if (!stage) throw sampling_error("sampling: a null stage was added to a sampler chain");
  stages_.push_back(std::move(stage));
  return *this;
}

token_id sampler_chain::sample(std::span<const float> logits) {
  cur_.assign(logits);
  for (const auto& s : stages_) {
    s->apply(cur_);
    if (cur_.data.empty()) throw sampling_error("sampling: stage " + std::string(s->name()) + " left no candidates");
    if (cur_.selected != token_null) break;
  }
  if (cur_.selected == token_null) {
    cur_.selected = std::min_element(cur_.data.begin(), cur_.data.end(), higher)->id;
  }
  return cur_.selected;
}

void sampler_chain::accept(token_id id) {
  for (const auto& s : stages_) s->accept(id);
}

void sampler_chain::reset() {
  for (const auto& s : stages_) s->reset();
  cur_ = {};
}

std::string sampler_chain::describe() const {
  if (stages_.empty()) return "greedy";
  std::string out;
  for (const auto& s : stages_) {
    if (!out.empty()) out += " -> ";
    out += s->name();
  }
  return out;
}

}  // namespace troupe::llm
