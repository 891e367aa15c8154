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
  static const char* const vendor_words[] = {"NVIDIA", "GeForce", "Tesla", "AMD", "Radeon", "Instinct"};
  std::istringstream in(description);
  std::string word, out;
  while (in >> word) {
    if (std::find(std::begin(vendor_words), std::end(vendor_words), word) != std::end(vendor_words)) continue;
    if (!out.empty()) out += ' ';
    out += word;
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
    const std::string desc = strip_vendor(d.description);
    r.label = desc.empty() ? d.name : d.name + " (" + desc + ")";
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
  bool any_host = false;
  size_t i = 0;
  for (const auto& [k, u] : ledger.entries()) {
    if (k.is_host) {
      add_usage(host.self, u);
      shown[i] = true;
      any_host = true;
    }
    ++i;
  }
  if (any_host || !devices.empty()) rows.push_back(host);
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

constexpr size_t mib = 1024 * 1024;

std::string to_mib(size_t bytes) { return std::to_string((bytes + mib / 2) / mib); }
std::string to_mib_signed(int64_t bytes) {
  return bytes < 0 ? "-" + to_mib(static_cast<size_t>(-bytes)) : to_mib(static_cast<size_t>(bytes));
}

std::string pad_left(const std::string& s, size_t w) { return s.size() >= w ? s : std::string(w - s.size(), ' ') + s; }
std::string pad_right(const std::string& s, size_t w) { return s.size() >= w ? s : s + std::string(w - s.size(), ' '); }

}  // namespace

std::string format_memory_table(const memory_ledger& ledger, const std::vector<device_memory_info>& devices) {
  const std::vector<memory_row> rows = memory_rows(ledger, devices);
  // Columns: total, free, self, model, context, compute, unaccounted; separators between them.
  static const char* const names[7] = {"total", "free", "self", "model", "context", "compute", "unaccounted"};
  static const char* const seps[6] = {" = ", " + (", " = ", " + ", " + ", ") + "};
  std::vector<std::array<std::string, 7>> cells;
  for (const memory_row& r : rows) {
    std::array<std::string, 7> c;
    if (r.what == memory_row::kind::device) {
      c[0] = to_mib(r.total);
      c[1] = to_mib(r.free);
      c[6] = to_mib_signed(r.unaccounted);
    }
    c[2] = to_mib(r.self.self());
    c[3] = to_mib(r.self.model);
    c[4] = to_mib(r.self.context);
    c[5] = to_mib(r.self.compute);
    cells.push_back(c);
  }
  size_t w[7];
  for (int j = 0; j < 7; ++j) {
    w[j] = std::string(names[j]).size();
    for (const auto& c : cells) w[j] = std::max(w[j], c[static_cast<size_t>(j)].size());
  }
  const std::string title = "memory breakdown [MiB]";
  size_t label_w = title.size();
  for (const memory_row& r : rows) label_w = std::max(label_w, r.label.size() + 4);

  std::ostringstream out;
  // Header: each name right-aligned over its column; separators become blanks.
  std::string line = pad_right(title, label_w) + " |";
  for (int j = 0; j < 7; ++j) {
    if (j > 0) line += std::string(std::string(seps[j - 1]).size(), ' ');
    else line += ' ';
    line += pad_left(names[j], w[j]);
  }
  out << line << '\n';
  for (size_t r = 0; r < rows.size(); ++r) {
    const auto& c = cells[r];
    line = pad_right("  - " + rows[r].label, label_w) + " |";
    const bool device = rows[r].what == memory_row::kind::device;
    line += ' ';
    if (device) {
      line += pad_left(c[0], w[0]) + seps[0] + pad_left(c[1], w[1]) + seps[1];
    } else {
      line += std::string(w[0] + std::string(seps[0]).size() + w[1] + std::string(seps[1]).size(), ' ');
    }
    line += pad_left(c[2], w[2]) + seps[2] + pad_left(c[3], w[3]) + seps[3] + pad_left(c[4], w[4]) + seps[4] +
            pad_left(c[5], w[5]);
    if (device) line += std::string(seps[5]) + pad_left(c[6], w[6]);
    // Trailing blanks would make the table fragile to compare and to paste.
    while (!line.empty() && line.back() == ' ') line.pop_back();
    out << line << '\n';
  }
  return out.str();
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
