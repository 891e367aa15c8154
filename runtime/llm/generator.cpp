#include "runtime/llm/generator.h"

#include <algorithm>
#include <chrono>

#include "runtime/error.h"

namespace troupe::llm {

generator::generator(llm_context& ctx, const vocab& v, int32_t seq) : ctx_(ctx), vocab_(v), seq_(seq) {}

void generator::reset() {
  ctx_.kv().seq_rm(seq_, -1, -1);
  cached_.clear();
}

void generator::decode_tokens(std::span<const token_id> tokens, bool last_logits) {
  const size_t step = ctx_.params().n_batch;
  batch b;
  for (size_t begin = 0; begin < tokens.size(); begin += step) {
    const size_t end = std::min(tokens.size(), begin + step);
    b.clear();
    for (size_t i = begin; i < end; ++i) {
      b.add(tokens[i], static_cast<int32_t>(cached_.size() + (i - begin)), seq_, last_logits && i + 1 == tokens.size());
    }
    ctx_.decode(b);
    cached_.insert(cached_.end(), tokens.begin() + static_cast<std::ptrdiff_t>(begin), tokens.begin() + static_cast<std::ptrdiff_t>(end));
  }
}

generate_result generator::generate(std::span<const token_id> prompt, const generate_params& p, const piece_fn& on_piece) {
  p.sampling.validate();
  generate_result r;
  r.n_prompt = static_cast<int32_t>(prompt.size());
  if (prompt.empty()) throw error("generate: empty prompt");
  const uint32_t n_ctx = ctx_.params().n_ctx;
  if (prompt.size() >= n_ctx) {
    throw capacity_error("generate: the prompt has " + std::to_string(prompt.size()) + " tokens, the context holds " +
                         std::to_string(n_ctx));
  }

  // Reuse the cached prefix; always decode at least the last prompt token to get its logits.
  size_t common = 0;
  while (common < cached_.size() && common < prompt.size() && cached_[common] == prompt[common]) ++common;
  if (common == prompt.size()) --common;
  if (common < cached_.size()) {
    ctx_.kv().seq_rm(seq_, static_cast<int32_t>(common), -1);
    cached_.resize(common);
  }
  const auto t0 = std::chrono::steady_clock::now();
  decode_tokens(prompt.subspan(common), true);
  r.n_prompt_decoded = static_cast<int32_t>(prompt.size() - common);
  const auto t1 = std::chrono::steady_clock::now();
  r.prompt_seconds = std::chrono::duration<double>(t1 - t0).count();

  sampler_chain chain(p.sampling);
  for (token_id t : prompt) chain.accept(t);
  detokenizer detok(vocab_);
  size_t held = 0;  // bytes of r.text not yet given to on_piece (a possible stop-string prefix)
  bool stop_string = false;
  r.finish = "length";
  for (int32_t i = 0; i < p.max_tokens; ++i) {
    if (cached_.size() + 1 >= n_ctx) break;  // the context is full
    const token_id t = chain.sample(ctx_.logits(0));
    chain.accept(t);
    if (vocab_.is_eog(t)) {
      r.finish = "stop";
      break;
    }
    r.tokens.push_back(t);
    r.text += detok.push(t);
    // Stop strings: cut the text before the first match; hold back a tail that may begin one.
    bool stopped = false;
    size_t safe = r.text.size();
    for (const std::string& s : p.stop) {
      if (s.empty()) continue;
      const size_t at = r.text.find(s);
      if (at != std::string::npos) {
        r.text.resize(at);
        safe = std::min(safe, at);
        stopped = true;
      } else {
        for (size_t k = std::min(s.size() - 1, r.text.size()); k > 0; --k) {
          if (r.text.compare(r.text.size() - k, k, s, 0, k) == 0) {
            safe = std::min(safe, r.text.size() - k);
            break;
          }
        }
      }
    }
    if (on_piece && safe > held) {
      if (!on_piece(std::string_view(r.text).substr(held, safe - held), t)) {
        r.finish = "cancelled";
        held = safe;
        break;
      }
      held = safe;
    }
    if (stopped) {
      r.finish = "stop";
      stop_string = true;
      break;
    }
    decode_tokens(std::span<const token_id>(&t, 1), true);
  }
  if (!stop_string) r.text += detok.flush();
  if (on_piece && r.finish != "cancelled" && r.text.size() > held) on_piece(std::string_view(r.text).substr(held), token_null);
  r.gen_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t1).count();
  return r;
}

}  // namespace troupe::llm
