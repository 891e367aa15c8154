#include "runtime/trace.h"

#include <atomic>
#include <cstdio>
#include <fstream>
#include <map>
#include <mutex>

#include "runtime/error.h"

namespace troupe::trace {

namespace {

struct state {
  std::atomic<bool> on{false};
  std::mutex mu;
  std::vector<event> events;
  std::chrono::steady_clock::time_point origin = std::chrono::steady_clock::now();
};

state& st() {
  static state s;
  return s;
}

int64_t micros(std::chrono::steady_clock::duration d) { return std::chrono::duration_cast<std::chrono::microseconds>(d).count(); }

void escape_into(std::string& out, std::string_view s) {
  for (char c : s) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += c;
    } else if (static_cast<unsigned char>(c) < 0x20) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\u%04x", static_cast<unsigned>(static_cast<unsigned char>(c)));
      out += buf;
    } else {
      out += c;
    }
  }
}

}  // namespace

void enable(bool on) {
  state& s = st();
  std::lock_guard lock(s.mu);
  if (on && !s.on.load()) s.origin = std::chrono::steady_clock::now();
  s.on.store(on, std::memory_order_relaxed);
}

bool enabled() { return st().on.load(std::memory_order_relaxed); }

std::vector<event> events() {
  state& s = st();
  std::lock_guard lock(s.mu);
  return s.events;
}

void clear() {
  state& s = st();
  std::lock_guard lock(s.mu);
  s.events.clear();
}

std::string to_json(const std::vector<event>& ev) {
  std::map<std::string, int> tids;  // a thread id per track, in order of first appearance
  for (const event& e : ev) tids.emplace(e.track, static_cast<int>(tids.size()) + 1);
  std::string out = "{\"displayTimeUnit\":\"ms\",\"traceEvents\":[\n";
  out += "{\"ph\":\"M\",\"pid\":1,\"tid\":0,\"name\":\"process_name\",\"args\":{\"name\":\"troupe\"}}";
  for (const auto& [track, tid] : tids) {
    out += ",\n{\"ph\":\"M\",\"pid\":1,\"tid\":" + std::to_string(tid) + ",\"name\":\"thread_name\",\"args\":{\"name\":\"";
    escape_into(out, track);
    out += "\"}}";
  }
  for (const event& e : ev) {
    out += ",\n{\"ph\":\"X\",\"pid\":1,\"tid\":" + std::to_string(tids[e.track]) + ",\"ts\":" + std::to_string(e.begin_us) +
           ",\"dur\":" + std::to_string(e.dur_us) + ",\"name\":\"";
    escape_into(out, e.name);
    out += "\",\"args\":{";
    for (size_t i = 0; i < e.args.size(); ++i) {
      out += i ? ",\"" : "\"";
      escape_into(out, e.args[i].first);
      out += "\":" + std::to_string(e.args[i].second);
    }
    out += "}}";
  }
  out += "\n]}\n";
  return out;
}

void write(const std::string& path) {
  const std::string json = to_json(events());
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  if (!f) throw error("trace: cannot write " + path);
  f << json;
  f.flush();
  if (!f) throw error("trace: writing " + path + " failed");
}

span::span(std::string_view track, std::string_view name, std::initializer_list<std::pair<const char*, int64_t>> args)
    : on_(enabled()) {
  if (!on_) return;
  ev_.track = track;
  ev_.name = name;
  for (const auto& [k, v] : args) ev_.args.emplace_back(k, v);
  t0_ = std::chrono::steady_clock::now();
}

namespace {

void add(event ev, std::chrono::steady_clock::time_point t0, std::chrono::steady_clock::time_point t1) {
  state& s = st();
  std::lock_guard lock(s.mu);
  ev.begin_us = micros(t0 - s.origin);
  ev.dur_us = micros(t1 - t0);
  s.events.push_back(std::move(ev));
}

}  // namespace

span::~span() {
  if (on_) add(std::move(ev_), t0_, std::chrono::steady_clock::now());
}

void record(std::string_view track, std::string_view name, std::initializer_list<std::pair<const char*, int64_t>> args,
            std::chrono::steady_clock::time_point begin, std::chrono::steady_clock::time_point end) {
  if (!enabled()) return;
  event ev;
  ev.track = track;
  ev.name = name;
  for (const auto& [k, v] : args) ev.args.emplace_back(k, v);
  add(std::move(ev), begin, end);
}

}  // namespace troupe::trace
