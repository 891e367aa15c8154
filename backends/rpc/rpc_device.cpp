#include "backends/rpc/rpc_device.h"

#include <algorithm>
#include <atomic>
#include <cstring>
#include <deque>
#include <mutex>

#include "backends/cpu/cpu_backend.h"
#include "backends/rpc/rpc.h"
#include "runtime/error.h"
#include "runtime/log.h"
#include "runtime/ops.h"

namespace troupe::rpc {
namespace {

// Each buffer's base address: 1 TiB apart, never handed out twice in this process, never dereferenced.
constexpr uint64_t base_spacing = uint64_t{1} << 40;
void* next_base() {
  static std::atomic<uint64_t> next{1};
  return reinterpret_cast<void*>(static_cast<uintptr_t>(next.fetch_add(1) * base_spacing));
}

class rpc_backend final : public backend_i {
 public:
  explicit rpc_backend(rpc_device& dev) : dev_(dev) {}
  ~rpc_backend() override {
    try {
      synchronize();
    } catch (const std::exception& e) {
      TROUPE_LOG(debug, "rpc: a queued graph on " << dev_.name() << " failed with no one waiting: " << e.what());
    }
  }
  std::string_view name() const override { return dev_.name(); }
  device_i& device() const override { return dev_; }
  void graph_compute(graph& g) override {
    if (g.n_nodes() == 0) return;
    synchronize();
    const what_it_touches w = touches(g);
    dev_.conn().compute(dev_.index(), serialize_graph(g, dev_), w.outputs, w.written);
  }
  bool queues_graphs() const override { return dev_.conn().can_queue(); }
  void graph_submit(graph& g) override {
    if (g.n_nodes() == 0) return;
    const what_it_touches w = touches(g);
    const client::ticket t = dev_.conn().submit(dev_.index(), serialize_graph(g, dev_), w.outputs, w.written);
    std::lock_guard lock(mu_);
    tickets_.push_back(t);
  }
  bool finish_oldest(std::chrono::microseconds timeout, int wake_fd) override {
    client::ticket t;
    {
      std::lock_guard lock(mu_);
      if (tickets_.empty()) return true;
      t = tickets_.front();
    }
    bool done = true;
    try {
      done = dev_.conn().wait(t, timeout, wake_fd);
    } catch (...) {
      pop();
      throw;
    }
    if (done) pop();
    return done;
  }
  void synchronize() override {
    while (!finish_oldest(std::chrono::hours(1), -1)) {
    }
  }

 private:
  // The graph's outputs (logits...) come back with the reply: reading them costs no round trip. Copies of
  // earlier replies' outputs stay valid unless this graph writes their buffers.
  struct what_it_touches {
    std::vector<client::output_request> outputs;
    std::vector<uint64_t> written;
  };
  static what_it_touches touches(const graph& g) {
    what_it_touches w;
    for (const tensor* t : g.nodes()) {
      if (t->buffer == nullptr) continue;
      const auto* b = dynamic_cast<const rpc_buffer*>(t->buffer);
      if (b == nullptr) continue;
      const uint64_t h = b->remote().handle;
      if (std::find(w.written.begin(), w.written.end(), h) == w.written.end()) w.written.push_back(h);
      if (t->flags & flag_output) w.outputs.push_back({b->remote(), b->offset_of(*t), nbytes(*t)});
    }
    return w;
  }
  void pop() {
    std::lock_guard lock(mu_);
    if (!tickets_.empty()) tickets_.pop_front();
  }

