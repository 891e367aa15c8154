#include "runtime/llm/llm_context.h"

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <exception>
#include <mutex>
#include <thread>
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

struct llm_context::ubatch {
  std::unique_ptr<troupe::context> ctx;  // the graph's tensors
  std::unique_ptr<graph_builder> gb;
  std::unique_ptr<graph> g;
  tensor* logits = nullptr;
  std::vector<uint32_t> cells;
  std::vector<int32_t> pos, seq;
  size_t n_out = 0;      // rows of logits wanted
  size_t out_at = 0;     // where they go in logits_ (in rows)
  bool discard = false;  // no logits wanted: the graph's one row is dropped
};

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
  backend_list_ = backends;
  sched_ = std::make_unique<scheduler>(std::move(backends), graph_tensors(m.hp()) * 2);
  reserve(*sched_);
}

llm_context::~llm_context() = default;

void llm_context::set_n_threads(int n) { cpu_->set_n_threads(n); }

std::map<buffer_type_i*, size_t> llm_context::compute_bytes_by_buft() const {
  std::map<buffer_type_i*, size_t> out;
  for (int b = 0; b < sched_->n_backends(); ++b) out[&sched_->buffer_type(b)] += sched_->compute_buffer_size(b);
  for (const auto& s : slots_) {
    for (int b = 0; b < s->n_backends(); ++b) out[&s->buffer_type(b)] += s->compute_buffer_size(b);
  }
  return out;
}

size_t llm_context::compute_bytes() const {
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
  // The worst case: a full micro-batch attending to the whole cache, every token with logits.
  troupe::context ctx(graph_ctx_params(m_.hp()));
  graph_builder b(ctx, m_, *kv_, {.n_tokens = params_.n_ubatch, .n_kv = kv_->size(), .n_outputs = params_.n_ubatch});
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
  const size_t n_vocab = m_.hp().n_vocab;
  return {logits_.data() + i * n_vocab, n_vocab};
}

void llm_context::validate(const batch& b) const {
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
}

