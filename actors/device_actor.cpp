#include "actors/device_actor.h"

#include <caf/all.hpp>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <chrono>
#include <map>

#include "actors/errors.h"
#include "backends/cpu/cpu_backend.h"
#include "runtime/context.h"
#include "runtime/error.h"
#include "runtime/log.h"
#include "runtime/memory.h"

namespace troupe::actors {

namespace {

using clock_type = std::chrono::steady_clock;

// A buffer the actor allocated, with a byte tensor over all of it for bounds-checked reads and writes.
struct owned_buffer {
  buffer_ptr buf;
  std::unique_ptr<context> ctx;
  tensor* bytes = nullptr;
  uint8_t kind = 0;
  std::string owner;
};

struct device_state {
  engine_env_ptr env;
  device_i* dev = nullptr;
  backend_ptr backend;
  memory_accountant_actor accountant;
  std::map<uint64_t, owned_buffer> buffers;
  uint64_t next_id = 1;
  uint64_t n_splits = 0;  // splits computed (device_status)
  static inline const char* name = "troupe.device";

  ~device_state() {
    // Whatever is still allocated at exit is released (an abnormal exit included).
    for (auto& [id, b] : buffers) caf::anon_send(accountant, record_atom_v, event(b, -1));
  }

  memory_event event(const owned_buffer& b, int sign) const {
    buffer_type_i& bt = b.buf->type();
    return {std::string(bt.name()), std::string(dev->name()), bt.is_host(), b.kind,
            sign * static_cast<int64_t>(b.buf->size()), b.owner};
  }

  device_status status() const {
    const device_memory m = dev->memory();
    return {std::string(dev->name()), dev->description(), m.total, m.free, dev->buffer_type().is_host(), buffers.size(),
            n_splits};
  }

