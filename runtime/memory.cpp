#include "runtime/memory.h"

#include <algorithm>
#include <array>
#include <cstdio>
#include <sstream>

#include "runtime/error.h"

namespace troupe {

std::string_view memory_kind_name(memory_kind k) {
  switch (k) {
    case memory_kind::model: return "model";
    case memory_kind::context: return "context";
    case memory_kind::compute: return "compute";
  }
  return "unknown";
}

size_t& memory_usage::operator[](memory_kind k) {
  switch (k) {
    case memory_kind::model: return model;
    case memory_kind::context: return context;
    case memory_kind::compute: break;
  }
  return compute;
}

size_t memory_usage::operator[](memory_kind k) const { return (*const_cast<memory_usage*>(this))[k]; }

void memory_ledger::add(const buffer_type_key& key, memory_kind kind, int64_t bytes) {
  auto it = entries_.find(key);
  if (it == entries_.end()) it = entries_.emplace(key, memory_usage{}).first;
  size_t& v = it->second[kind];
  if (bytes < 0 && static_cast<size_t>(-bytes) > v) {
    throw error("memory ledger: releasing " + std::to_string(-bytes) + " bytes of " + std::string(memory_kind_name(kind)) +
                " memory from buffer type " + key.buft + ", which holds " + std::to_string(v));
  }
  v = bytes < 0 ? v - static_cast<size_t>(-bytes) : v + static_cast<size_t>(bytes);
}

memory_usage memory_ledger::usage(const std::string& buft) const {
  const auto it = entries_.find(buffer_type_key{buft, "", false});
  return it == entries_.end() ? memory_usage{} : it->second;
}

memory_usage memory_ledger::total() const {
  memory_usage t;
  for (const auto& [k, u] : entries_) {
    t.model += u.model;
    t.context += u.context;
    t.compute += u.compute;
  }
  return t;
}

std::string strip_vendor(const std::string& description) {
  // As llama.cpp: each word in turn, only where the description (what is left of it) starts with it.
  static const char* const vendor_prefixes[] = {"NVIDIA ", "GeForce ", "Tesla ", "AMD ", "Radeon ", "Instinct "};
  std::string out = description;
  for (const char* prefix : vendor_prefixes) {
    if (out.starts_with(prefix)) out.erase(0, std::string_view(prefix).size());
  }
  return out;
}

std::vector<memory_row> memory_rows(const memory_ledger& ledger, const std::vector<device_memory_info>& devices) {
  std::vector<memory_row> rows;
  std::vector<bool> shown(ledger.entries().size(), false);
  auto add_usage = [](memory_usage& to, const memory_usage& u) {
    to.model += u.model;
    to.context += u.context;
    to.compute += u.compute;
  };
  for (const device_memory_info& d : devices) {
    memory_row r;
    r.what = memory_row::kind::device;
    r.label = d.name + " (" + strip_vendor(d.description) + ")";
    r.total = d.total;
    r.free = d.free;
    size_t i = 0;
    for (const auto& [k, u] : ledger.entries()) {
      if (!k.is_host && k.device == d.name) {
        add_usage(r.self, u);
        shown[i] = true;
      }
      ++i;
    }
    r.unaccounted = static_cast<int64_t>(r.total) - static_cast<int64_t>(r.free) - static_cast<int64_t>(r.self.self());
    rows.push_back(r);
  }
  memory_row host;
  host.what = memory_row::kind::host;
  host.label = "Host";
  size_t i = 0;
  for (const auto& [k, u] : ledger.entries()) {
    if (k.is_host) {
      add_usage(host.self, u);
      shown[i] = true;
    }
    ++i;
  }
  rows.push_back(host);  // always: llama.cpp's breakdown prints the Host row even when empty
  i = 0;
  for (const auto& [k, u] : ledger.entries()) {
    if (!shown[i] && u.self() > 0) {
      memory_row r;
      r.what = memory_row::kind::other;
      r.label = k.buft;
      r.self = u;
      rows.push_back(r);
    }
    ++i;
  }
  return rows;
}

namespace {

constexpr int64_t mib = 1024 * 1024;

// Whole MiB, truncated (as llama.cpp prints them); negative values toward zero.
std::string to_mib(int64_t bytes) { return std::to_string(bytes / mib); }

}  // namespace

std::string format_memory_table(const memory_ledger& ledger, const std::vector<device_memory_info>& devices,
                                std::string_view prefix) {
  const std::vector<memory_row> rows = memory_rows(ledger, devices);
  // llama.cpp's layout: per line the prefix, then "| label | ... |": the label left-aligned, every number
  // right-aligned in its column (as wide as its widest cell or name); device rows read
  // "total = free + (self = model + context + compute) + unaccounted", the others leave total, free and
  // unaccounted blank and read "self = model + context + compute"; the header puts blanks where the
  // separators go.
  struct line_cells {
    enum class shape : uint8_t { header, device, other } form;
    std::array<std::string, 8> c;  // label, total, free, self, model, context, compute, unaccounted
  };
  std::vector<line_cells> lines;
  lines.push_back({line_cells::shape::header,
                   {"memory breakdown [MiB]", "total", "free", "self", "model", "context", "compute", "unaccounted"}});
  for (const memory_row& r : rows) {
    line_cells l{r.what == memory_row::kind::device ? line_cells::shape::device : line_cells::shape::other, {}};
    l.c[0] = "  - " + r.label;
    if (l.form == line_cells::shape::device) {
      l.c[1] = to_mib(static_cast<int64_t>(r.total));
      l.c[2] = to_mib(static_cast<int64_t>(r.free));
      l.c[7] = to_mib(r.unaccounted);  // signed (llama.cpp prints it unsigned, so a negative value wraps around there)
    }
    l.c[3] = to_mib(static_cast<int64_t>(r.self.self()));
    l.c[4] = to_mib(static_cast<int64_t>(r.self.model));
    l.c[5] = to_mib(static_cast<int64_t>(r.self.context));
    l.c[6] = to_mib(static_cast<int64_t>(r.self.compute));
    lines.push_back(l);
  }
  for (size_t j = 0; j < 8; ++j) {
    size_t w = 0;
    for (const line_cells& l : lines) w = std::max(w, l.c[j].size());
    for (line_cells& l : lines) {
      const std::string pad(w - l.c[j].size(), ' ');
      l.c[j] = j == 0 ? l.c[j] + pad : pad + l.c[j];
    }
  }
  std::string out;
  for (const line_cells& l : lines) {
    const auto& c = l.c;
    out += std::string(prefix) + ": | " + c[0] + " | ";
    switch (l.form) {
      case line_cells::shape::header:
        out += c[1] + "   " + c[2] + "    " + c[3] + "   " + c[4] + "   " + c[5] + "   " + c[6] + "    " + c[7];
        break;
      case line_cells::shape::device:
        out += c[1] + " = " + c[2] + " + (" + c[3] + " = " + c[4] + " + " + c[5] + " + " + c[6] + ") + " + c[7];
        break;
      case line_cells::shape::other:
        out += c[1] + "   " + c[2] + "    " + c[3] + " = " + c[4] + " + " + c[5] + " + " + c[6] + "    " + c[7];
        break;
    }
    out += " |\n";
  }
  return out;
}

namespace {

std::string json_string(const std::string& s) {
  std::string out = "\"";
  for (char ch : s) {
    const auto c = static_cast<unsigned char>(ch);
    if (c == '"' || c == '\\') {
      out += '\\';
      out += ch;
    } else if (c < 0x20) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\u%04x", c);
      out += buf;
    } else {
      out += ch;
    }
  }
  return out + "\"";
}

std::string json_usage(const memory_usage& u) {
  return "\"self\":" + std::to_string(u.self()) + ",\"model\":" + std::to_string(u.model) +
         ",\"context\":" + std::to_string(u.context) + ",\"compute\":" + std::to_string(u.compute);
}

}  // namespace

std::string format_memory_json(const memory_ledger& ledger, const std::vector<device_memory_info>& devices) {
  const std::vector<memory_row> rows = memory_rows(ledger, devices);
  std::string dev = "[", other = "[", host = "null";
  size_t di = 0;
  for (const memory_row& r : rows) {
    if (r.what == memory_row::kind::device) {
      const device_memory_info& d = devices[di++];
      if (dev.size() > 1) dev += ',';
      dev += "{\"name\":" + json_string(d.name) + ",\"description\":" + json_string(strip_vendor(d.description)) +
             ",\"total\":" + std::to_string(r.total) + ",\"free\":" + std::to_string(r.free) + "," + json_usage(r.self) +
             ",\"unaccounted\":" + std::to_string(r.unaccounted) + "}";
    } else if (r.what == memory_row::kind::host) {
      host = "{" + json_usage(r.self) + "}";
    } else {
      if (other.size() > 1) other += ',';
      other += "{\"name\":" + json_string(r.label) + "," + json_usage(r.self) + "}";
    }
  }
  return "{\"unit\":\"bytes\",\"devices\":" + dev + "],\"host\":" + host + ",\"other\":" + other + "]}";
}

}  // namespace troupe
