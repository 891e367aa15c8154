#include "actors/loader_actor.h"

#include <caf/all.hpp>

#include <chrono>
#include <fstream>
#include <iterator>
#include <map>

#include "actors/device_actor.h"
#include "actors/errors.h"
#include "runtime/error.h"
#include "runtime/log.h"
#include "runtime/memory.h"

namespace troupe::actors {

namespace {

// A chat_template_file's text ("" for none); throws naming the key and the path.
std::string read_template_file(const std::string& path) {
  if (path.empty()) return {};
  std::ifstream in(path, std::ios::binary);
  if (!in.is_open()) throw troupe::error("chat_template_file: cannot open '" + path + "'");
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (in.bad()) throw troupe::error("chat_template_file: cannot read '" + path + "'");
  if (text.empty()) throw troupe::error("chat_template_file: '" + path + "' is empty");
  return text;
}

using clock_type = std::chrono::steady_clock;

// A load whose uploads are running on device actors.
struct in_flight {
  caf::typed_response_promise<model_info> promise;
  std::shared_ptr<staged_load> load;
  uint64_t job_id = 0;
  model_settings settings;            // resolved
  std::vector<buffer_type_i*> queue;  // targets not dispatched yet (sequential loads)
  size_t outstanding = 0;             // uploads dispatched and not answered
  std::vector<upload_result> uploads;
  caf::error failure;
  clock_type::time_point t0;
  clock_type::time_point uploads_begin;
};

struct loader_state {
  engine_env_ptr env;
  memory_accountant_actor accountant;
  std::map<std::string, device_actor> devices;
  std::map<std::string, in_flight> loads;  // by model name
  static inline const char* name = "troupe.loader";