  rpc_device& dev_;
  std::mutex mu_;
  std::deque<client::ticket> tickets_;  // graphs submitted, not finished, oldest first
};

}  // namespace

// ---- buffer type ----

std::string_view rpc_buffer_type::name() const { return dev_.name(); }

device_i& rpc_buffer_type::device() const { return dev_; }

buffer_ptr rpc_buffer_type::alloc_buffer(size_t size) {
  if (size > max_size_) {
    throw out_of_memory_error("buffer type " + std::string(name()) + ": " + std::to_string(size) +
                              " bytes exceed its max size " + std::to_string(max_size_));
  }
  const remote_buffer rb = dev_.conn().alloc_buffer(dev_.index(), size);
  return std::make_unique<rpc_buffer>(*this, dev_.conn_ptr(), rb, size);
}

size_t rpc_buffer_type::alloc_size(const tensor& t) const {
  if (!(dev_.info().flags & device_custom_alloc_size)) return nbytes(t);
  return dev_.conn().alloc_size(dev_.index(), to_wire(t, nullptr));
}

// ---- buffer ----

rpc_buffer::rpc_buffer(rpc_buffer_type& type, std::shared_ptr<client> c, remote_buffer rb, size_t size)
    : buffer_i(type, size), client_(std::move(c)), rb_(rb), base_(next_base()) {}

rpc_buffer::~rpc_buffer() {
  try {
    client_->free_buffer(rb_);
  } catch (const std::exception& e) {
    TROUPE_LOG(warn, "rpc: freeing a buffer on " << client_->address() << ": " << e.what());
  }
}

uint64_t rpc_buffer::offset_of(const tensor& t) const {
  const auto p = reinterpret_cast<uintptr_t>(t.data);
  const auto b = reinterpret_cast<uintptr_t>(base_);
  if (t.data == nullptr || p < b || p - b > size()) {
    throw backend_error("rpc: tensor " + describe(t) + " does not lie in buffer of " + std::string(type().name()));
  }
  return p - b;
}

void rpc_buffer::init_tensor(tensor& t) {
  const auto& dev = static_cast<const rpc_device&>(type().device());
  if (dev.info().flags & device_needs_init_tensor) client_->init_tensor(to_wire(t, this));
}

void rpc_buffer::set_tensor(tensor& t, const void* data, size_t offset, size_t size) {
  client_->set_tensor(rb_, offset_of(t) + offset, data, size, usage() == buffer_usage::weights);
}

void rpc_buffer::get_tensor(const tensor& t, void* data, size_t offset, size_t size) {
  client_->get_tensor(rb_, offset_of(t) + offset, data, size);
}

void rpc_buffer::memset_tensor(tensor& t, uint8_t value, size_t offset, size_t size) {
  const size_t chunk = std::min<size_t>(size, size_t{1} << 20);
  std::vector<uint8_t> fill(chunk, value);
  const uint64_t base = offset_of(t) + offset;
  for (size_t done = 0; done < size; done += chunk) {
    client_->set_tensor(rb_, base + done, fill.data(), std::min(chunk, size - done), false);
  }
}

bool rpc_buffer::copy_tensor(const tensor& src, tensor& dst) {
  const auto* s = dynamic_cast<const rpc_buffer*>(src.buffer);
  if (s == nullptr || s->client_ != client_) return false;
  client_->copy_tensor(s->rb_, s->offset_of(src), rb_, offset_of(dst), nbytes(src));
  return true;
}

void rpc_buffer::clear(uint8_t value) { client_->buffer_clear(rb_, value); }

// ---- device ----

rpc_device::rpc_device(std::shared_ptr<client> c, uint32_t index, device_info info, size_t alignment, size_t max_size)
    : client_(std::move(c)),
      index_(index),
      info_(std::move(info)),
      peer_version_(client_->server_version()),
      name_("RPC[" + client_->address() + "]#" + std::to_string(index)),
      buft_(*this, alignment, max_size) {}

std::string rpc_device::description() const { return info_.name + " on " + client_->address() + ": " + info_.description; }

device_type rpc_device::type() const { return info_.type == device_type::cpu ? device_type::accel : info_.type; }

device_memory rpc_device::memory() const {
  try {
    return client_->memory(index_);
  } catch (const std::exception& e) {
    TROUPE_LOG(warn, "rpc: memory of " << name_ << ": " << e.what());
    return {};
  }
}

backend_ptr rpc_device::init_backend() { return std::make_unique<rpc_backend>(*this); }

bool rpc_device::cpu_kernels() const {
  if (info_.type != device_type::cpu) return false;
  const version& v = peer_version_;
  return v.major == cpu_attention_version.major && v.minor >= cpu_attention_version.minor;
}

bool rpc_device::supports_op(const tensor& t) const {
  // The protocol's ops are the ones the peer can rebuild (backends/rpc/wire/validate.cpp). flash_attn reads
  // the CPU's own KV layout: only a peer's CPU that keeps it computes it (other devices' layers keep the
  // unfused graph over their own layout).
  if (t.op == op::count) return false;
  if (t.op == op::flash_attn) return cpu_kernels() && cpu::cpu_device().supports_op(t);
  // Layout ops compute nothing: every device takes them.
  if (t.op == op::none || is_view_op(t.op)) return true;
  // A remote CPU runs troupe's CPU kernels (of the same protocol version): ask them here rather than cross
  // the network.
  if (info_.type == device_type::cpu) return cpu::cpu_device().supports_op(t);
  // Any other device answers for itself, once per distinct question (the peer's own supports_op, on the
  // control connection): the scheduler places work on a remote GPU exactly as on a local one.
  const std::vector<uint8_t> q = op_question(t);
  std::string key(reinterpret_cast<const char*>(q.data()), q.size());
  const uint64_t epoch = client_->epoch();
  {
    std::lock_guard l(answers_mu_);
    if (answers_epoch_ != epoch) {
      answers_.clear();
      answers_epoch_ = epoch;
    }
    if (const auto it = answers_.find(key); it != answers_.end()) return it->second;
  }
  bool yes = false;
  try {
    yes = client_->supports_op(index_, q);
  } catch (const remote_error& e) {
    // The peer could not read the question (a node its builders do not make): not on this device.
    TROUPE_LOG(warn, "rpc: " << name_ << " cannot say whether it computes " << describe(t) << " (" << op_name(t.op)
                             << "); placing it elsewhere: " << e.what());
    yes = false;
  }
  std::lock_guard l(answers_mu_);
  if (answers_epoch_ == epoch) {
    if (answers_.size() >= 65536) answers_.clear();
    answers_.emplace(std::move(key), yes);
  }
  return yes;
}

// ---- peers ----

std::vector<device_i*> add_peer(const std::string& endpoint, const std::string& key) {
  const auto [host, port] = parse_endpoint(endpoint);
  return add_peer(std::make_shared<client>(client_options{.host = host, .port = port, .key = key}));
}

std::vector<device_i*> add_peer(std::shared_ptr<client> c) {
  if (!c) throw error("rpc: add_peer without a client");
  if (!c->connected()) c->connect();
  std::vector<device_i*> out;
  const std::vector<device_info> infos = c->devices();
  for (uint32_t i = 0; i < infos.size(); ++i) {
    const size_t align = static_cast<size_t>(c->alignment(i));
    if (align == 0 || (align & (align - 1)) != 0 || align > (size_t{1} << 20)) {
      throw backend_error("peer " + c->address() + ": device " + std::to_string(i) + " reports alignment " +
                          std::to_string(align) + ", not a power of two up to 1 MiB");
    }
    const size_t max_size = static_cast<size_t>(std::min<uint64_t>(c->max_size(i), base_spacing - align));
    out.push_back(&registry::instance().add(std::make_unique<rpc_device>(c, i, infos[i], align, max_size)));
  }
  return out;
}

std::shared_ptr<client> client_of(const device_i& dev) {
  const auto* d = dynamic_cast<const rpc_device*>(&dev);
  return d ? d->conn_ptr() : nullptr;
}

int remote_index(const device_i& dev) {
  const auto* d = dynamic_cast<const rpc_device*>(&dev);
  return d ? static_cast<int>(d->index()) : -1;
}

}  // namespace troupe::rpc