  owned_buffer* find(uint64_t id) {
    const auto it = buffers.find(id);
    return it == buffers.end() ? nullptr : &it->second;
  }
};

using device_ptr = device_actor::stateful_pointer<device_state>;

// Uploads a load job's bytes for one target buffer type, with progress every ~2% of the whole load (from
// whichever device gets there).
caf::result<upload_result> run_upload(staged_load& load, buffer_type_i* target, const std::string& device) {
  const auto t0 = clock_type::now();
  try {
    load.job->upload(target, [&load](uint64_t done, uint64_t total) {
      uint64_t last = load.reported.load();
      if (load.progress && (done == total || done >= last + total / 50) && load.reported.compare_exchange_strong(last, done)) {
        caf::anon_send(load.progress, progress_atom_v, load_progress{load.model, done, total});
      }
      return true;
    });
  } catch (const std::exception& e) {
    return error_from(e);
  }
  return upload_result{std::string(target->name()), device, load.job->bytes(target),
                       std::chrono::duration<double>(clock_type::now() - t0).count()};
}

// A host buffer type's upload on a thread of its own (spawned detached): niced, so that the decode threads
// of the models being served come first; it answers once, then ends.
caf::behavior host_uploader(caf::event_based_actor* self, std::shared_ptr<staged_load> load, buffer_type_i* target, std::string device) {
  return {
      [self, load, target, device](upload_atom) -> caf::result<upload_result> {
        (void)setpriority(PRIO_PROCESS, static_cast<id_t>(syscall(SYS_gettid)), 19);  // (best effort)
        caf::result<upload_result> r = run_upload(*load, target, device);
        self->quit();
        return r;
      },
  };
}

caf::error not_found(const device_state& st, const std::string& what) {
  return make_error(errc::not_found, std::string(st.dev->name()) + ": " + what);
}

uint64_t free_buffer(device_ptr self, uint64_t id) {
  auto& st = self->state;
  owned_buffer* b = st.find(id);
  if (b == nullptr) return 0;
  const uint64_t size = b->buf->size();
  self->send(st.accountant, record_atom_v, st.event(*b, -1));
  st.buffers.erase(id);
  return size;
}

// Runs one split's work on this actor's thread and times it; an exception becomes the requester's error
// (and is kept in *failure when asked).
template <class Work>
caf::result<split_result> compute_timed(device_state& st, uint32_t microbatch, uint32_t split, Work&& work,
                                        std::exception_ptr* failure = nullptr) {
  const auto t0 = clock_type::now();
  ++st.n_splits;
  try {
    work();
  } catch (const std::exception& e) {
    if (failure != nullptr) *failure = std::current_exception();
    return error_from(e);
  }
  return split_result{microbatch, split, std::chrono::duration<double>(clock_type::now() - t0).count()};
}

device_actor::behavior_type device(device_ptr self, engine_env_ptr env, device_i* dev, memory_accountant_actor acct,
                                   device_actor_params p) {
  auto& init = self->state;
  init.env = env;
  init.dev = dev;
  init.accountant = acct;
  try {
    if (dev == &cpu::cpu_device()) {
      init.backend = cpu::make_cpu_backend({.n_threads = p.n_threads});
    } else {
      init.backend = dev->init_backend();
    }
  } catch (const std::exception& e) {
    TROUPE_LOG(warn, "device actor " << dev->name() << ": no backend: " << e.what());
  }
  self->send(acct, device_atom_v, init.status());

  return {
      [self](alloc_atom, const alloc_request& r) -> caf::result<buffer_info> {
        auto& st = self->state;
        if (r.kind > static_cast<uint8_t>(memory_kind::compute)) return make_error(errc::bad_request, "alloc: unknown memory kind");
        try {
          owned_buffer b;
          b.buf = st.dev->buffer_type().alloc_buffer(r.size);
          b.ctx = std::make_unique<context>(context_params{.max_tensors = 1, .no_alloc = true});
          b.bytes = b.ctx->new_tensor_1d(type::i8, static_cast<int64_t>(r.size));
          if (r.size > 0) tensor_alloc(*b.buf, *b.bytes, b.buf->base());
          b.kind = r.kind;
          b.owner = r.owner;
          const uint64_t id = st.next_id++;
          buffer_info info{id, b.buf->size(), std::string(st.dev->buffer_type().name())};
          self->send(st.accountant, record_atom_v, st.event(b, 1));
          st.buffers.emplace(id, std::move(b));
          self->send(st.accountant, device_atom_v, st.status());
          return info;
        } catch (const std::exception& e) {
          return error_from(e);
        }
      },
      [self](free_atom, uint64_t id) -> caf::result<uint64_t> {
        auto& st = self->state;
        if (st.find(id) == nullptr) return not_found(st, "no buffer " + std::to_string(id));
        const uint64_t n = free_buffer(self, id);
        self->send(st.accountant, device_atom_v, st.status());
        return n;
      },
      [self](free_atom, all_atom) -> uint64_t {
        auto& st = self->state;
        std::vector<uint64_t> ids;
        for (const auto& [i, b] : st.buffers) ids.push_back(i);
        uint64_t n = 0;
        for (uint64_t i : ids) n += free_buffer(self, i);
        self->send(st.accountant, device_atom_v, st.status());
        return n;
      },
      [self](upload_atom, const range_upload& u) -> caf::result<uint64_t> {
        auto& st = self->state;
        owned_buffer* b = st.find(u.buffer);
        if (b == nullptr) return not_found(st, "no buffer " + std::to_string(u.buffer));
        try {
          tensor_set(*b->bytes, u.data.data(), u.offset, u.data.size());
          return static_cast<uint64_t>(u.data.size());
        } catch (const std::exception& e) {
          return make_error(errc::bad_request, e.what());
        }
      },
      [self](upload_atom, const upload_job& u) -> caf::result<upload_result> {
        auto& st = self->state;
        const std::shared_ptr<staged_load> load = st.env->objects.get<staged_load>(u.job);
        if (!load) return not_found(st, "no load job " + std::to_string(u.job) + " in this process");
        buffer_type_i* target = nullptr;
        for (buffer_type_i* b : load->job->targets()) {
          if (b->name() == u.buft) target = b;
        }
        if (target == nullptr) return make_error(errc::bad_request, "load of " + load->model + " has no target " + u.buft);
        if (&target->device() != st.dev) {
          return make_error(errc::bad_request, "buffer type " + u.buft + " belongs to " + std::string(target->device().name()) +
                                                   ", not " + std::string(st.dev->name()));
        }
        if (target->is_host()) {
          // Host memory takes its bytes on a thread of its own (a detached actor that ends with the upload),
          // at a lower priority: this actor goes on running the decode splits of the models already loaded
          // on the device meanwhile, so a load does not hold up their answers.
          auto rp = self->make_response_promise<upload_result>();
          caf::actor worker = self->spawn<caf::detached>(host_uploader, load, target, std::string(st.dev->name()));
          self->request(worker, caf::infinite, upload_atom_v)
              .then(
                  [self, rp](upload_result& r) mutable {
                    self->send(self->state.accountant, device_atom_v, self->state.status());
                    rp.deliver(std::move(r));
                  },
                  [rp](caf::error& e) mutable { rp.deliver(std::move(e)); });
          return rp;
        }
        caf::result<upload_result> r = run_upload(*load, target, std::string(st.dev->name()));
        self->send(st.accountant, device_atom_v, st.status());
        return r;
      },
      [self](get_atom, const tensor_range& r) -> caf::result<std::vector<char>> {
        auto& st = self->state;
        owned_buffer* b = st.find(r.buffer);
        if (b == nullptr) return not_found(st, "no buffer " + std::to_string(r.buffer));
        try {
          std::vector<char> out(r.size);
          tensor_get(*b->bytes, out.data(), r.offset, r.size);
          return out;
        } catch (const std::exception& e) {
          return make_error(errc::bad_request, e.what());
        }
      },
      [self](compute_atom, const decode_split& r) -> caf::result<split_result> {
        // A split of a model context's decode (handed on by the model's decoder actor; its pipeline thread
        // waits for the task to be settled).
        auto& st = self->state;
        const std::shared_ptr<split_task> task = st.env->objects.get<split_task>(r.task);
        if (!task) return not_found(st, "no decode split task " + std::to_string(r.task) + " in this process");
        if (task->device != st.dev->name()) {
          return make_error(errc::bad_request, "split " + std::to_string(r.split) + " runs on " + task->device);
        }
        // The pipeline thread rethrows the exception itself, with its type (a full cache stays a capacity error).
        if (!task->begin()) return make_error(errc::cancelled, "decode split task " + std::to_string(r.task) + " was settled already");
        caf::result<split_result> res = compute_timed(st, 0, r.split, *task->work, &task->failure);
        task->finish();
        return res;
      },
      [self](memory_atom) {
        // The accountant's row of this device is refreshed too (what the driver reports free now: buffers
        // allocated past this actor, a model context's compute and KV cache, change it).
        const device_status s = self->state.status();
        self->send(self->state.accountant, device_atom_v, s);
        return s;
      },
  };
}

}  // namespace

device_actor spawn_device_actor(caf::actor_system& sys, engine_env_ptr env, const std::string& name,
                                memory_accountant_actor accountant, const device_actor_params& p) {
  device_i* dev = registry::instance().find(name);
  if (dev == nullptr) throw error("device actor: no device named '" + name + "' is registered");
  return sys.spawn<caf::detached>(device, std::move(env), dev, std::move(accountant), p);
}

}  // namespace troupe::actors