  ~loader_state() {
    for (auto& [model, f] : loads) {
      if (f.load && f.load->job) f.load->job->cancel();
      f.promise.deliver(make_error(errc::down, "the loader terminated while loading " + model));
    }
  }
};

using loader_ptr = loader_actor::stateful_pointer<loader_state>;

void report_weights(loader_ptr self, const std::string& name, const llm::model& m, int sign) {
  for (const auto& [buft, bytes] : m.weight_bytes()) {
    self->send(self->state.accountant, record_atom_v,
               memory_event{std::string(buft->name()), std::string(buft->device().name()), buft->is_host(),
                            static_cast<uint8_t>(memory_kind::model), sign * static_cast<int64_t>(bytes), "model:" + name});
  }
}

void dispatch(loader_ptr self, const std::string& name, buffer_type_i* target);

// Every upload has answered: finish the load or report its failure.
void complete(loader_ptr self, const std::string& name) {
  auto& st = self->state;
  in_flight& f = st.loads.at(name);
  const double upload_seconds = std::chrono::duration<double>(clock_type::now() - f.uploads_begin).count();
  st.env->objects.erase(f.job_id);
  if (f.failure) {
    f.promise.deliver(f.failure);
    st.loads.erase(name);
    return;
  }
  try {
    auto lm = std::make_shared<loaded_model>();
    lm->model = std::move(f.load->opened);
    lm->model->attach(f.load->job->finish());
    lm->vocab = std::make_unique<llm::vocab>(lm->model->meta());
    lm->chat = std::make_unique<llm::chat_prompt>(llm::chat_prompt::for_model(
        lm->model->meta(), *lm->vocab, f.settings.chat_template, read_template_file(f.settings.chat_template_file)));
    lm->settings = f.settings;
    model_info& info = lm->info;
    const llm::hparams& hp = lm->model->hp();
    info.name = name;
    info.path = f.settings.path;
    info.arch = hp.name;
    info.n_layer = hp.n_layer;
    info.n_vocab = hp.n_vocab;
    info.n_ctx_train = hp.n_ctx_train;
    info.n_params = lm->model->n_params();
    for (const auto& [buft, bytes] : lm->model->weight_bytes()) info.weight_bytes += bytes;
    info.chat_template = lm->chat->name();
    info.uploads = f.uploads;
    info.upload_seconds = upload_seconds;
    info.load_seconds = std::chrono::duration<double>(clock_type::now() - f.t0).count();
    report_weights(self, name, *lm->model, 1);
    st.env->put_model(name, lm);
    f.promise.deliver(info);
  } catch (const std::exception& e) {
    f.promise.deliver(error_from(e));
  }
  st.loads.erase(name);
}

void answered(loader_ptr self, const std::string& name) {
  auto& st = self->state;
  const auto it = st.loads.find(name);
  if (it == st.loads.end()) return;
  in_flight& f = it->second;
  --f.outstanding;
  if (!f.failure && !f.queue.empty()) {
    buffer_type_i* next = f.queue.front();
    f.queue.erase(f.queue.begin());
    dispatch(self, name, next);
    return;
  }
  if (f.outstanding == 0) complete(self, name);
}

void dispatch(loader_ptr self, const std::string& name, buffer_type_i* target) {
  auto& st = self->state;
  in_flight& f = st.loads.at(name);
  const std::string device(target->device().name());
  ++f.outstanding;
  const auto dev = st.devices.find(device);
  if (dev == st.devices.end()) {
    if (!f.failure) f.failure = make_error(errc::not_found, "load " + name + ": no device actor for device '" + device + "'");
    f.load->job->cancel();
    answered(self, name);
    return;
  }
  self->request(dev->second, caf::infinite, upload_atom_v, upload_job{f.job_id, std::string(target->name())})
      .then(
          [self, name](const upload_result& r) {
            auto it = self->state.loads.find(name);
            if (it != self->state.loads.end()) it->second.uploads.push_back(r);
            answered(self, name);
          },
          [self, name](const caf::error& e) {
            auto it = self->state.loads.find(name);
            if (it != self->state.loads.end()) {
              in_flight& fl = it->second;
              // The first failure cancels the other devices' uploads; a cancellation that follows it is
              // not the cause.
              if (!fl.failure) fl.failure = e;
              fl.load->job->cancel();
              fl.queue.clear();
            }
            answered(self, name);
          });
}

loader_actor::behavior_type loader(loader_ptr self, engine_env_ptr env, memory_accountant_actor acct) {
  self->state.env = env;
  self->state.accountant = acct;
  return {
      [self](load_atom, const load_request& req) -> caf::result<model_info> {
        auto& st = self->state;
        model_settings r;
        try {
          r = req.model.resolved();
        } catch (const settings_error& e) {
          return make_error(errc::bad_request, "load" + (req.model.name.empty() ? "" : " " + req.model.name) + ": " + e.what());
        }
        if (st.env->model(r.name) || st.loads.count(r.name)) {
          return make_error(errc::bad_request, "load: a model named '" + r.name + "' is already loaded or loading");
        }
        llm::model_params mp;
        mp.use_mmap = r.use_mmap;
        mp.huge_pages = r.huge_pages;
        for (const device_layers& d : r.devices) {
          device_i* dev = registry::instance().find(d.device);
          if (dev == nullptr || !st.devices.count(d.device)) {
            return make_error(errc::not_found, "load " + r.name + ": no device actor for device '" + d.device + "'");
          }
          mp.devices.emplace_back(dev, d.layers);
        }
        for (const tensor_override& o : r.overrides) {
          device_i* dev = registry::instance().find(o.device);
          if (dev == nullptr || !st.devices.count(o.device)) {
            return make_error(errc::not_found, "load " + r.name + ": tensor override '" + o.pattern +
                                                   "': no device actor for device '" + o.device + "'");
          }
          mp.overrides.emplace_back(o.pattern, dev);
        }
        auto load = std::make_shared<staged_load>();
        load->model = r.name;
        load->progress = req.progress;
        try {
          load->opened = llm::model::open(r.path, mp);
          load->job = std::make_unique<load_job>(load->opened->loader().begin(load->opened->plan(), {.use_mmap = r.use_mmap, .huge_pages = r.huge_pages}));
        } catch (const std::exception& e) {
          return error_from(e);
        }
        for (buffer_type_i* b : load->job->targets()) {
          if (!st.devices.count(std::string(b->device().name()))) {
            return make_error(errc::not_found, "load " + r.name + ": no device actor for device '" +
                                                   std::string(b->device().name()) + "'");
          }
        }
        in_flight& f = st.loads[r.name];
        f.promise = self->make_response_promise<model_info>();
        f.load = load;
        f.job_id = st.env->objects.put(load);
        f.settings = r;
        f.t0 = clock_type::now();
        const std::vector<buffer_type_i*> targets = load->job->targets();
        if (targets.empty()) {
          complete(self, r.name);
          return f.promise;  // already delivered
        }
        f.uploads_begin = clock_type::now();
        if (r.parallel) {
          for (buffer_type_i* b : targets) dispatch(self, r.name, b);
        } else {
          f.queue.assign(targets.begin() + 1, targets.end());
          dispatch(self, r.name, targets.front());
        }
        return f.promise;
      },
      [self](unload_atom, const std::string& name) -> bool {
        std::shared_ptr<const loaded_model> m = self->state.env->take_model(name);
        if (!m) return false;
        report_weights(self, name, *m->model, -1);
        return true;
      },
      [self](cancel_atom, const std::string& name) {
        const auto it = self->state.loads.find(name);
        if (it == self->state.loads.end()) return;
        if (!it->second.failure) it->second.failure = make_error(errc::cancelled, "load of " + name + " cancelled");
        it->second.load->job->cancel();
        it->second.queue.clear();
      },
      [self](device_atom, const std::string& name, const device_actor& dev) { self->state.devices[name] = dev; },
  };
}

}  // namespace

loader_actor spawn_loader_actor(caf::actor_system& sys, engine_env_ptr env, memory_accountant_actor accountant) {
  return sys.spawn(loader, std::move(env), std::move(accountant));
}

}  // namespace troupe::actors
