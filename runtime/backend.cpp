#include "runtime/backend.h"

#include <algorithm>
#include <mutex>
#include <string>

#include "runtime/error.h"

namespace troupe {

std::string_view device_type_name(device_type t) {
  switch (t) {
    case device_type::cpu: return "cpu";
    case device_type::gpu: return "gpu";
    case device_type::igpu: return "igpu";
    case device_type::accel: return "accel";
  }
  return "unknown";
}

void backend_i::set_tensor_async(tensor& t, const void* data, size_t offset, size_t size) {
  tensor_set(t, data, offset, size);
}

void backend_i::get_tensor_async(const tensor& t, void* data, size_t offset, size_t size) {
  tensor_get(t, data, offset, size);
}

bool backend_i::finish_oldest(std::chrono::microseconds, int) {
  synchronize();
  return true;
}

bool backend_i::supports_op(const tensor& t) const { return device().supports_op(t); }

bool backend_i::supports_buft(const buffer_type_i& b) const { return device().supports_buft(b); }

buffer_ptr device_i::buffer_from_host_ptr(void*, size_t, size_t) {
  throw backend_error("device " + std::string(name()) + " cannot wrap host memory in a buffer");
}

// ---- registry ----

namespace {
std::mutex& registry_mutex() {
  static std::mutex m;
  return m;
}
}  // namespace

registry& registry::instance() {
  static registry r;
  return r;
}

device_i& registry::add(std::unique_ptr<device_i> dev) {
  device_i& d = add(*dev);
  if (&d == dev.get()) {
    std::lock_guard lock(registry_mutex());
    owned_.push_back(std::move(dev));
  }
  return d;
}

device_i& registry::add(device_i& dev) {
  std::lock_guard lock(registry_mutex());
  for (device_i* d : devices_) {
    if (d->name() == dev.name()) return *d;
  }
  devices_.push_back(&dev);
  return dev;
}

std::vector<device_i*> registry::devices() const {
  std::lock_guard lock(registry_mutex());
  return devices_;
}

device_i* registry::find(std::string_view name) const {
  std::lock_guard lock(registry_mutex());
  for (device_i* d : devices_) {
    if (d->name() == name) return d;
  }
  return nullptr;
}

device_i* registry::first_of(device_type t) const {
  std::lock_guard lock(registry_mutex());
  for (device_i* d : devices_) {
    if (d->type() == t) return d;
  }
  return nullptr;
}

// ---- placement ----

namespace {

std::string where(const tensor& t) { return "tensor " + describe(t); }

void check_range(const tensor& t, size_t offset, size_t size, const char* what) {
  if (t.buffer == nullptr || t.data == nullptr) {
    throw backend_error(std::string(what) + ": " + where(t) + " has no buffer");
  }
  const size_t n = nbytes(t);
  if (offset > n || size > n - offset) {
    throw backend_error(std::string(what) + ": bytes [" + std::to_string(offset) + ", " +
                        std::to_string(offset + size) + ") are outside " + where(t) + " (" + std::to_string(n) +
                        " bytes)");
  }
}

}  // namespace

void tensor_alloc(buffer_i& buf, tensor& t, void* addr) {
  auto* base = static_cast<char*>(buf.base());
  auto* p = static_cast<char*>(addr);
  const size_t size = buf.type().alloc_size(t);
  if (p < base || static_cast<size_t>(p - base) > buf.size() || size > buf.size() - static_cast<size_t>(p - base)) {
    throw backend_error("tensor_alloc: " + where(t) + " (" + std::to_string(size) + " bytes) does not fit its buffer");
  }
  t.buffer = &buf;
  t.data = addr;
  buf.init_tensor(t);
}

void view_init(tensor& t) {
  if (t.view_src == nullptr) throw backend_error("view_init: " + where(t) + " is not a view");
  if (t.view_src->buffer == nullptr) {
    throw backend_error("view_init: the source of " + where(t) + " is not placed");
  }
  t.buffer = t.view_src->buffer;
  t.data = static_cast<char*>(t.view_src->data) + t.view_offs;
  t.buffer->init_tensor(t);
}

buffer_ptr alloc_ctx_tensors(context& ctx, buffer_type_i& bt) {
  const size_t align = bt.alignment();
  auto pad = [align](size_t x) { return (x + align - 1) / align * align; };
  size_t total = 0;
  ctx.for_each([&](tensor* t) {
    if (t->data == nullptr && t->view_src == nullptr) total += pad(bt.alloc_size(*t));
  });
  if (total == 0) return nullptr;
  if (total > bt.max_size()) {
    throw out_of_memory_error("alloc_ctx_tensors: " + std::to_string(total) + " bytes exceed the max buffer size " +
                              std::to_string(bt.max_size()) + " of buffer type " + std::string(bt.name()));
  }
  buffer_ptr buf = bt.alloc_buffer(total);
  auto* base = static_cast<char*>(buf->base());
  size_t offs = 0;
  ctx.for_each([&](tensor* t) {
    if (t->data == nullptr && t->view_src == nullptr) {
      tensor_alloc(*buf, *t, base + offs);
      offs += pad(bt.alloc_size(*t));
    }
  });
  ctx.for_each([&](tensor* t) {
    if (t->view_src != nullptr && t->buffer == nullptr && t->view_src->buffer == buf.get()) view_init(*t);
  });
  return buf;
}

void tensor_set(tensor& t, const void* data, size_t offset, size_t size) {
  if (size == 0) return;
  check_range(t, offset, size, "tensor_set");
  t.buffer->set_tensor(t, data, offset, size);
}

void tensor_get(const tensor& t, void* data, size_t offset, size_t size) {
  if (size == 0) return;
  check_range(t, offset, size, "tensor_get");
  t.buffer->get_tensor(t, data, offset, size);
}

void tensor_memset(tensor& t, uint8_t value, size_t offset, size_t size) {
  if (size == 0) return;
  check_range(t, offset, size, "tensor_memset");
  t.buffer->memset_tensor(t, value, offset, size);
}

void tensor_copy(const tensor& src, tensor& dst) {
  const size_t n = nbytes(src);
  if (n != nbytes(dst)) {
    throw backend_error("tensor_copy: " + where(src) + " and " + where(dst) + " differ in size");
  }
  check_range(src, 0, n, "tensor_copy");
  check_range(dst, 0, n, "tensor_copy");
  if (dst.buffer->copy_tensor(src, dst)) return;
  if (src.buffer->is_host()) {
    dst.buffer->set_tensor(dst, src.data, 0, n);
  } else if (dst.buffer->is_host()) {
    src.buffer->get_tensor(src, dst.data, 0, n);
  } else {
    std::vector<uint8_t> staging(n);
    src.buffer->get_tensor(src, staging.data(), 0, n);
    dst.buffer->set_tensor(dst, staging.data(), 0, n);
  }
}

}  // namespace troupe
