#include "llm/sequence.h"

#include <algorithm>
#include <cmath>

#include "runtime/error.h"

namespace troupe::llm {

sequence::sequence(const vocab& v, std::span<const token_id> cached, std::span<const token_id> prompt,
                   const generate_params& p, uint32_t n_ctx)
    : vocab_(v), params_(p), n_ctx_(p.n_ctx > 0 ? std::min(n_ctx, static_cast<uint32_t>(p.n_ctx)) : n_ctx), chain_(p), detok_(v) {
  result_.n_prompt = static_cast<int32_t>(prompt.size());
  if (prompt.empty()) throw error("generate: empty prompt");
  if (p.logprobs < -1 || p.logprobs > generate_params::max_logprobs) {
    throw sampling_error("sampling: 'logprobs' must be -1 (off) or 0.." + std::to_string(generate_params::max_logprobs) +
                         ", got " + std::to_string(p.logprobs));
  }
  for (const token_bias& b : p.logit_bias) {
    if (b.token < 0 || b.token >= v.n_tokens()) {
      throw sampling_error("sampling: 'logit_bias' names token " + std::to_string(b.token) +
                           ", outside the vocabulary (0.." + std::to_string(v.n_tokens() - 1) + ")");
    }
  }
  if (!p.grammar.empty()) grammar_ = std::make_unique<grammar_matcher>(grammar::parse(p.grammar));
  grammar_on_ = p.grammar_triggers.empty();
  if (!p.preserved_tokens.empty()) {
    // The markers the vocabulary holds as single control tokens print as their text.
    std::vector<token_id> ids;
    for (const std::string& text : p.preserved_tokens) {
      const std::vector<token_id> t = v.tokenize(text, false, true);
      if (t.size() == 1 && v.token_to_piece(t[0]).empty() && !v.token_to_piece(t[0], true).empty()) ids.push_back(t[0]);
    }
    detok_.render_as_text(std::move(ids));
  }
  in_reasoning_ = p.reasoning_open && !p.reasoning_end.empty();
  reasoning_done_ = p.reasoning_end.empty() || (!p.reasoning_open && p.reasoning_start.empty());
  if (prompt.size() >= n_ctx_) {
    throw capacity_error("generate: the prompt has " + std::to_string(prompt.size()) + " tokens, the context holds " +
                         std::to_string(n_ctx_));
  }
  if (p.context_shift) {
    // As llama-server: n_keep prompt tokens (-1: all of them) and the BOS the vocabulary adds.
    const int32_t n = static_cast<int32_t>(prompt.size());
    const int32_t bos = v.add_bos() && prompt.front() == v.bos() ? 1 : 0;
    n_keep_ = p.n_keep < 0 ? n : static_cast<int32_t>(std::min<int64_t>(n, int64_t{p.n_keep} + bos));
  }
  // Reuse the cached prefix; always decode at least the last prompt token to get its logits.
  size_t common = 0;
  while (common < cached.size() && common < prompt.size() && cached[common] == prompt[common]) ++common;
  if (common == prompt.size()) --common;
  cached_.assign(cached.begin(), cached.begin() + static_cast<std::ptrdiff_t>(common));
  pending_.keep = static_cast<int32_t>(common);
  pending_.tokens.assign(prompt.begin() + static_cast<std::ptrdiff_t>(common), prompt.end());
  result_.n_prompt_decoded = static_cast<int32_t>(prompt.size() - common);
  for (token_id t : prompt) chain_.accept(t);
  result_.finish = "length";
  t0_ = std::chrono::steady_clock::now();
}

void sequence::reused(int32_t n) {
  if (n > 0) result_.n_prompt_decoded = std::max<int32_t>(1, result_.n_prompt_decoded - n);
  // Negative: the cache lost positions the sequence held (evicted while idle), decoded again.
  if (n < 0) result_.n_prompt_decoded = std::min(result_.n_prompt, result_.n_prompt_decoded - n);
}

sequence_output sequence::finish(std::string finish, bool flush) {
  sequence_output out;
  result_.finish = std::move(finish);
  if (flush) result_.text += detok_.flush();
  if (result_.finish != "cancelled" && result_.text.size() > held_) {
    out.piece = result_.text.substr(held_);
    held_ = result_.text.size();
  }
  const auto now = std::chrono::steady_clock::now();
  if (in_prompt_) {
    result_.prompt_seconds = std::chrono::duration<double>(now - t0_).count();
    t1_ = now;
  }
  result_.gen_seconds = std::chrono::duration<double>(now - t1_).count();
  // A shift the pending step asked for stays in cached_ (the caller made it when the step left: the decoder
  // actor on the step's arrival, the generator right after advance()), cancelled or not.
  pending_.tokens.clear();
  pending_.keep = static_cast<int32_t>(cached_.size());
  pending_.shift_at = 0;
  pending_.shift_n = 0;
  done_ = true;
  out.done = true;
  return out;
}

void sequence::cancel() {
  if (done_) return;
  finish("cancelled", false);
}

// log softmax over the candidates the chain left (their logits after bias, penalties, filters and
// temperature), for the sampled token and the params_.logprobs most likely.
token_logprob sequence::logprob_of(token_id t) const {
  const std::vector<token_candidate>& c = chain_.last().data;
  float max = -INFINITY;
  for (const token_candidate& x : c) max = std::max(max, x.logit);
  double sum = 0.0;
  for (const token_candidate& x : c) {
    if (x.logit > -INFINITY) sum += std::exp(static_cast<double>(x.logit - max));
  }
  const double lse = static_cast<double>(max) + std::log(sum);
  auto lp = [&](float logit) { return static_cast<float>(static_cast<double>(logit) - lse); };
  token_logprob out;
  out.token = t;
  out.logprob = -INFINITY;
  out.text = vocab_.token_to_piece(t);
  for (const token_candidate& x : c) {
    if (x.id == t) {
      out.logprob = lp(x.logit);
      break;
    }
  }
  const size_t n = std::min<size_t>(static_cast<size_t>(params_.logprobs), c.size());
  if (n == 0) return out;
  std::vector<const token_candidate*> order(c.size());
  for (size_t i = 0; i < c.size(); ++i) order[i] = &c[i];
  std::partial_sort(order.begin(), order.begin() + static_cast<std::ptrdiff_t>(n), order.end(),
                    [](const token_candidate* a, const token_candidate* b) {
                      return a->logit != b->logit ? a->logit > b->logit : a->id < b->id;
                    });
  for (size_t i = 0; i < n; ++i) {
    if (!(order[i]->logit > -INFINITY)) break;  // banned or filtered out: not a candidate
    out.top.push_back({order[i]->id, lp(order[i]->logit), vocab_.token_to_piece(order[i]->id)});
  }
  return out;
}

void sequence::watch_text(size_t before) {
  const std::string& text = result_.text;
  if (!reasoning_done_) {
    const std::string& end = params_.reasoning_end;
    if (in_reasoning_) {
      const size_t at = text.find(end, before >= end.size() ? before - end.size() + 1 : 0);
      if (at != std::string::npos) {
        in_reasoning_ = false;
        reasoning_done_ = true;
        free_from_ = at + end.size();
      }
    } else {
      const std::string& start = params_.reasoning_start;
      const size_t first = text.find_first_not_of(" \t\r\n");
      if (first != std::string::npos && text.compare(first, start.size(), start) == 0) {
        in_reasoning_ = true;
        n_reasoning_ = 0;
        before = first + start.size();  // the end marker may follow in the same text
        const size_t at = text.find(end, before);
        if (at != std::string::npos) {
          in_reasoning_ = false;
          reasoning_done_ = true;
          free_from_ = at + end.size();
        }
      } else if (first != std::string::npos && (text.size() - first >= start.size() ||
                                                start.compare(0, text.size() - first, text, first) != 0)) {
        reasoning_done_ = true;  // the answer did not begin with reasoning
      }
    }
  }
  if (grammar_ && !grammar_on_ && !in_reasoning_) {
    // A trigger after the reasoning block; it may end in this token's text but begin before it.
    size_t longest = 0;
    for (const std::string& s : params_.grammar_triggers) longest = std::max(longest, s.size());
    const size_t from = std::max(free_from_, before >= longest ? before - longest + 1 : 0);
    size_t at = std::string::npos;
    for (const std::string& s : params_.grammar_triggers) {
      if (s.empty()) continue;
      const size_t p = text.find(s, from);
      if (p != std::string::npos) at = std::min(at, p);
    }
    if (at != std::string::npos) {
      grammar_on_ = true;
      if (!grammar_->accept(std::string_view(text).substr(at))) {
        grammar_.reset();  // the text left the grammar's language already: the answer stays free
      }
    }
  }
}

sequence_output sequence::advance(std::span<const float> logits) {
  if (done_) throw error("sequence: advance after the answer is done");
  cached_.insert(cached_.end(), pending_.tokens.begin(), pending_.tokens.end());
  pending_.shift_n = 0;  // decoded with the step
  pending_.shift_at = 0;
  if (in_prompt_) {
    t1_ = std::chrono::steady_clock::now();
    result_.prompt_seconds = std::chrono::duration<double>(t1_ - t0_).count();
    in_prompt_ = false;
  }
  // Up to max_tokens samples, each decoded (the next pending step) after it is streamed.
  // A sampled token takes the next cell when it is decoded: none left ends the answer, or with context shift
  // the oldest half of what follows the kept tokens goes before the next step (applied at the end, once
  // the answer goes on).
  const int32_t shift_n = params_.context_shift && cached_.size() >= n_ctx_
                              ? (static_cast<int32_t>(cached_.size()) - n_keep_) / 2
                              : 0;
  if (n_sampled_ >= params_.max_tokens || (shift_n <= 0 && cached_.size() >= n_ctx_)) return finish("length", true);
  if (in_reasoning_ && params_.reasoning_budget >= 0 && !budget_spent_ && n_reasoning_ >= params_.reasoning_budget) {
    forced_ = vocab_.tokenize(params_.reasoning_end, false, true);
    std::reverse(forced_.begin(), forced_.end());
    budget_spent_ = true;
  }
  // A grammar constrains the answer outside the reasoning block (a tool call, a JSON answer after thinking).
  const bool constrained = grammar_ && grammar_on_ && !in_reasoning_ && forced_.empty();
  if (constrained) {
    // Ban what the grammar does not allow; the chain then samples among the rest as usual.
    // Tokens left for this answer: when they are about to run out before the grammar's sentence is
    // complete, only tokens that bring its end nearer are allowed (the answer closes instead of being cut).
    const int64_t room = params_.context_shift ? int64_t{params_.max_tokens}
                                               : static_cast<int64_t>(n_ctx_) - 1 - static_cast<int64_t>(cached_.size());
    const int64_t left = std::min<int64_t>(int64_t{params_.max_tokens} - n_sampled_, room);
    const bool closing = !grammar_->can_end() && left <= static_cast<int64_t>(grammar_->bytes_to_end()) + 4;
    if (grammar_->allowed_tokens(vocab_, allowed_, closing) == 0 && (!closing || grammar_->allowed_tokens(vocab_, allowed_) == 0)) {
      throw grammar_error("grammar: no token of the vocabulary can continue the answer after '" + result_.text + "'");
    }
    masked_.assign(logits.begin(), logits.end());
    for (size_t i = 0; i < masked_.size(); ++i) {
      if (i >= allowed_.size() || allowed_[i] == 0) masked_[i] = -INFINITY;
    }
    logits = masked_;
  }
  token_id t;
  const bool forced = !forced_.empty();
  if (forced) {
    t = forced_.back();  // the reasoning budget's end marker
    forced_.pop_back();
  } else {
    t = chain_.sample(logits);
  }
  chain_.accept(t);
  ++n_sampled_;
  if (vocab_.is_eog(t)) return finish("stop", true);
  if (constrained && !grammar_->accept(vocab_.token_to_piece(t))) {
    throw grammar_error("grammar: token " + std::to_string(t) + " was sampled outside the grammar");  // internal invariant
  }
  result_.tokens.push_back(t);
  if (params_.logprobs >= 0) result_.logprobs.push_back(logprob_of(t));
  const size_t before = result_.text.size();
  result_.text += detok_.push(t);
  if (in_reasoning_) ++n_reasoning_;
  watch_text(before);
  if (forced && forced_.empty() && in_reasoning_) {
    // The end marker is in (whatever text its tokens make): the block is over.
    in_reasoning_ = false;
    reasoning_done_ = true;
    free_from_ = result_.text.size();
  }
  // Stop strings: cut the text before the first match; hold back a tail that may begin one.
  bool stopped = false;
  size_t safe = result_.text.size();
  for (const std::string& s : params_.stop) {
    if (s.empty()) continue;
    const size_t at = result_.text.find(s);
    if (at != std::string::npos) {
      result_.text.resize(at);
      safe = std::min(safe, at);
      stopped = true;
      result_.stop_match = s;  // a later string found in the shortened text matched earlier
    } else {
      for (size_t k = std::min(s.size() - 1, result_.text.size()); k > 0; --k) {
        if (result_.text.compare(result_.text.size() - k, k, s, 0, k) == 0) {
          safe = std::min(safe, result_.text.size() - k);
          break;
        }
      }
    }
  }
  sequence_output out;
  out.token = t;
  if (safe > held_) {
    out.piece = result_.text.substr(held_, safe - held_);
    held_ = safe;
  }
  if (stopped) {
    sequence_output last = finish("stop", false);
    last.piece = out.piece + last.piece;
    last.token = t;
    return last;
  }
  if (grammar_ && grammar_on_ && !in_reasoning_ && grammar_->must_end()) {
    // The grammar takes nothing more: the answer is complete.
    sequence_output last = finish("stop", true);
    last.piece = out.piece + last.piece;
    last.token = t;
    return last;
  }
  pending_.shift_at = 0;
  pending_.shift_n = 0;
  if (shift_n > 0) {
    cached_.erase(cached_.begin() + n_keep_, cached_.begin() + n_keep_ + shift_n);
    pending_.shift_at = n_keep_;
    pending_.shift_n = shift_n;
    ++n_shifts_;
  }
  pending_.keep = static_cast<int32_t>(cached_.size());
  pending_.tokens.assign(1, t);
  return out;
}

}  // namespace troupe::llm
