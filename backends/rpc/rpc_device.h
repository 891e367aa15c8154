// The runtime interfaces (backend.h) over a peer connection: device, buffer type, buffer, backend.
// Users go through rpc.h (add_peer); this header is for the graph serializer and tests.
//
// Tensors on a peer are named by (buffer handle, byte offset). Each rpc_buffer gets a base address of its
// own that no other buffer in this process has (never dereferenced), so tensor::data - base() is the offset.
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <unordered_map>
#include <vector>

#include "backends/rpc/rpc_client.h"
#include "runtime/backend.h"

namespace troupe::rpc {

class rpc_device;

class rpc_buffer_type final : public buffer_type_i {
 public:
  rpc_buffer_type(rpc_device& dev, size_t alignment, size_t max_size) : dev_(dev), alignment_(alignment), max_size_(max_size) {}
  std::string_view name() const override;
  buffer_ptr alloc_buffer(size_t size) override;
  size_t alignment() const override { return alignment_; }
  size_t max_size() const override { return max_size_; }
  size_t alloc_size(const tensor& t) const override;
  bool is_host() const override { return false; }
  device_i& device() const override;

 private:
  rpc_device& dev_;
  size_t alignment_;
  size_t max_size_;
};

class rpc_buffer final : public buffer_i {
 public:
  rpc_buffer(rpc_buffer_type& type, std::shared_ptr<client> c, remote_buffer rb, size_t size);
  ~rpc_buffer() override;

  void* base() override { return base_; }
  void init_tensor(tensor& t) override;
  void set_tensor(tensor& t, const void* data, size_t offset, size_t size) override;
  void get_tensor(const tensor& t, void* data, size_t offset, size_t size) override;
  void memset_tensor(tensor& t, uint8_t value, size_t offset, size_t size) override;
  bool copy_tensor(const tensor& src, tensor& dst) override;
  void clear(uint8_t value) override;

  // Byte offset of t's data in this buffer.
  uint64_t offset_of(const tensor& t) const;
  remote_buffer remote() const { return rb_; }
  const client& owner() const { return *client_; }

 private:
  std::shared_ptr<client> client_;
  remote_buffer rb_;
  void* base_;
};

class rpc_device final : public device_i {
 public:
  rpc_device(std::shared_ptr<client> c, uint32_t index, device_info info, size_t alignment, size_t max_size);

  std::string_view name() const override { return name_; }
  std::string description() const override;
  device_type type() const override;
  // A peer's CPU of protocol 2.1 or newer: its layers keep the CPU's KV layout and attention (flash_attn,
  // masked products), so that they give the local CPU's bits. Older peers cannot rebuild those nodes.
  bool cpu_kernels() const override;
  device_memory memory() const override;
  device_caps caps() const override { return {}; }
  backend_ptr init_backend() override;
  buffer_type_i& buffer_type() override { return buft_; }
  bool supports_op(const tensor& t) const override;
  bool supports_buft(const buffer_type_i& b) const override { return &b == &buft_; }

  client& conn() const { return *client_; }
  const std::shared_ptr<client>& conn_ptr() const { return client_; }
  uint32_t index() const { return index_; }
  const device_info& info() const { return info_; }

 private:
  // The peer's answers to supports_op, per distinct question (the op, its parameters, the types, shapes and
  // strides of the node and its sources), for the current connection (a reconnect may reach another
  // process, and clears them).
  mutable std::mutex answers_mu_;
  mutable std::unordered_map<std::string, bool> answers_;
  mutable uint64_t answers_epoch_ = 0;

  std::shared_ptr<client> client_;
  uint32_t index_;
  device_info info_;
  version peer_version_;  // the peer's protocol when the device was found: what its graphs may hold
  std::string name_;
  rpc_buffer_type buft_;
};

// The graph_compute message for g on dev: u32 entry count, then the entries (leafs: memory the graph reads
// that it does not compute; nodes: in order). Throws backend_error when a tensor is not in a buffer of dev's
// connection (or of an earlier connection: lost), or has no memory.
std::vector<uint8_t> serialize_graph(const graph& g, const rpc_device& dev);
// A tensor's wire description (shape, strides, op, parameters, place); sources are not set.
wire_tensor to_wire(const tensor& t, const rpc_buffer* buf);
// The supports_op question for a node (after the device index): u32 entry count, then its distinct sources
// as leafs without a place (type, shape, strides), then the node (op, type, shape, strides, parameters,
// sources by entry index). Everything a device's supports_op looks at, and nothing of where the tensors live:
// equal questions get equal answers.
std::vector<uint8_t> op_question(const tensor& node);

}  // namespace troupe::rpc
