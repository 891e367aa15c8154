#include <caf/all.hpp>

#include <algorithm>
#include <utility>
#include <vector>

#include "actors/detail/decoder_state.h"
#include "actors/fan_in.h"
#include "runtime/error.h"
#include "runtime/log.h"
#include "runtime/memory.h"

namespace troupe::actors::detail {

namespace {

memory_event event_for(buffer_type_i& bt, memory_kind kind, int64_t bytes, const std::string& owner) {
  return {std::string(bt.name()), std::string(bt.device().name()), bt.is_host(), static_cast<uint8_t>(kind), bytes, owner};
}

}  // namespace

void report_compute(decoder_ptr self, std::function<void()> done) {
  auto& st = self->state;
  fan_in join(1, std::move(done));  // one for this function itself: each request below adds its own
  // Every pipeline slot's compute memory too (llm_context: several micro-batches in flight).
  const auto report = [&](const llm::llm_context* ctx, const std::string& owner, std::map<std::string, uint64_t>& reported_by) {
    if (!ctx) return;
    for (const auto& [bt, bytes] : ctx->compute_bytes_by_buft()) {
      const std::string name(bt->name());
      uint64_t& reported = reported_by[name];
      if (reported == bytes) continue;
      const auto it = st.params.allocators.find(name);
      if (it != st.params.allocators.end()) {
        join.expect();
        self->request(it->second, caf::infinite, reserve_atom_v, compute_reservation{owner, bytes})
            .then([join](int64_t) { join(); },
                  [join, name](const caf::error& e) {
                    TROUPE_LOG(warn, "scheduler: allocator " << name << " did not take a reservation: " << describe(e));
                    join();
                  });
      } else {
        self->send(st.accountant, record_atom_v,
                   event_for(*bt, memory_kind::compute, static_cast<int64_t>(bytes) - static_cast<int64_t>(reported), owner));
      }
      reported = bytes;
    }
  };
  report(st.ctx.get(), st.owner(), st.compute_reported);
  report(st.embed_ctx.get(), st.embed_owner(), st.embed_compute_reported);
  join();
}

namespace {

// The context's split runner, on its pipeline's threads: hands split `index` to the decoder actor, which
// hands it on to the device actor owning its device, and waits until that actor has run it (the scheduler
// actor itself never waits). Without a device actor for the device, the split runs here. A failure comes back
// with the exception's own type.
void run_split_on_device(const caf::actor_addr& sched, const engine_env_ptr& env, const std::shared_ptr<split_relay>& relay,
                         const std::string& device, int index, const std::function<void()>& work) {
  auto task = std::make_shared<split_task>();
  task->work = &work;
  task->device = device;
  {
    std::lock_guard lock(relay->mu);
    if (relay->closed) throw backend_error("split " + std::to_string(index) + " on " + device + ": the model's scheduler terminated");
    relay->pending.insert(task);
  }
  const uint64_t id = env->objects.put(task);
  if (auto h = caf::actor_cast<decoder_actor>(sched)) {
    caf::anon_send(h, compute_atom_v, decode_split{id, static_cast<uint32_t>(index)});
  } else {
    task->fail("the model's scheduler terminated");
  }
  const auto [handover, here] = task->wait();
  {
    std::lock_guard lock(relay->mu);
    relay->pending.erase(task);
  }
  env->objects.erase(id);
  if (here) {
    work();
    return;
  }
  if (task->failure) std::rethrow_exception(task->failure);
  if (!handover.empty()) throw backend_error("split " + std::to_string(index) + " on " + device + ": " + handover);
}

}  // namespace

void create_context(decoder_ptr self) {
  auto& st = self->state;
  const model_settings& r = st.model->settings;
  // The cache has every sequence it can: sessions use the first n_seq_max, the rest keep conversations
  // that their sessions moved on from (llm/prefix_index.h). Logits are reserved for the sessions' steps.
  st.ctx = std::make_unique<llm::llm_context>(
      *st.model->model, llm::context_params{.n_ctx = r.n_ctx, .n_batch = r.n_batch, .n_ubatch = r.n_ubatch,
                                            .n_seq_max = llm::kv_cache::max_seq, .type_k = r.kv_cache_type(),
                                            .type_v = r.kv_cache_type_v(), .flash_attn = r.flash_attn != "off", .n_threads = r.n_threads,
                                            .n_pipeline = r.n_pipeline, .n_outputs_reserved = r.n_seq_max});
  if (st.params.dispatch_splits) {
    std::vector<std::string> names;
    for (int b = 0; b < st.ctx->sched().n_backends(); ++b) names.emplace_back(st.ctx->sched().backend(b).device().name());
    st.ctx->sched().set_split_runner([me = self->address(), env = st.env, relay = st.relay, names](
                                         int index, const scheduler::split& sp, const std::function<void()>& work) {
      run_split_on_device(me, env, relay, names[static_cast<size_t>(sp.backend)], index, work);
    });
  }
  st.dec = std::make_unique<llm::batch_decoder>(*st.ctx);
  st.prefixes = std::make_unique<llm::prefix_index>(r.n_seq_max, llm::kv_cache::max_seq, 16,
                                                    static_cast<uint64_t>(r.prompt_cache_mib) << 20);
  // A kept conversation evicted for room goes to host memory first (when the model has a prompt cache).
  st.dec->set_evictor([p = st.prefixes.get()](llm::kv_cache& kv) {
    // Saved while the index is locked: a step planned meanwhile finds the conversation in host memory.
    const int32_t victim = p->evict_saving([&kv](int32_t seq, int32_t n) {
      try {
        return kv.save(seq, n);
      } catch (const std::exception& e) {
        TROUPE_LOG(warn, "prompt cache: a conversation of " << n << " positions not saved: " << e.what());
        return std::vector<uint8_t>{};
      }
    });
    TROUPE_LOG(debug, "prefix reuse: sequence " << victim << " evicted for room");
    return victim;
  });
  st.seqs.assign(r.n_seq_max, caf::actor_addr{});
  for (const auto& [bt, bytes] : st.ctx->kv().bytes_by_buft()) {
    self->send(st.accountant, record_atom_v, event_for(*bt, memory_kind::context, static_cast<int64_t>(bytes), st.owner()));
  }
}

void report_prompt_cache(decoder_ptr self, bool release) {
  auto& st = self->state;
  const uint64_t now = release || !st.prefixes ? 0 : st.prefixes->stats().host_bytes;
  if (now == st.prompt_cache_reported) return;
  const int64_t delta = static_cast<int64_t>(now) - static_cast<int64_t>(st.prompt_cache_reported);
  st.prompt_cache_reported = now;
  self->send(st.accountant, record_atom_v,
             memory_event{"Host (prompt cache)", "Host", true, static_cast<uint8_t>(memory_kind::context), delta,
                          st.prompt_cache_owner()});
}

void create_embed_context(decoder_ptr self) {
  auto& st = self->state;
  const model_settings& r = st.model->settings;
  const uint32_t n = r.embedding_cells();
  st.embed_ctx = std::make_unique<llm::llm_context>(
      *st.model->model, llm::context_params{.n_ctx = n, .n_batch = n, .n_ubatch = std::min<uint32_t>(n, 512),
                                            .flash_attn = r.flash_attn != "off", .n_threads = r.n_threads, .embeddings = true});
  for (const auto& [bt, bytes] : st.embed_ctx->kv().bytes_by_buft()) {
    self->send(st.accountant, record_atom_v,
               event_for(*bt, memory_kind::context, static_cast<int64_t>(bytes), st.embed_owner()));
  }
}

void relay_split(decoder_ptr self, const decode_split& d) {
  auto& st = self->state;
  const std::shared_ptr<split_task> task = st.env->objects.get<split_task>(d.task);
  if (!task) return;
  const auto dev = st.devices.find(task->device);
  if (dev == st.devices.end()) {
    task->run_here();
    return;
  }
  // The device actor settles the task when it has run it; this only hears of a handover that failed.
  self->request(dev->second, caf::infinite, compute_atom_v, d)
      .then([](const split_result&) {},
            [task, device = task->device](const caf::error& e) { task->fail("device actor " + device + ": " + describe(e)); });
}

namespace {

// Takes a context's memory off the record under `owner` and frees it: its KV memory and the compute memory
// of buffer types without an allocator at the accountant; the allocators that hold its compute memory are
// added to `asked`, to be told to release the owner.
void release_one(decoder_ptr self, std::unique_ptr<llm::llm_context>& ctx, const std::string& owner,
                 std::map<std::string, uint64_t>& reported_by, std::vector<std::pair<allocator_actor, std::string>>& asked) {
  auto& st = self->state;
  if (!ctx) return;
  for (const auto& [bt, bytes] : ctx->kv().bytes_by_buft()) {
    self->send(st.accountant, record_atom_v, event_for(*bt, memory_kind::context, -static_cast<int64_t>(bytes), owner));
  }
  for (auto& [name, reported] : reported_by) {
    if (reported == 0) continue;
    const auto it = st.params.allocators.find(name);
    if (it != st.params.allocators.end()) {
      asked.emplace_back(it->second, owner);
    } else {
      scheduler& sched = ctx->sched();
      for (int b = 0; b < sched.n_backends(); ++b) {
        if (sched.buffer_type(b).name() == name) {
          self->send(st.accountant, record_atom_v,
                     event_for(sched.buffer_type(b), memory_kind::compute, -static_cast<int64_t>(reported), owner));
          break;
        }
      }
    }
    reported = 0;
  }
  ctx.reset();
}

}  // namespace

void release_context(decoder_ptr self, caf::typed_response_promise<bool> rp) {
  auto& st = self->state;
  for (waiting_step& w : st.waiting) w.promise.deliver(make_error(errc::down, "the model's context was released"));
  st.waiting.clear();
  for (auto& [leader, w] : st.deferred) w.promise.deliver(make_error(errc::down, "the model's context was released"));
  st.deferred.clear();
  st.generating.clear();
  if (!st.jobs.empty()) {  // the last one to complete releases
    st.release_waiters.push_back(std::move(rp));
    return;
  }
  std::vector<std::pair<allocator_actor, std::string>> asked;
  release_one(self, st.embed_ctx, st.embed_owner(), st.embed_compute_reported, asked);
  if (st.ctx) {
    // The context (its pipeline, with forgets still queued) goes before the decoder they call.
    release_one(self, st.ctx, st.owner(), st.compute_reported, asked);
    st.dec.reset();
    report_prompt_cache(self, true);
    st.prefixes.reset();
    st.seqs.clear();
  }
  fan_in join(asked.size(), [rp]() mutable { rp.deliver(true); });
  for (const auto& [a, owner] : asked) {
    self->request(a, caf::infinite, release_atom_v, owner)
        .then([join](uint64_t) { join(); }, [join](const caf::error&) { join(); });
  }
}

}  // namespace troupe::actors::detail