void llm_context::decode(const batch& b) {
  const auto t0 = std::chrono::steady_clock::now();
  validate(b);
  const size_t n = b.size();
  const uint32_t n_vocab = m_.hp().n_vocab;
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
void llm_context::prepare(ubatch& u, scheduler& s, const batch& b, size_t begin, size_t end) {
  const hparams& hp = m_.hp();
  const auto n_tokens = static_cast<uint32_t>(end - begin);
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

  u.cells = kv_->find_slots(n_tokens);
  const uint32_t n_kv = kv_->n_kv(u.cells);

  u.ctx = std::make_unique<troupe::context>(graph_ctx_params(hp));
  u.gb = std::make_unique<graph_builder>(*u.ctx, m_, *kv_,
                                         graph_shape{.n_tokens = n_tokens, .n_kv = n_kv, .n_outputs = static_cast<uint32_t>(out_ids.size())});
  graph_builder& gb = *u.gb;
  u.logits = build_graph(gb);
  u.g = std::make_unique<graph>(graph_tensors(hp) * 2);
  u.g->build_forward_expand(u.logits);
  s.alloc_graph(*u.g);
  s.set_trace_id(static_cast<int64_t>(next_ubatch_id_++));

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
  kv_->commit(u.cells, u.pos, u.seq);
}

// After micro-batch u computed in s: its logits into dst (rows of n_vocab; null: logits_ at u.out_at), s
// ready for the next graph.
void llm_context::finish(ubatch& u, scheduler& s, float* dst) {
  if (!u.discard) {
    const size_t n_vocab = m_.hp().n_vocab;
    if (dst == nullptr) dst = logits_.data() + u.out_at * n_vocab;
    tensor_get(*u.logits, dst, 0, u.n_out * n_vocab * sizeof(float));
  }
  stats_.n_graphs += 1;
  s.reset();
  u = ubatch{};
}

bool llm_context::pipelines() const { return params_.n_pipeline > 1 && sched_->n_backends() > 1; }

void llm_context::decode_pipelined(const batch& b) {
  const size_t n = b.size();
  std::deque<pipeline_item> items;
  size_t out = 0;
  for (size_t begin = 0; begin < n; begin += params_.n_ubatch) {
    const size_t end = std::min(n, begin + params_.n_ubatch);
    items.push_back({&b, begin, end, 0, out});
    out += b.n_outputs(begin, end);
  }
  run_pipeline(items, nullptr, items.size());
  n_outputs_ = out;
}

void llm_context::decode_ring(std::vector<batch> first, const ring_step& next) {
  const auto t0 = std::chrono::steady_clock::now();
  std::vector<batch> cur = std::move(first);
  const size_t n_vocab = m_.hp().n_vocab;
  n_outputs_ = 0;
  if (!pipelines() || cur.size() < 2) {  // one after another (decode checks each step)
    for (bool any = true; any;) {
      any = false;
      for (size_t g = 0; g < cur.size(); ++g) {
        if (cur[g].size() == 0) continue;
        decode(cur[g]);
        batch nb;
        const std::span<const float> l(logits_.data(), n_outputs_ * n_vocab);
        cur[g] = next(g, l, nb) ? std::move(nb) : batch{};
        any = any || cur[g].size() > 0;
      }
    }
    return;
  }
  // A step placed in the pipeline is a micro-batch of its own.
  const auto check_step = [&](const batch& b) {
    validate(b);
    if (b.size() > params_.n_ubatch) throw error("llm context: a ring step of " + std::to_string(b.size()) + " tokens exceeds n_ubatch");
  };
  for (const batch& b : cur) {
    if (b.size() > 0) check_step(b);
  }
  std::vector<float> logits;
  std::deque<pipeline_item> items;
  for (size_t g = 0; g < cur.size(); ++g) {
    if (cur[g].size() > 0) items.push_back({&cur[g], 0, cur[g].size(), g, 0});
  }
  const auto on_done = [&](const pipeline_item& it, ubatch& u, scheduler& s, std::deque<pipeline_item>& queue) {
    logits.assign(it.b->n_outputs() * n_vocab, 0.0f);
    finish(u, s, logits.data());
    stats_.n_tokens += it.b->size();
    batch nb;
    if (next(it.group, logits, nb) && nb.size() > 0) {
      check_step(nb);
      cur[it.group] = std::move(nb);
      queue.push_back({&cur[it.group], 0, cur[it.group].size(), it.group, 0});
    }
  };
  run_pipeline(items, on_done, items.size());
  stats_.seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

void llm_context::run_pipeline(std::deque<pipeline_item>& queue, const item_done& on_done, size_t max_slots) {
  const size_t n_slots = std::max<size_t>(1, std::min<size_t>(params_.n_pipeline, max_slots));
  while (slots_.size() + 1 < n_slots) {  // slot 0 is sched_
    slots_.push_back(std::make_unique<scheduler>(backend_list_, graph_tensors(m_.hp()) * 2));
    reserve(*slots_.back());
  }
  for (auto& slot : slots_) slot->set_split_runner(sched_->runner());  // the actor layer's device threads
  const auto sched_of = [&](size_t k) -> scheduler& { return k % n_slots == 0 ? *sched_ : *slots_[k % n_slots - 1]; };

  // Shared with the backends' threads, under mu: per placed micro-batch (k < n_placed, in the order they
  // were placed), whether a split of it is running and how many of its splits have completed (in order).
  std::mutex mu;
  std::condition_variable cv;
  std::deque<ubatch> ubs;  // the main thread's (stable references)
  std::deque<pipeline_item> placed;
  std::vector<char> running;
  std::vector<int> done, n_splits;
  std::vector<std::vector<int>> split_backend;
  std::exception_ptr failure;
  size_t failed = SIZE_MAX;  // the first micro-batch that failed: the ones before it still complete
  bool stop = false;
  size_t n_placed = 0;

  // A split may run once the split before it and the same split of the micro-batch before have completed;
  // a micro-batch whose splits fall on other backends than the one before's (a different split structure)
  // waits for that one to complete.
  const auto runnable = [&](size_t k) {
    if (running[k] || done[k] >= n_splits[k]) return false;
    if (k == 0) return true;
    if (split_backend[k - 1] != split_backend[k]) return done[k - 1] >= n_splits[k - 1];
    return done[k - 1] > done[k];
  };
  const auto worker = [&](int be) {
    std::unique_lock lock(mu);
    for (;;) {
      size_t pick = SIZE_MAX;
      for (size_t k = 0; k < n_placed && k < failed && pick == SIZE_MAX; ++k) {
        if (runnable(k) && split_backend[k][static_cast<size_t>(done[k])] == be) pick = k;
      }
      if (pick == SIZE_MAX) {
        if (stop) return;
        cv.wait(lock);
        continue;
      }
      running[pick] = 1;
      const int split = done[pick];
      scheduler& s = sched_of(pick);
      lock.unlock();
      std::exception_ptr err;
      try {
        s.dispatch_split(split);
      } catch (...) {
        err = std::current_exception();
      }
      lock.lock();
      running[pick] = 0;
      if (err) {
        if (pick < failed) {
          failed = pick;
          failure = err;
        }
      } else {
        ++done[pick];
      }
      cv.notify_all();
    }
  };
  std::vector<std::thread> threads;
  for (int be = 0; be < sched_->n_backends(); ++be) threads.emplace_back(worker, be);

  size_t finished = 0;  // micro-batches whose results are out
  {
    std::unique_lock lock(mu);
    try {
      for (;;) {
        if (failure) break;
        if (finished < n_placed && done[finished] >= n_splits[finished]) {  // the oldest one completed
          const size_t k = finished;
          lock.unlock();
          if (on_done) {
            on_done(placed[k], ubs[k], sched_of(k), queue);
          } else {
            finish(ubs[k], sched_of(k), nullptr);
          }
          lock.lock();
          ++finished;
          continue;
        }
        if (!queue.empty() && n_placed - finished < n_slots) {  // a free slot: place the next one
          const size_t k = n_placed;
          const pipeline_item it = queue.front();
          lock.unlock();
          ubs.emplace_back();
          placed.push_back(it);
          scheduler& s = sched_of(k);
          std::exception_ptr err;
          try {
            prepare(ubs[k], s, *it.b, it.begin, it.end);
          } catch (...) {
            err = std::current_exception();
          }
          if (err) {  // nothing from this one on starts
            lock.lock();
            if (k < failed) {
              failed = k;
              failure = err;
            }
            break;
          }
          ubs[k].out_at = it.out_at;
          queue.pop_front();
          lock.lock();
          running.push_back(0);
          done.push_back(0);
          n_splits.push_back(s.n_splits());
          split_backend.emplace_back();
          for (const scheduler::split& sp : s.splits()) split_backend.back().push_back(sp.backend);
          ++n_placed;
          cv.notify_all();
          continue;
        }
        if (queue.empty() && finished == n_placed) break;
        cv.wait(lock);
      }
    } catch (...) {  // a finished micro-batch's callback failed: nothing more is placed
      if (!lock.owns_lock()) lock.lock();
      if (n_placed < failed) {
        failed = n_placed;
        failure = std::current_exception();
      }
    }
    // After a failure, the micro-batches before the failed one run to completion (as they would have one
    // at a time), and nothing after it starts.
    cv.wait(lock, [&] {
      for (size_t j = 0; j < n_placed && j < failed; ++j) {
        if (done[j] < n_splits[j]) return false;
      }
      return true;
    });
    stop = true;
    cv.notify_all();
  }
  for (std::thread& t : threads) t.join();
  stats_.n_pipelined += 1;
  if (failure) {
    // The cache keeps the micro-batches that completed (a prefix); the others give their cells back, and
    // every scheduler forgets its graph (the one whose placing failed included).
    size_t kept = finished;
    while (kept < n_placed && done[kept] >= n_splits[kept]) ++kept;
    for (size_t k = finished; k < ubs.size(); ++k) {
      if (k >= kept && !ubs[k].cells.empty()) kv_->release(ubs[k].cells);
      if (ubs[k].g) sched_of(k).reset();
    }
    n_outputs_ = 0;
    std::rethrow_exception(failure);
  }
}

}  // namespace troupe::llm
