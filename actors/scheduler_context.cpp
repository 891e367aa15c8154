#include <caf/all.hpp>

#include "actors/detail/scheduler_state.h"
#include "actors/fan_in.h"
#include "runtime/log.h"
#include "runtime/memory.h"

namespace troupe::actors::detail {

namespace {

memory_event event_for(buffer_type_i& bt, memory_kind kind, int64_t bytes, const std::string& owner) {
  return {std::string(bt.name()), std::string(bt.device().name()), bt.is_host(), static_cast<uint8_t>(kind), bytes, owner};
}

}  // namespace

void report_compute(scheduler_ptr self, std::function<void()> done) {
  auto& st = self->state;
  fan_in join(1, std::move(done));  // one for this function itself: each request below adds its own
  if (st.ctx) {
    // Every pipeline slot's compute memory too (llm_context: several micro-batches in flight).
    for (const auto& [bt, bytes] : st.ctx->compute_bytes_by_buft()) {
      const std::string name(bt->name());
      uint64_t& reported = st.compute_reported[name];
      if (reported == bytes) continue;
      const auto it = st.params.allocators.find(name);
      if (it != st.params.allocators.end()) {
        join.expect();
        self->request(it->second, caf::infinite, reserve_atom_v, compute_reservation{st.owner(), bytes})
            .then([join](int64_t) { join(); },
                  [join, name](const caf::error& e) {
                    TROUPE_LOG(warn, "scheduler: allocator " << name << " did not take a reservation: " << describe(e));
                    join();
                  });
      } else {
        self->send(st.accountant, record_atom_v,
                   event_for(*bt, memory_kind::compute, static_cast<int64_t>(bytes) - static_cast<int64_t>(reported), st.owner()));
      }
      reported = bytes;
    }
  }
  join();
}

namespace {

// The loader checked the name; anything else is f16.
type kv_type(const std::string& name) {
  if (name == "f32") return type::f32;
  if (name == "q8_0") return type::q8_0;
  return type::f16;
}

// Runs one split of the context's decode graph on the thread of the device actor that owns its device, and
// waits for it (the scheduler actor is detached: blocking here holds no shared worker). A device without an
// actor (none in this runtime) computes here. A failure comes back with the exception's own type.
void run_split_on_device(scheduler_ptr self, int index, const scheduler::split& sp, const std::function<void()>& work) {
  auto& st = self->state;
  const std::string device(st.ctx->sched().backend(sp.backend).device().name());
  const auto dev = st.devices.find(device);
  if (dev == st.devices.end()) {
    work();
    return;
  }
  auto task = std::make_shared<split_task>();
  task->work = &work;
  task->device = device;
  const uint64_t id = st.env->objects.put(task);
  caf::error err;
  {
    caf::scoped_actor blocking{self->system()};
    blocking->request(dev->second, caf::infinite, compute_atom_v, decode_split{id, static_cast<uint32_t>(index)})
        .receive([](const split_result&) {}, [&](caf::error& e) { err = std::move(e); });
  }
  st.env->objects.erase(id);
  if (task->failure) std::rethrow_exception(task->failure);
  if (err) throw backend_error("device actor " + device + ": " + describe(err));
}

}  // namespace

void create_context(scheduler_ptr self) {
  auto& st = self->state;
  const model_settings& r = st.model->settings;
  st.ctx = std::make_unique<llm::llm_context>(
      *st.model->model, llm::context_params{.n_ctx = r.n_ctx, .n_batch = r.n_batch, .n_ubatch = r.n_ubatch,
                                            .n_seq_max = r.n_seq_max, .type_k = kv_type(r.kv_type),
                                            .type_v = kv_type(r.kv_type), .n_threads = r.n_threads});
  if (st.params.dispatch_splits) {
    st.ctx->sched().set_split_runner([self](int index, const scheduler::split& sp, const std::function<void()>& work) {
      run_split_on_device(self, index, sp, work);
    });
  }
  st.dec = std::make_unique<llm::batch_decoder>(*st.ctx);
  st.seqs.assign(st.ctx->params().n_seq_max, caf::actor_addr{});
  for (const auto& [bt, bytes] : st.ctx->kv().bytes_by_buft()) {
    self->send(st.accountant, record_atom_v, event_for(*bt, memory_kind::context, static_cast<int64_t>(bytes), st.owner()));
  }
}

void release_context(scheduler_ptr self, caf::typed_response_promise<bool> rp) {
  auto& st = self->state;
  for (waiting_step& w : st.waiting) w.promise.deliver(make_error(errc::down, "the model's context was released"));
  st.waiting.clear();
  st.generating.clear();
  if (!st.ctx) {
    rp.deliver(true);
    return;
  }
  for (const auto& [bt, bytes] : st.ctx->kv().bytes_by_buft()) {
    self->send(st.accountant, record_atom_v, event_for(*bt, memory_kind::context, -static_cast<int64_t>(bytes), st.owner()));
  }
  std::vector<allocator_actor> asked;
  for (auto& [name, reported] : st.compute_reported) {
    if (reported == 0) continue;
    const auto it = st.params.allocators.find(name);
    if (it != st.params.allocators.end()) {
      asked.push_back(it->second);
    } else {
      scheduler& sched = st.ctx->sched();
      for (int b = 0; b < sched.n_backends(); ++b) {
        if (sched.buffer_type(b).name() == name) {
          self->send(st.accountant, record_atom_v,
                     event_for(sched.buffer_type(b), memory_kind::compute, -static_cast<int64_t>(reported), st.owner()));
          break;
        }
      }
    }
    reported = 0;
  }
  st.dec.reset();
  st.ctx.reset();
  st.seqs.clear();
  fan_in join(asked.size(), [rp]() mutable { rp.deliver(true); });
  for (const allocator_actor& a : asked) {
    self->request(a, caf::infinite, release_atom_v, st.owner())
        .then([join](uint64_t) { join(); }, [join](const caf::error&) { join(); });
  }
}

}  // namespace troupe::actors::detail
