// The decode API's context (llm_context.h): the KV cache, the schedulers and their compute memory, checks
// of a batch, and one micro-batch built, placed and finished (prepare, finish); decode() runs them one after
// another. The pipeline that keeps several in flight over several backends is in llm_pipeline.cpp; the
// types both share are in llm/detail/llm_pipeline.h.
#include "llm/llm_context.h"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <mutex>
#include <string>

#include "backends/registry.h"
#include "runtime/error.h"
#include "runtime/graph.h"
#include "llm/detail/llm_pipeline.h"
#include "llm/graph.h"
#include "runtime/trace.h"

namespace troupe::llm {

using detail::graph_tensors;

namespace {

troupe::context_params graph_ctx_params(const hparams& hp) {
  return troupe::context_params{.max_tensors = graph_tensors(hp), .no_alloc = true};
}

}  // namespace

llm_context::llm_context(const model& m, const context_params& p) : m_(m), params_(p) {
  if (params_.n_ctx == 0) params_.n_ctx = std::min<uint32_t>(m.hp().n_ctx_train, 4096);
  if (params_.n_ubatch == 0 || params_.n_batch == 0) throw error("llm context: n_batch and n_ubatch must be positive");
  params_.n_ubatch = std::min(params_.n_ubatch, params_.n_batch);
  kv_ = std::make_unique<kv_cache>(m, kv_cache_params{.n_ctx = params_.n_ctx, .type_k = params_.type_k,
                                                       .type_v = params_.type_v, .n_seq_max = params_.n_seq_max});
  params_.n_ctx = kv_->size();
  params_.n_ubatch = std::min(params_.n_ubatch, params_.n_ctx);
  host_ = host_device().init_backend();
  host_->set_n_threads(params_.n_threads);
  // Devices other than the host that hold weights (layers placed on a GPU or a remote peer) get a backend
  // each, ahead of the CPU in the scheduler's priority order.
  std::vector<sched_backend> backends;
  auto add_device = [&](buffer_type_i* bt) {
    if (bt == nullptr || bt->is_host()) return;
    device_i& dev = bt->device();
    for (const auto& be : device_backends_) {
      if (&be->device() == &dev) return;
    }
    device_backends_.push_back(dev.init_backend());
    backends.push_back({device_backends_.back().get(), nullptr});
  };
  for (const auto& l : m.layers()) add_device(l.buft);
  for (const auto& [bt, bytes] : m.weight_bytes()) add_device(bt);
  backends.push_back({host_.get(), nullptr});
  backend_list_ = backends;
  sched_ = std::make_unique<scheduler>(std::move(backends), graph_tensors(m.hp()) * 2);
  reserve(*sched_);
}

llm_context::~llm_context() = default;

void llm_context::set_n_threads(int n) { host_->set_n_threads(n); }

std::map<buffer_type_i*, size_t> llm_context::compute_bytes_by_buft() const {
  std::lock_guard lock(mem_mu_);
  std::map<buffer_type_i*, size_t> out;
  for (int b = 0; b < sched_->n_backends(); ++b) out[&sched_->buffer_type(b)] += sched_->compute_buffer_size(b);
  for (const auto& s : slots_) {
    for (int b = 0; b < s->n_backends(); ++b) out[&s->buffer_type(b)] += s->compute_buffer_size(b);
  }
  return out;
}

size_t llm_context::compute_bytes() const {
  std::lock_guard lock(mem_mu_);
  size_t n = 0;
  for (int b = 0; b < sched_->n_backends(); ++b) n += sched_->compute_buffer_size(b);
  for (const auto& s : slots_) {
    for (int b = 0; b < s->n_backends(); ++b) n += s->compute_buffer_size(b);
  }
  return n;
}

void llm_context::account(memory_ledger& ledger, int sign) const {
  auto key = [](buffer_type_i& bt) {
    return buffer_type_key{std::string(bt.name()), std::string(bt.device().name()), bt.is_host()};
  };
  for (const auto& [bt, bytes] : kv_->bytes_by_buft()) ledger.add(key(*bt), memory_kind::context, sign * static_cast<int64_t>(bytes));
  std::lock_guard lock(mem_mu_);
  for (int b = 0; b < sched_->n_backends(); ++b) {
    ledger.add(key(sched_->buffer_type(b)), memory_kind::compute, sign * static_cast<int64_t>(sched_->compute_buffer_size(b)));
  }
  for (const auto& s : slots_) {
    for (int b = 0; b < s->n_backends(); ++b) {
      ledger.add(key(s->buffer_type(b)), memory_kind::compute, sign * static_cast<int64_t>(s->compute_buffer_size(b)));
    }
  }
}

void llm_context::reserve(scheduler& s) {
  // The worst case: a full micro-batch attending to the whole cache, with the logits a decode asks for (one
  // row per sequence, unless told more): [n_vocab, n_ubatch] floats would be most of the compute memory
  // (96 MiB for a 49k vocabulary and 512 tokens, 512 MiB for 262k) for batches that output one row.
  const uint32_t rows = params_.n_outputs_reserved > 0 ? params_.n_outputs_reserved : std::max(1u, params_.n_seq_max);
  troupe::context ctx(graph_ctx_params(m_.hp()));
  graph_builder b(ctx, m_, *kv_, {.n_tokens = params_.n_ubatch, .n_kv = kv_->size(), .n_outputs = std::min(rows, params_.n_ubatch), .embeddings = params_.embeddings, .flash_attn = params_.flash_attn});
  tensor* logits = build_graph(b);
  graph g(graph_tensors(m_.hp()) * 2);
  g.build_forward_expand(logits);
  s.reserve(g);
}

std::span<const float> llm_context::logits(size_t i) const {
  if (i >= n_outputs_) {
    throw error("llm context: logits of output " + std::to_string(i) + " requested, the last decode produced " +
                std::to_string(n_outputs_));
  }
  const size_t n_vocab = row_width();
  return {logits_.data() + i * n_vocab, n_vocab};
}

void llm_context::validate(const batch& b, bool limit) const {
  const size_t n = b.size();
  if (n == 0) throw error("llm context: empty batch");
  if (b.pos.size() != n || b.seq.size() != n || b.logits.size() != n) {
    throw error("llm context: batch fields disagree in length");
  }
  if (limit && n > params_.n_batch) {
    throw error("llm context: batch of " + std::to_string(n) + " tokens exceeds n_batch " + std::to_string(params_.n_batch));
  }
  const uint32_t n_vocab = m_.hp().n_vocab;
  for (size_t i = 0; i < n; ++i) {
    if (b.tokens[i] < 0 || static_cast<uint32_t>(b.tokens[i]) >= n_vocab) {
      throw error("llm context: token id " + std::to_string(b.tokens[i]) + " at batch index " + std::to_string(i) +
                  " is outside the vocabulary (" + std::to_string(n_vocab) + " tokens)");
    }
    if (b.seq[i] < 0 || static_cast<uint32_t>(b.seq[i]) >= params_.n_seq_max) {
      throw error("llm context: sequence id " + std::to_string(b.seq[i]) + " at batch index " + std::to_string(i) +
                  " outside 0.." + std::to_string(params_.n_seq_max - 1));
    }
    if (b.pos[i] < 0) throw error("llm context: negative position at batch index " + std::to_string(i));
  }
  if (n > kv_->size() - kv_->used_cells()) {
    throw capacity_error("llm context: " + std::to_string(n) + " tokens do not fit the context (" +
                         std::to_string(kv_->used_cells()) + " of " + std::to_string(kv_->size()) + " cells in use)");
  }
}

void llm_context::shift(int32_t seq, int32_t p0, int32_t n, const std::function<void(size_t)>& make_room) {
  kv_cache& kv = *kv_;
  const std::vector<uint8_t> bytes = kv.shifted(seq, p0, n, [&](uint32_t il, float* rows, int64_t n_rows) {
    rope_turn_rows(m_, il, kv.size(), rows, n_rows, -n);
  });
  const int32_t m = static_cast<int32_t>(bytes.size() / kv.bytes_per_token());
  kv.seq_rm(seq, -1, -1);
  if (make_room) make_room(static_cast<size_t>(m));
  kv.restore(seq, bytes, m, m);
}

void llm_context::decode(const batch& b) {
  const auto t0 = std::chrono::steady_clock::now();
  validate(b);
  const size_t n = b.size();
  const uint32_t n_vocab = row_width();
  logits_.assign(b.n_outputs() * n_vocab, 0.0f);
  n_outputs_ = 0;
  if (n > params_.n_ubatch && pipelines()) {
    decode_pipelined(b);
  } else {
    for (size_t begin = 0; begin < n; begin += params_.n_ubatch) {
      ubatch u;
      try {
        prepare(u, *sched_, b, begin, std::min(n, begin + params_.n_ubatch));
        u.out_at = n_outputs_;
        sched_->graph_compute(*u.g);
      } catch (...) {
        kv_->release(u.cells);  // the cache keeps the micro-batches that completed (found cells are free)
        sched_->reset();        // nothing may point into u's graph once it is gone
        throw;
      }
      n_outputs_ += u.discard ? 0 : u.n_out;
      finish(u, *sched_);
    }
  }
  stats_.n_tokens += n;
  stats_.seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}


// Builds and places micro-batch [begin, end) in scheduler s and sets its inputs; its cells are committed
// to the cache (the next micro-batch's mask sees them). Nothing is computed.
void llm_context::prepare(ubatch& u, scheduler& s, const batch& b, size_t begin, size_t end, int64_t group) {
  const hparams& hp = m_.hp();
  const auto n_tokens = static_cast<uint32_t>(end - begin);
  u.id = static_cast<int64_t>(next_ubatch_id_++);
  u.group = group;
  // The scheduler's track of the trace: building, placing and setting up each micro-batch's graph.
  trace::span placing("scheduler", "place", {{"ubatch", u.id}, {"group", group}, {"tokens", static_cast<int64_t>(n_tokens)}});
  u.pos.assign(b.pos.begin() + static_cast<std::ptrdiff_t>(begin), b.pos.begin() + static_cast<std::ptrdiff_t>(end));
  u.seq.assign(b.seq.begin() + static_cast<std::ptrdiff_t>(begin), b.seq.begin() + static_cast<std::ptrdiff_t>(end));
  std::vector<int32_t> out_ids;
  for (size_t i = begin; i < end; ++i) {
    if (b.logits[i]) out_ids.push_back(static_cast<int32_t>(i - begin));
  }
  // The graph always produces at least one row; a micro-batch without requested logits discards it.
  u.discard = out_ids.empty();
  if (u.discard) out_ids.push_back(static_cast<int32_t>(n_tokens - 1));
  u.n_out = out_ids.size();

  u.cells = kv_->find_slots(n_tokens, u.seq);
  const uint32_t n_kv = kv_->n_kv(u.cells);

  u.ctx = std::make_unique<troupe::context>(graph_ctx_params(hp));
  u.gb = std::make_unique<graph_builder>(*u.ctx, m_, *kv_,
                                         graph_shape{.n_tokens = n_tokens, .n_kv = n_kv, .n_outputs = static_cast<uint32_t>(out_ids.size()), .embeddings = params_.embeddings, .flash_attn = params_.flash_attn});
  graph_builder& gb = *u.gb;
  u.logits = build_graph(gb);
  u.g = std::make_unique<graph>(graph_tensors(hp) * 2);
  u.g->build_forward_expand(u.logits);
  {
    std::lock_guard lock(mem_mu_);  // may grow the compute memory
    s.alloc_graph(*u.g);
  }
  s.set_trace_id(u.id, group);

  // Inputs.
  tensor_set(*gb.in.tokens, b.tokens.data() + begin, 0, n_tokens * sizeof(int32_t));
  tensor_set(*gb.in.pos, u.pos.data(), 0, n_tokens * sizeof(int32_t));
  std::vector<float> mask(static_cast<size_t>(n_kv) * n_tokens);
  kv_->fill_mask(mask.data(), n_kv, n_tokens, u.pos, u.seq, u.cells, 0);
  tensor_set(*gb.in.mask, mask.data(), 0, mask.size() * sizeof(float));
  if (gb.in.mask_swa != nullptr) {
    kv_->fill_mask(mask.data(), n_kv, n_tokens, u.pos, u.seq, u.cells, hp.n_swa);
    tensor_set(*gb.in.mask_swa, mask.data(), 0, mask.size() * sizeof(float));
  }
  std::vector<int64_t> k_idx(u.cells.begin(), u.cells.end());
  tensor_set(*gb.in.k_idx, k_idx.data(), 0, k_idx.size() * sizeof(int64_t));
  if (gb.in.v_idx != gb.in.k_idx) {
    const int64_t n_embd_v = hp.n_embd_v_gqa();
    std::vector<int64_t> v_idx(static_cast<size_t>(n_embd_v) * n_tokens);
    for (uint32_t t = 0; t < n_tokens; ++t) {
      for (int64_t d = 0; d < n_embd_v; ++d) v_idx[t * n_embd_v + d] = d * kv_->size() + u.cells[t];
    }
    tensor_set(*gb.in.v_idx, v_idx.data(), 0, v_idx.size() * sizeof(int64_t));
  }
  tensor_set(*gb.in.out_ids, out_ids.data(), 0, out_ids.size() * sizeof(int32_t));
  if (gb.in.attn_temp != nullptr) {
    std::vector<float> temp(n_tokens);
    for (uint32_t t = 0; t < n_tokens; ++t) temp[t] = hp.attn_temp(u.pos[t]);
    tensor_set(*gb.in.attn_temp, temp.data(), 0, temp.size() * sizeof(float));
  }
  kv_->commit(u.cells, u.pos, u.seq);
}

// After micro-batch u computed in s: its logits into dst (rows of n_vocab; null: logits_ at u.out_at), s
// ready for the next graph.
void llm_context::finish(ubatch& u, scheduler& s, float* dst) {
  trace::span finishing("scheduler", "finish", {{"ubatch", u.id}, {"group", u.group}});
  if (!u.discard) {
    const size_t n_vocab = row_width();
    if (dst == nullptr) dst = logits_.data() + u.out_at * n_vocab;
    tensor_get(*u.logits, dst, 0, u.n_out * n_vocab * sizeof(float));
  }
  stats_.n_graphs += 1;
  s.reset();
  u = ubatch{};
}

bool llm_context::pipelines() const { return params_.n_pipeline > 1 && sched_->n_backends() > 1; }

}  // namespace troupe::llm
