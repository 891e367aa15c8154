#include "actors/model_settings.h"

#include <algorithm>
#include <regex>

#include "llm/chat_template.h"
#include "llm/kv_cache.h"

namespace troupe::actors {

type model_settings::kv_cache_type() const { return llm::kv_cache_type_named(kv_type).value_or(type::f16); }

type model_settings::kv_cache_type_v() const {
  return llm::kv_cache_type_named(kv_type_v.empty() ? kv_type : kv_type_v).value_or(type::f16);
}

uint32_t model_settings::embedding_cells() const {
  const uint32_t share = std::max<uint32_t>(1, n_ctx / std::max<uint32_t>(n_seq_max, 1));
  return n_ctx_seq > 0 ? std::min(share, n_ctx_seq) : share;
}

void model_settings::validate() const {
  if (name.empty() || path.empty()) throw settings_error("", "a model needs a name and a path");
  if (n_ctx == 0 || n_seq_max == 0 || n_batch == 0 || n_ubatch == 0) {
    throw settings_error("", "n_ctx, n_batch, n_ubatch and n_seq_max must be positive");
  }
  if (n_pipeline == 0 || n_pipeline > 64) {
    throw settings_error("n_pipeline", "n_pipeline " + std::to_string(n_pipeline) + " is outside 1..64");
  }
  if (placement != "" && placement != "cluster" && placement != "auto") {
    throw settings_error("placement", "placement must be \"cluster\" or \"auto\" (or absent), not \"" + placement + "\"");
  }
  if (!placement.empty() && !devices.empty()) {
    throw settings_error("placement", "placement = \"" + placement + "\" places the layers itself: give no devices");
  }
  if (min_nodes == 0 || min_nodes > 1024) {
    throw settings_error("min_nodes", "min_nodes " + std::to_string(min_nodes) + " is outside 1..1024");
  }
  if (n_ctx_seq > n_ctx) {
    throw settings_error("n_ctx_seq", "n_ctx_seq (" + std::to_string(n_ctx_seq) + ") is larger than n_ctx (" +
                                          std::to_string(n_ctx) + ")");
  }
  if (flash_attn != "auto" && flash_attn != "on" && flash_attn != "off") {
    throw settings_error("flash_attn", "flash_attn must be \"auto\", \"on\" or \"off\", not \"" + flash_attn + "\"");
  }
  if (!llm::kv_cache_type_named(kv_type)) {
    throw settings_error("kv_type", "kv_type (cache_type_k) must be one of " + std::string(llm::kv_cache_type_names()) +
                                        ", not \"" + kv_type + "\"");
  }
  if (!kv_type_v.empty() && !llm::kv_cache_type_named(kv_type_v)) {
    throw settings_error("kv_type_v", "cache_type_v must be one of " + std::string(llm::kv_cache_type_names()) +
                                          ", not \"" + kv_type_v + "\"");
  }
  if (!chat_template.empty()) {
    try {
      (void)llm::chat_template::named(chat_template);
    } catch (const std::exception& e) {
      throw settings_error("chat_template", "chat_template: " + std::string(e.what()));
    }
  }
  if (!chat_template.empty() && !chat_template_file.empty()) {
    throw settings_error("chat_template_file", "chat_template_file and chat_template are exclusive: one template per model");
  }
  for (const tensor_override& o : overrides) {
    if (o.pattern.empty() || o.device.empty()) throw settings_error("overrides", "overrides entries need a pattern and a device");
    try {
      (void)std::regex(o.pattern);
    } catch (const std::regex_error& re) {
      throw settings_error("overrides", "overrides: invalid regex '" + o.pattern + "': " + re.what());
    }
  }
  for (const device_layers& d : devices) {
    if (d.device.empty()) throw settings_error("devices", "devices entries need a device");
  }
  if (load != "" && load != "startup" && load != "on_demand") {
    throw settings_error("load", "load must be \"startup\" or \"on_demand\", not \"" + load + "\"");
  }
  if (load == "on_demand" && placement == "cluster") {
    throw settings_error("load", "a model with placement = \"cluster\" loads at start (its nodes hold it): load = \"on_demand\" does not apply");
  }
  if (keep_alive_ms < -1 && keep_alive_ms != keep_alive_default) {
    throw settings_error("keep_alive", "keep_alive " + std::to_string(keep_alive_ms) + " ms is negative (-1: for ever)");
  }
}

std::optional<int64_t> parse_keep_alive(std::string_view text) {
  // Whitespace around it is tolerated; a sign, then either a bare number (seconds) or number-unit pairs.
  while (!text.empty() && (text.front() == ' ' || text.front() == '\t')) text.remove_prefix(1);
  while (!text.empty() && (text.back() == ' ' || text.back() == '\t')) text.remove_suffix(1);
  if (text.empty()) return std::nullopt;
  bool negative = false;
  if (text.front() == '-' || text.front() == '+') {
    negative = text.front() == '-';
    text.remove_prefix(1);
  }
  const auto number = [&](double& out) {
    size_t i = 0;
    bool digits = false, dot = false;
    while (i < text.size() && ((text[i] >= '0' && text[i] <= '9') || (text[i] == '.' && !dot))) {
      dot = dot || text[i] == '.';
      digits = digits || text[i] != '.';
      ++i;
    }
    if (!digits || i > 24) return false;
    out = std::stod(std::string(text.substr(0, i)));
    text.remove_prefix(i);
    return true;
  };
  double total_ms = 0;
  double v = 0;
  if (!number(v)) return std::nullopt;
  if (text.empty()) {
    total_ms = v * 1000;  // seconds
  } else {
    for (;;) {
      // The longest unit first: "ms" before "m".
      static constexpr std::pair<std::string_view, double> units[] = {{"ns", 1e-6}, {"us", 1e-3}, {"\xC2\xB5s", 1e-3}, {"ms", 1.0},
                                                                      {"s", 1e3},   {"m", 6e4},   {"h", 3.6e6}};
      bool found = false;
      for (const auto& [u, scale] : units) {
        if (text.substr(0, u.size()) == u) {
          total_ms += v * scale;
          text.remove_prefix(u.size());
          found = true;
          break;
        }
      }
      if (!found) return std::nullopt;
      if (text.empty()) break;
      if (!number(v)) return std::nullopt;
    }
  }
  if (negative && total_ms > 0) return -1;
  if (total_ms > 1e15) return std::nullopt;  // (beyond any daemon's life; also keeps the cast defined)
  return static_cast<int64_t>(total_ms);
}

model_settings model_settings::resolved() const {
  validate();
  model_settings r = *this;
  if (r.n_ctx_seq == 0) r.n_ctx_seq = r.n_ctx;
  return r;
}

}  // namespace troupe::actors
