// A test device whose default buffer type is host memory it cannot wrap around existing memory: weights
// placed on it are allocated and copied, as on a GPU. Computes nothing (init_backend returns null).
#pragma once

#include <memory>
#include <string>

#include "backends/cpu/cpu_backend.h"
#include "runtime/backend.h"

namespace troupe::testing {

class copy_device final : public device_i {
 public:
  explicit copy_device(std::string name) : name_(std::move(name)), buft_(cpu::make_host_buffer_type(name_ + "_buf")) {}
  std::string_view name() const override { return name_; }
  std::string description() const override { return "copying test device"; }
  device_type type() const override { return device_type::accel; }
  device_memory memory() const override { return {}; }
  device_caps caps() const override { return {}; }
  backend_ptr init_backend() override { return nullptr; }
  buffer_type_i& buffer_type() override { return *buft_; }
  bool supports_op(const tensor&) const override { return true; }
  bool supports_buft(const buffer_type_i& b) const override { return &b == buft_.get(); }

 private:
  std::string name_;
  std::unique_ptr<buffer_type_i> buft_;
};

}  // namespace troupe::testing
