#include "actors/engine_config.h"

#include <set>

#include "actors/config_toml.h"
#include "backends/rpc/wire/auth.h"
#include "runtime/error.h"
#include "llm/offload.h"

namespace troupe::actors {

using config_toml::check_keys;
using config_toml::fail;
using config_toml::get;

namespace {

// Each table of the array parent[key] (absent: none), given to read(table); anything else there is an error
// naming `what` ("[[peer]]", "model.devices") and the shape of its tables ("{device, layers}", or none).
template <class F>
void for_each_table(const toml::table& parent, const char* key, const std::string& what, const std::string& shape,
                    const std::string& source, F read) {
  const toml::node* n = parent.get(key);
  if (n == nullptr) return;
  const std::string wrong = what + " must be an array of " + (shape.empty() ? "" : shape + " ") + "tables";
  const toml::array* a = n->as_array();
  if (a == nullptr) fail(source, wrong, n->source());
  for (const toml::node& e : *a) {
    const toml::table* t = e.as_table();
    if (t == nullptr) fail(source, wrong, e.source());
    read(*t);
  }
}

// [[peer]] tables: name, address = "host:port", key_file, tls, tls_ca, busy_poll_us.
void parse_peers(const toml::table& root, engine_config& c, const std::string& source) {
  for_each_table(root, "peer", "[[peer]]", "", source, [&](const toml::table& t) {
    check_keys(t, {"name", "address", "key_file", "tls", "tls_ca", "busy_poll_us"}, "[[peer]]", source);
    peer_params p;
    p.name = get<std::string>(t, "name", "", "peer", source);
    const std::string address = get<std::string>(t, "address", "", "peer", source);
    if (p.name.empty() || address.empty()) fail(source, "a [[peer]] needs a name and an address (host:port)", t.source());
    for (const peer_params& q : c.peers) {
      if (q.name == p.name) fail(source, "peer '" + p.name + "' is configured twice", t.source());
    }
    rpc::endpoint e = rpc::split_endpoint(address);
    if (e.error != rpc::endpoint::fault::none) {
      fail(source, "peer.address must be host:port (\"[::1]:50052\" for IPv6), not \"" + address + "\"",
           t.get("address")->source());
    }
    p.host = std::move(e.host);
    p.port = e.port;
    p.key_file = get<std::string>(t, "key_file", "", "peer", source);
    p.tls = get<bool>(t, "tls", false, "peer", source);
    p.tls_ca_file = get<std::string>(t, "tls_ca", "", "peer", source);
    const auto busy_poll_us = static_cast<uint32_t>(p.busy_poll.count());
    p.busy_poll = std::chrono::microseconds(get<uint32_t>(t, "busy_poll_us", busy_poll_us, "peer", source));
    c.peers.push_back(std::move(p));
  });
}

// A [[model]] table: the model_settings fields (n_threads is `threads`), validated by model_settings with
// the error placed at the key at fault.
model_settings parse_model(const toml::table& t, const std::string& source) {
  check_keys(t, {"name", "path", "devices", "use_mmap", "huge_pages", "parallel", "n_ctx", "n_batch", "n_ubatch", "n_pipeline", "n_seq_max", "threads",
                 "n_ctx_seq", "prompt_cache_mib", "kv_type", "cache_type_k", "cache_type_v", "flash_attn", "context_shift", "chat_template", "chat_template_file", "aliases", "overrides", "cpu_moe", "n_cpu_moe", "placement", "min_nodes", "load", "keep_alive"},
             "[[model]]", source);
  model_settings m;
  m.name = get<std::string>(t, "name", "", "model", source);
  m.path = get<std::string>(t, "path", "", "model", source);
  m.use_mmap = get<bool>(t, "use_mmap", m.use_mmap, "model", source);
  m.huge_pages = get<bool>(t, "huge_pages", m.huge_pages, "model", source);
  m.parallel = get<bool>(t, "parallel", m.parallel, "model", source);
  m.n_ctx = get<uint32_t>(t, "n_ctx", m.n_ctx, "model", source);
  m.n_batch = get<uint32_t>(t, "n_batch", m.n_batch, "model", source);
  m.n_ubatch = get<uint32_t>(t, "n_ubatch", m.n_ubatch, "model", source);
  m.n_pipeline = get<uint32_t>(t, "n_pipeline", m.n_pipeline, "model", source);
  m.n_seq_max = get<uint32_t>(t, "n_seq_max", m.n_seq_max, "model", source);
  m.n_threads = get<int32_t>(t, "threads", m.n_threads, "model", source);
  m.n_ctx_seq = get<uint32_t>(t, "n_ctx_seq", m.n_ctx_seq, "model", source);
  m.prompt_cache_mib = get<uint32_t>(t, "prompt_cache_mib", m.prompt_cache_mib, "model", source);
  m.kv_type = get<std::string>(t, "kv_type", m.kv_type, "model", source);
  // llama-server's names: cache_type_k (K, as kv_type) and cache_type_v (V).
  m.kv_type = get<std::string>(t, "cache_type_k", m.kv_type, "model", source);
  m.kv_type_v = get<std::string>(t, "cache_type_v", m.kv_type_v, "model", source);
  m.flash_attn = get<std::string>(t, "flash_attn", m.flash_attn, "model", source);
  m.context_shift = get<bool>(t, "context_shift", m.context_shift, "model", source);
  m.chat_template = get<std::string>(t, "chat_template", m.chat_template, "model", source);
  m.chat_template_file = get<std::string>(t, "chat_template_file", m.chat_template_file, "model", source);
  if (const toml::node* a = t.get("aliases")) {
    const toml::array* list = a->as_array();
    if (list == nullptr) fail(source, "model.aliases must be an array of strings", a->source());
    for (const toml::node& e : *list) {
      const auto v = e.value<std::string>();
      if (!v || v->empty()) fail(source, "model.aliases must be an array of non-empty strings", e.source());
      m.aliases.push_back(*v);
    }
  }
  m.placement = get<std::string>(t, "placement", m.placement, "model", source);
  m.min_nodes = get<uint32_t>(t, "min_nodes", m.min_nodes, "model", source);
  m.load = get<std::string>(t, "load", m.load, "model", source);
  if (const toml::node* k = t.get("keep_alive")) {
    // Seconds (an integer or a float), or ollama's duration text.
    std::optional<int64_t> ms;
    if (const auto i = k->value<int64_t>(); i && k->is_integer()) {
      ms = *i < 0 ? -1 : (*i > int64_t{1} << 40 ? std::nullopt : std::optional<int64_t>(*i * 1000));
    } else if (const auto d = k->value<double>(); d && k->is_floating_point()) {
      ms = parse_keep_alive(std::to_string(*d));
    } else if (const auto str = k->value<std::string>()) {
      ms = parse_keep_alive(*str);
    }
    if (!ms) fail(source, "model.keep_alive must be seconds (-1: for ever) or a duration such as \"5m\" or \"30s\"", k->source());
    m.keep_alive_ms = *ms;
  }
  const std::string overrides = "model.overrides";
  for_each_table(t, "overrides", overrides, "{pattern, device}", source, [&](const toml::table& ot) {
    check_keys(ot, {"pattern", "device"}, overrides, source);
    m.overrides.push_back({get<std::string>(ot, "pattern", "", overrides, source), get<std::string>(ot, "device", "", overrides, source)});
  });
  // cpu_moe = true / n_cpu_moe = N: the experts of every layer / the first N layers on the CPU, as tensor
  // overrides after the table's own (--cpu-moe / --n-cpu-moe).
  const bool cpu_moe = get<bool>(t, "cpu_moe", false, "model", source);
  const uint32_t n_cpu_moe = get<uint32_t>(t, "n_cpu_moe", 0, "model", source);
  for (const std::string& p : llm::cpu_moe_patterns(cpu_moe, n_cpu_moe)) m.overrides.push_back({p, "CPU"});
  const std::string devices = "model.devices";
  for_each_table(t, "devices", devices, "{device, layers}", source, [&](const toml::table& dt) {
    check_keys(dt, {"device", "layers"}, devices, source);
    m.devices.push_back({get<std::string>(dt, "device", "", devices, source), get<int32_t>(dt, "layers", 0, devices, source)});
  });
  if (m.name.empty() || m.path.empty()) fail(source, "a [[model]] needs a name and a path", t.source());
  try {
    m.validate();
  } catch (const settings_error& e) {
    const toml::node* at = e.field().empty() ? nullptr : t.get(e.field());
    fail(source, "model." + std::string(e.what()), at != nullptr ? at->source() : t.source());
  }
  return m;
}

}  // namespace

engine_config parse_engine_config(std::string_view text, const std::string& source,
                                    const std::vector<std::string>& extra_sections) {
  toml::table root;
  try {
    root = toml::parse(text, source);
  } catch (const toml::parse_error& e) {
    fail(source, std::string(e.description()), e.source());
  }
  std::set<std::string> top = {"runtime", "model", "peer"};
  top.insert(extra_sections.begin(), extra_sections.end());
  check_keys(root, top, "the top level", source);
  engine_config c;
  if (const toml::node* rn = root.get("runtime")) {
    const toml::table* r = rn->as_table();
    if (r == nullptr) fail(source, "[runtime] must be a table", rn->source());
    check_keys(*r, {"devices", "cpu_instances", "cpu_instance_memory", "threads", "caf_threads", "caf_policy", "max_restarts", "flush_delay_us",
                     "dispatch_splits", "reload_on_peer_reconnect"},
               "[runtime]", source);
    if (const toml::node* d = r->get("devices")) {
      const toml::array* a = d->as_array();
      if (a == nullptr) fail(source, "runtime.devices must be an array of device names", d->source());
      for (const toml::node& e : *a) {
        const auto s = e.value<std::string>();
        if (!s) fail(source, "runtime.devices must be an array of device names", e.source());
        c.devices.push_back(*s);
      }
    }
    c.cpu_instances = get<int>(*r, "cpu_instances", c.cpu_instances, "runtime", source);
    c.cpu_instance_memory = get<uint64_t>(*r, "cpu_instance_memory", c.cpu_instance_memory, "runtime", source);
    c.n_threads = get<int>(*r, "threads", c.n_threads, "runtime", source);
    c.caf_threads = get<int>(*r, "caf_threads", c.caf_threads, "runtime", source);
    c.caf_policy = get<std::string>(*r, "caf_policy", c.caf_policy, "runtime", source);
    if (c.caf_policy != "sharing" && c.caf_policy != "stealing") {
      fail(source, "runtime.caf_policy must be \"sharing\" or \"stealing\", not \"" + c.caf_policy + "\"",
           r->get("caf_policy")->source());
    }
    c.max_restarts = get<uint32_t>(*r, "max_restarts", c.max_restarts, "runtime", source);
    c.flush_delay_us = get<uint32_t>(*r, "flush_delay_us", c.flush_delay_us, "runtime", source);
    c.dispatch_splits = get<bool>(*r, "dispatch_splits", c.dispatch_splits, "runtime", source);
    c.reload_on_peer_reconnect = get<bool>(*r, "reload_on_peer_reconnect", c.reload_on_peer_reconnect, "runtime", source);
  }
  // Every name and alias answers for one model only.
  std::set<std::string> names;
  for_each_table(root, "model", "[[model]]", "", source, [&](const toml::table& t) {
    c.models.push_back(parse_model(t, source));
    std::vector<std::string> own = {c.models.back().name};
    own.insert(own.end(), c.models.back().aliases.begin(), c.models.back().aliases.end());
    for (const std::string& n : own) {
      if (!names.insert(n).second) fail(source, "model name or alias '" + n + "' is given to two models", t.source());
    }
  });
  parse_peers(root, c, source);
  return c;
}

peer_params load_peer_key(peer_params p) {
  if (p.key_file.empty()) return p;
  try {
    p.key = rpc::load_key_file(p.key_file);
  } catch (const std::exception& e) {
    throw error("peer " + (p.name.empty() ? p.host + ":" + std::to_string(p.port) : p.name) + ": " + e.what());
  }
  return p;
}

engine_config load_engine_config(const std::filesystem::path& path) {
  return parse_engine_config(config_toml::read_file(path), path.string());
}

}  // namespace troupe::actors
