#include "runtime/llm/llm_context.h"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <string>

#include "runtime/error.h"
#include "runtime/graph.h"
#include "runtime/llm/graph.h"

namespace troupe::llm {

namespace {

// Tensor slots one micro-batch's graph needs: about 40 a layer plus the inputs and the head.
size_t graph_tensors(const hparams& hp) { return static_cast<size_t>(hp.n_layer) * 48 + 64; }

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
  cpu_ = cpu::make_cpu_backend({.n_threads = params_.n_threads});
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
  backends.push_back({cpu_.get(), nullptr});
  sched_ = std::make_unique<scheduler>(std::move(backends), graph_tensors(m.hp()) * 2);
  reserve();
}

llm_context::~llm_context() = default;

void llm_context::set_n_threads(int n) { cpu_->set_n_threads(n); }

size_t llm_context::compute_bytes() const {
  size_t n = 0;
  for (int b = 0; b < sched_->n_backends(); ++b) n += sched_->compute_buffer_size(b);
  return n;
}

void llm_context::account(memory_ledger& ledger, int sign) const {
  auto key = [](buffer_type_i& bt) {
    return buffer_type_key{std::string(bt.name()), std::string(bt.device().name()), bt.is_host()};
  };
  for (const auto& [bt, bytes] : kv_->bytes_by_buft()) ledger.add(key(*bt), memory_kind::context, sign * static_cast<int64_t>(bytes));
  for (int b = 0; b < sched_->n_backends(); ++b) {
    ledger.add(key(sched_->buffer_type(b)), memory_kind::compute, sign * static_cast<int64_t>(sched_->compute_buffer_size(b)));
  }
}

void llm_context::reserve() {
  // The worst case: a full micro-batch attending to the whole cache, every token with logits.
  troupe::context ctx(graph_ctx_params(m_.hp()));
  graph_builder b(ctx, m_, *kv_, {.n_tokens = params_.n_ubatch, .n_kv = kv_->size(), .n_outputs = params_.n_ubatch});
  tensor* logits = build_graph(b);
  graph g(graph_tensors(m_.hp()) * 2);
  g.build_forward_expand(logits);
  sched_->reserve(g);
}

std::span<const float> llm_context::logits(size_t i) const {
  if (i >= n_outputs_) {
    throw error("llm context: logits of output " + std::to_string(i) + " requested, the last decode produced " +
                std::to_string(n_outputs_));
  }
  const size_t n_vocab = m_.hp().n_vocab;
  return {logits_.data() + i * n_vocab, n_vocab};
}

void llm_context::decode(const batch& b) {
  const auto t0 = std::chrono::steady_clock::now();
  const size_t n = b.size();
  if (n == 0) throw error("llm context: empty batch");
  if (b.pos.size() != n || b.seq.size() != n || b.logits.size() != n) {
    throw error("llm context: batch fields disagree in length");
  }
  if (n > params_.n_batch) {
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
  size_t want = 0;
  for (uint8_t l : b.logits) want += l != 0;
  logits_.assign(want * n_vocab, 0.0f);
  n_outputs_ = 0;
  for (size_t begin = 0; begin < n; begin += params_.n_ubatch) {
    decode_ubatch(b, begin, std::min(n, begin + params_.n_ubatch));
  }
  stats_.n_tokens += n;
  stats_.seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

void llm_context::decode_ubatch(const batch& b, size_t begin, size_t end) {
  const hparams& hp = m_.hp();
  const uint32_t n_tokens = static_cast<uint32_t>(end - begin);
  const std::vector<int32_t> pos(b.pos.begin() + static_cast<std::ptrdiff_t>(begin), b.pos.begin() + static_cast<std::ptrdiff_t>(end));
  const std::vector<int32_t> seq(b.seq.begin() + static_cast<std::ptrdiff_t>(begin), b.seq.begin() + static_cast<std::ptrdiff_t>(end));
  std::vector<int32_t> out_ids;
  for (size_t i = begin; i < end; ++i) {
    if (b.logits[i]) out_ids.push_back(static_cast<int32_t>(i - begin));
  }
  // The graph always produces at least one row; a micro-batch without requested logits discards it.
  const bool discard = out_ids.empty();
  if (discard) out_ids.push_back(static_cast<int32_t>(n_tokens - 1));

  const std::vector<uint32_t> cells = kv_->find_slots(n_tokens);
  const uint32_t n_kv = kv_->n_kv(cells);

  troupe::context ctx(graph_ctx_params(hp));
  graph_builder gb(ctx, m_, *kv_, {.n_tokens = n_tokens, .n_kv = n_kv, .n_outputs = static_cast<uint32_t>(out_ids.size())});
  tensor* logits = build_graph(gb);
  graph g(graph_tensors(hp) * 2);
  g.build_forward_expand(logits);
  sched_->alloc_graph(g);

  // Inputs.
  tensor_set(*gb.in.tokens, b.tokens.data() + begin, 0, n_tokens * sizeof(int32_t));
  tensor_set(*gb.in.pos, pos.data(), 0, n_tokens * sizeof(int32_t));
  std::vector<float> mask(static_cast<size_t>(n_kv) * n_tokens);
  kv_->fill_mask(mask.data(), n_kv, n_tokens, pos, seq, cells, 0);
  tensor_set(*gb.in.mask, mask.data(), 0, mask.size() * sizeof(float));
  if (gb.in.mask_swa != nullptr) {
    kv_->fill_mask(mask.data(), n_kv, n_tokens, pos, seq, cells, hp.n_swa);
    tensor_set(*gb.in.mask_swa, mask.data(), 0, mask.size() * sizeof(float));
  }
  std::vector<int64_t> k_idx(cells.begin(), cells.end());
  tensor_set(*gb.in.k_idx, k_idx.data(), 0, k_idx.size() * sizeof(int64_t));
  if (gb.in.v_idx != gb.in.k_idx) {
    const int64_t n_embd_v = hp.n_embd_v_gqa();
    std::vector<int64_t> v_idx(static_cast<size_t>(n_embd_v) * n_tokens);
    for (uint32_t t = 0; t < n_tokens; ++t) {
      for (int64_t d = 0; d < n_embd_v; ++d) v_idx[t * n_embd_v + d] = d * kv_->size() + cells[t];
    }
    tensor_set(*gb.in.v_idx, v_idx.data(), 0, v_idx.size() * sizeof(int64_t));
  }
  tensor_set(*gb.in.out_ids, out_ids.data(), 0, out_ids.size() * sizeof(int32_t));

  sched_->graph_compute(g);
  kv_->commit(cells, pos, seq);
  stats_.n_graphs += 1;

  if (!discard) {
    const size_t n_vocab = hp.n_vocab;
    tensor_get(*logits, logits_.data() + n_outputs_ * n_vocab, 0, out_ids.size() * n_vocab * sizeof(float));
    n_outputs_ += out_ids.size();
  }
  sched_->reset();
}

}  // namespace troupe::llm
