// A Chrome trace of what ran where (Trace Event Format JSON, which Perfetto and chrome://tracing open): spans
// on tracks (a device's backend, "scheduler": micro-batches placed and finished, "transfers": split inputs),
// each with a name and arguments, recorded by any
// thread while tracing is on (troupe bench / troupe-chat / troupe serve --trace FILE).
//
//   trace::enable(true);
//   { trace::span s("CPU1", "split 1", {{"ubatch", 3}, {"split", 1}}); ... }   // one complete event
//   trace::write("trace.json");                                               // throws error naming the file
//
// Off (the default), a span costs one relaxed atomic load.
#pragma once

#include <chrono>
#include <cstdint>
#include <initializer_list>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace troupe::trace {

struct event {
  std::string track;  // a row of the trace ("CPU", "CPU1", "Vulkan0", "scheduler")
  std::string name;
  std::vector<std::pair<std::string, int64_t>> args;
  int64_t begin_us = 0;  // since tracing was enabled
  int64_t dur_us = 0;
};

void enable(bool on);
bool enabled();
// The events recorded since enable(true) (copies; thread-safe), in the order they ended.
std::vector<event> events();
void clear();
// The events as Trace Event Format JSON: a process "troupe", a thread per track (named by metadata events),
// complete ("X") events with microsecond timestamps.
std::string to_json(const std::vector<event>& ev);
// Writes to_json(events()) to path. Throws error naming the file when it cannot be written.
void write(const std::string& path);

// A complete event whose times were taken apart (a queued graph: from its submission to its finish).
void record(std::string_view track, std::string_view name, std::initializer_list<std::pair<const char*, int64_t>> args,
            std::chrono::steady_clock::time_point begin, std::chrono::steady_clock::time_point end);

class span {
 public:
  span(std::string_view track, std::string_view name, std::initializer_list<std::pair<const char*, int64_t>> args = {});
  ~span();
  span(const span&) = delete;
  span& operator=(const span&) = delete;

 private:
  bool on_;
  event ev_;
  std::chrono::steady_clock::time_point t0_;
};

}  // namespace troupe::trace
