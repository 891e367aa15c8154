#include "llm/batch_decoder.h"

#include <algorithm>
#include <memory>
#include <string>

#include "runtime/error.h"

namespace troupe::llm {

batch_decoder::batch_decoder(llm_context& ctx) : ctx_(ctx) {}

void batch_decoder::forget(int32_t seq) { ctx_.kv().seq_rm(seq, -1, -1); }

batch_decoder_stats batch_decoder::stats() const {
  std::lock_guard lock(mu_);
  return stats_;
}

void batch_decoder::count(std::span<const seq_step> steps, uint64_t n_decodes) {
  std::lock_guard lock(mu_);
  stats_.n_decodes += n_decodes;
  for (const seq_step& s : steps) stats_.n_tokens += s.tokens.size();
  stats_.n_steps += steps.size();
  stats_.max_steps = std::max(stats_.max_steps, static_cast<uint32_t>(steps.size()));
}

void batch_decoder::check(std::span<const seq_step> steps) const {
  const uint32_t n_seq_max = ctx_.params().n_seq_max;
  std::vector<bool> seen(n_seq_max, false);
  for (size_t i = 0; i < steps.size(); ++i) {
    const seq_step& s = steps[i];
    const std::string at = "batch decoder: step " + std::to_string(i);
    if (s.seq < 0 || static_cast<uint32_t>(s.seq) >= n_seq_max) {
      throw error(at + ": sequence " + std::to_string(s.seq) + " outside 0.." + std::to_string(n_seq_max - 1));
    }
    if (seen[static_cast<size_t>(s.seq)]) throw error(at + ": a second step of sequence " + std::to_string(s.seq));
    seen[static_cast<size_t>(s.seq)] = true;
    if (s.tokens.empty()) throw error(at + ": no tokens");
    int32_t held = ctx_.kv().seq_pos_max(s.seq) + 1;
    if (s.shift_n != 0) {
      if (s.shift_n < 0 || s.shift_at < 0 || s.shift_at + s.shift_n > held) {
        throw error(at + ": shifts positions [" + std::to_string(s.shift_at) + ", " + std::to_string(s.shift_at + s.shift_n) +
                    ") of sequence " + std::to_string(s.seq) + ", which holds " + std::to_string(held));
      }
      held -= s.shift_n;
    }
    if (s.keep < 0) throw error(at + ": keeps " + std::to_string(s.keep) + " positions");
    if (s.keep > held) {
      throw missing_positions_error(at + ": keeps " + std::to_string(s.keep) + " positions of sequence " +
                                    std::to_string(s.seq) + ", which holds " + std::to_string(held));
    }
  }
}

void batch_decoder::begin(std::span<const seq_step> steps) {
  check(steps);
  kv_cache& kv = ctx_.kv();
  for (const seq_step& s : steps) {
    if (s.shift_n > 0) ctx_.shift(s.seq, s.shift_at, s.shift_n, [this](size_t n) { make_room(n); });
  }
  for (const seq_step& s : steps) kv.seq_rm(s.seq, s.keep, -1);
  size_t needed = 0;
  for (const seq_step& s : steps) needed += s.tokens.size();
  make_room(needed);
}

void batch_decoder::make_room(size_t needed) {
  if (!evict_) return;
  kv_cache& kv = ctx_.kv();
  while (kv.size() - kv.used_cells() < needed) {
    const int32_t victim = evict_(kv);
    if (victim < 0) break;
    kv.seq_rm(victim, -1, -1);
  }
}

void batch_decoder::set_evictor(std::function<int32_t(kv_cache&)> evict) { evict_ = std::move(evict); }

void batch_decoder::submit_restore(int32_t seq, std::shared_ptr<const std::vector<uint8_t>> saved, int32_t n_saved,
                                   int32_t n, std::function<void()> failed) {
  ctx_.submit(
      [this, seq, saved = std::move(saved), n_saved, n, failed = std::move(failed)] {
        forget(seq);
        try {
          make_room(static_cast<size_t>(n));
          ctx_.kv().restore(seq, *saved, n_saved, n);
        } catch (const std::exception&) {
          // No room: seq stays empty and its step fails for keeping positions it does not hold.
          if (failed) failed();
        }
      },
      {}, {});
}

std::vector<std::vector<float>> batch_decoder::decode(std::span<const seq_step> steps) {
  begin(steps);

  const size_t n_vocab = ctx_.mdl().hp().n_vocab;
  const size_t n_batch = ctx_.params().n_batch;
  std::vector<std::vector<float>> out(steps.size());
  batch b;
  std::vector<size_t> owners;  // step index of each logits row in b
  uint64_t n_decodes = 0;
  auto flush = [&] {
    if (b.size() == 0) return;
    ctx_.decode(b);
    ++n_decodes;
    for (size_t r = 0; r < owners.size(); ++r) {
      const std::span<const float> l = ctx_.logits(r);
      out[owners[r]].assign(l.begin(), l.begin() + static_cast<std::ptrdiff_t>(n_vocab));
    }
    b.clear();
    owners.clear();
  };
  try {
    for (size_t i = 0; i < steps.size(); ++i) {
      const seq_step& s = steps[i];
      for (size_t k = 0; k < s.tokens.size(); ++k) {
        const bool last = k + 1 == s.tokens.size();
        b.add(s.tokens[k], s.keep + static_cast<int32_t>(k), s.seq, last);
        if (last) owners.push_back(i);
        if (b.size() == n_batch) flush();
      }
    }
    flush();
  } catch (...) {
    count({}, n_decodes);
    throw;
  }
  count(steps, n_decodes);
  return out;
}

void batch_decoder::submit(std::vector<seq_step> steps, decode_done done, int64_t group) {
  auto held = std::make_shared<std::vector<seq_step>>(std::move(steps));
  batch b;
  for (const seq_step& s : *held) {
    for (size_t k = 0; k < s.tokens.size(); ++k) b.add(s.tokens[k], s.keep + static_cast<int32_t>(k), s.seq, k + 1 == s.tokens.size());
  }
  const size_t n_vocab = ctx_.mdl().hp().n_vocab;
  ctx_.submit(
      [this, held] { begin(*held); },
      std::move(b),
      [this, held, n_vocab, done = std::move(done)](std::vector<float> l, std::exception_ptr e) {
        if (e) {
          done({}, e);
          return;
        }
        // One row per step, in step order (each step's last token asked).
        std::vector<std::vector<float>> out(held->size());
        for (size_t i = 0; i < out.size(); ++i) {
          const auto from = l.begin() + static_cast<std::ptrdiff_t>(i * n_vocab);
          out[i].assign(from, from + static_cast<std::ptrdiff_t>(n_vocab));
        }
        count(*held, 1);
        done(std::move(out), nullptr);
      },
      group);
}

void batch_decoder::submit_forget(int32_t seq) {
  ctx_.submit([this, seq] { forget(seq); }, {}, {});
}

void batch_decoder::submit_shift(int32_t seq, int32_t p0, int32_t n) {
  ctx_.submit(
      [this, seq, p0, n] {
        try {
          ctx_.shift(seq, p0, n, [this](size_t cells) { make_room(cells); });
        } catch (const std::exception&) {
          forget(seq);
        }
      },
      {}, {});
}

void batch_decoder::submit_share(int32_t src, int32_t dst, int32_t n, std::function<void()> after) {
  ctx_.submit(
      [this, src, dst, n, after = std::move(after)] {
        forget(dst);
        ctx_.kv().seq_cp(src, dst, 0, n);
        if (after) after();
      },
      {}, {});
}

std::vector<generate_result> generate_together(llm_context& ctx, const vocab& v,
                                               const std::vector<std::vector<token_id>>& prompts,
                                               const generate_params& p,
                                               const std::function<void(size_t, std::string_view, token_id)>& on_piece) {
  if (prompts.size() > ctx.params().n_seq_max) {
    throw error("generate_together: " + std::to_string(prompts.size()) + " prompts, the context has " +
                std::to_string(ctx.params().n_seq_max) + " sequences");
  }
  batch_decoder dec(ctx);
  std::vector<sequence> seqs;
  seqs.reserve(prompts.size());
  for (size_t i = 0; i < prompts.size(); ++i) {
    dec.forget(static_cast<int32_t>(i));
    seqs.emplace_back(v, std::span<const token_id>{}, prompts[i], p, ctx.params().n_ctx);
  }
  for (;;) {
    std::vector<seq_step> steps;
    std::vector<size_t> which;
    for (size_t i = 0; i < seqs.size(); ++i) {
      if (seqs[i].done()) continue;
      const sequence_step& st = seqs[i].pending();
      steps.push_back({static_cast<int32_t>(i), st.keep, st.tokens, st.shift_at, st.shift_n});
      which.push_back(i);
    }
    if (steps.empty()) break;
    const auto logits = dec.decode(steps);
    for (size_t k = 0; k < which.size(); ++k) {
      const sequence_output o = seqs[which[k]].advance(logits[k]);
      if (on_piece && !o.piece.empty()) on_piece(which[k], o.piece, o.token);
    }
  }
  std::vector<generate_result> results;
  for (const sequence& s : seqs) results.push_back(s.result());
  return results;
}

}  // namespace troupe::llm
