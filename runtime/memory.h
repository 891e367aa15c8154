// Memory accounting: bytes per buffer type, split into model (weights), context (KV cache, recurrent
// state) and compute (graph buffers), and the per-device breakdown table users see.
//
//   memory_ledger ledger;
//   ledger.add({"CUDA0", "CUDA0", false}, memory_kind::model, weights_bytes);
//   ledger.add({"CPU", "", true}, memory_kind::compute, 64 << 20);
//   std::cout << format_memory_table(ledger, {{"CUDA0", "NVIDIA GeForce RTX 4090", total, free}});
//
//   troupe_memory_breakdown_print: | memory breakdown [MiB] | total   free    self   model   context   compute    unaccounted |
//   troupe_memory_breakdown_print: |   - CUDA0 (RTX 4090)   | 24080 = 18000 + (5980 =  5000 +     880 +     100) +         100 |
//   troupe_memory_breakdown_print: |   - Host               |                   64 =      0 +       0 +      64                |
//
// llama.cpp's layout (llama_memory_breakdown_print) line for line: a prefix naming the printer, "|" around
// every line, MiB truncated, the Host row always.
// A device row reads total = free + (self = model + context + compute) + unaccounted, where unaccounted =
// total - free - self (other processes, driver overhead; negative when the device reports less in use
// than troupe holds). The Host row sums every host buffer type. Buffer types that belong to no listed
// device and are not host memory get a row of their own (self only).
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <vector>

namespace troupe {

enum class memory_kind : uint8_t { model, context, compute };
std::string_view memory_kind_name(memory_kind k);

struct memory_usage {
  size_t model = 0;
  size_t context = 0;
  size_t compute = 0;
  size_t self() const { return model + context + compute; }
  size_t& operator[](memory_kind k);
  size_t operator[](memory_kind k) const;
  friend bool operator==(const memory_usage&, const memory_usage&) = default;
};

// Where a buffer type's memory lives.
struct buffer_type_key {
  std::string buft;    // buffer type name, unique: "CPU", "CUDA0", "CUDA_Host", "RPC[10.0.0.2:50052]"
  std::string device;  // device name the memory belongs to, "" for none
  bool is_host = false;
  friend bool operator<(const buffer_type_key& a, const buffer_type_key& b) { return a.buft < b.buft; }
};

// Running totals per buffer type. Not thread-safe: the memory-accounting actor owns one.
class memory_ledger {
 public:
  // Records an allocation (bytes > 0) or a release (bytes < 0). A release larger than what is recorded
  // throws error naming the buffer type and kind (it would mean double accounting somewhere).
  void add(const buffer_type_key& key, memory_kind kind, int64_t bytes);
  memory_usage usage(const std::string& buft) const;
  const std::map<buffer_type_key, memory_usage>& entries() const { return entries_; }
  memory_usage total() const;

 private:
  std::map<buffer_type_key, memory_usage> entries_;
};

struct device_memory_info {
  std::string name;
  std::string description;
  size_t total = 0;
  size_t free = 0;
};

// One row of the breakdown, in bytes.
struct memory_row {
  enum class kind : uint8_t { device, host, other } what = kind::device;
  std::string label;  // "CUDA0 (RTX 4090)", "Host", "CUDA0_REPACK"
  size_t total = 0, free = 0;
  memory_usage self;
  int64_t unaccounted = 0;
};

// The rows: one per device (in the given order), Host (always), then every other buffer type with usage.
std::vector<memory_row> memory_rows(const memory_ledger& ledger, const std::vector<device_memory_info>& devices);

// The table in MiB (truncated), columns aligned, one line per row with '\n' after each, each line starting
// with `prefix` and ": ".
inline constexpr std::string_view memory_table_prefix = "troupe_memory_breakdown_print";
std::string format_memory_table(const memory_ledger& ledger, const std::vector<device_memory_info>& devices,
                                std::string_view prefix = memory_table_prefix);
// The same data as JSON, in bytes: {"devices":[...],"host":{...},"other":[...]}.
std::string format_memory_json(const memory_ledger& ledger, const std::vector<device_memory_info>& devices);

// "NVIDIA GeForce RTX 4090" -> "RTX 4090": drops the vendor and brand words NVIDIA, GeForce, Tesla, AMD,
// Radeon, Instinct, each in turn where the description starts with it (as llama.cpp strips them).
std::string strip_vendor(const std::string& description);

}  // namespace troupe
