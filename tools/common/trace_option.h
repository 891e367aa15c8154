// --trace FILE for the programs (troupe-chat, troupe serve; troupe bench writes its own): tracing on from the
// guard's construction, the Chrome trace (runtime/trace.h) written when it goes, whichever way the program
// ends. A file that cannot be written is reported on stderr, not thrown.
//
//   std::string trace_path;
//   cli::add_trace_option(app, trace_path);
//   ... app.parse ...
//   cli::trace_guard tracing(trace_path);   // "" : nothing
#pragma once

#include <CLI/CLI.hpp>

#include <cstdio>
#include <exception>
#include <string>

#include "runtime/trace.h"

namespace troupe::cli {

inline void add_trace_option(CLI::App& app, std::string& path) {
  app.add_option("--trace", path, "write a Chrome trace (Perfetto, chrome://tracing) of the run: a track per device");
}

class trace_guard {
 public:
  explicit trace_guard(std::string path) : path_(std::move(path)) {
    if (!path_.empty()) trace::enable(true);
  }
  ~trace_guard() {
    if (path_.empty()) return;
    trace::enable(false);
    try {
      trace::write(path_);
    } catch (const std::exception& e) {
      std::fprintf(stderr, "%s\n", e.what());
    }
  }
  trace_guard(const trace_guard&) = delete;
  trace_guard& operator=(const trace_guard&) = delete;

 private:
  std::string path_;
};

}  // namespace troupe::cli
