// How a model is loaded and served: the one definition of a model's settings. The embedding API
// (engine::load_model), a [[model]] table of a TOML configuration (actors/engine_config.h) and the load
// request the supervisor and loader actors exchange (actors/messages.h) all carry this struct.
//
//   actors::model_settings s{.name = "stories", .path = "stories260K.gguf", .n_ctx = 512, .n_seq_max = 2};
//   s.validate();                         // throws settings_error naming the field
//   const model_settings r = s.resolved();  // r.n_ctx_seq == 256: defaults that depend on other fields
//
// Fields keep their TOML key's name, except n_threads (TOML: `threads`). Plain C++: its inspect() for CAF is
// in actors/messages.h with the other messages'.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "runtime/error.h"
#include "runtime/types.h"

namespace troupe::actors {

struct device_layers {
  std::string device;  // a device with an actor: "CPU1"
  int32_t layers = 0;  // the model's last layers it takes (as n_gpu_layers)
  friend bool operator==(const device_layers&, const device_layers&) = default;
};

// Tensors whose name matches `pattern` (an ECMAScript regex, anywhere in the name) go to `device`,
// whatever layer they belong to (as llama.cpp's --override-tensor).
struct tensor_override {
  std::string pattern;
  std::string device;
  friend bool operator==(const tensor_override&, const tensor_override&) = default;
};

// A setting no model can run with. field(): the field (and TOML key) at fault, "" for several.
class settings_error : public error {
 public:
  settings_error(std::string field, const std::string& what) : error(what), field_(std::move(field)) {}
  const std::string& field() const { return field_; }

 private:
  std::string field_;
};

struct model_settings {
  std::string name;                    // the model's name in this runtime (unique)
  std::string path;                    // GGUF file
  std::vector<device_layers> devices;  // layers per device; empty: everything on the CPU
  bool use_mmap = true;
  bool huge_pages = true;              // host weights copied into 2 MiB pages where that pays (load_params)
  bool parallel = true;                // upload to every device at once (false: one device after another)
  uint32_t n_ctx = 2048;               // KV cells shared by the model's sessions
  uint32_t n_batch = 512;              // tokens per decode call
  uint32_t n_ubatch = 512;             // tokens per graph (micro-batch)
  uint32_t n_pipeline = 4;             // micro-batches in flight at once when the layers span several devices
  uint32_t n_seq_max = 4;              // sessions that may be open at once
  int32_t n_threads = 0;               // CPU threads for decoding; 0: all
  uint32_t n_ctx_seq = 0;              // most cells one session may use (prompt + answer); 0: n_ctx (the
                                       // sessions draw from one pool; the daemon's admission control reserves
                                       // each request's cells, net/http/session_pool.h)
  // Host memory for the conversations prefix reuse evicts from the KV cache (llm/prefix_index.h): a prompt
  // that starts with one has its positions written back instead of decoded (llama-server's --cache-ram).
  // 0: none are saved.
  uint32_t prompt_cache_mib = 8192;
  // KV cache element types (llama.cpp's -ctk / -ctv names: f32, f16, bf16, q8_0, q4_0, q4_1, q5_0, q5_1,
  // iq4_nl): K's, and V's when kv_type_v is empty.
  std::string kv_type = "f16";
  std::string kv_type_v;
  // Attention as one fused op where a layer's cache allows it (llama.cpp's -fa): "auto" and "on" fuse it (the
  // CPU's flash_attn for f32 / f16 caches in its layout; the same values as the unfused graph, without the
  // score matrix in memory), "off" never does. Other layers take the unfused graph either way.
  std::string flash_attn = "auto";
  // An answer that reaches its sequence's limit keeps its first n_keep prompt tokens (the request's), drops
  // the oldest half of the rest and goes on (llama-server's --context-shift; llm::generate_params).
  // false: it ends with finish_reason "length".
  bool context_shift = false;
  std::string chat_template;           // a template family overriding the model's own ("raw" for base models);
                                       // "": the model's
  std::string chat_template_file;      // a Jinja template file used instead of the model's own ("": none)
  std::vector<std::string> aliases;    // other names the daemon's APIs answer to (ollama's "smollm2:135m")
  std::vector<tensor_override> overrides;  // tensor-name regex -> device
  // "": `devices` as given; "auto": over this machine's devices by free memory (as -ngl auto); "cluster": the
  // daemon's cluster places the layers over its nodes' devices by free memory (net/cluster/placer.h), once at
  // least min_nodes nodes are up.
  std::string placement;
  uint32_t min_nodes = 1;
  // The daemon's on-demand loading (net/http/model_manager.h): "startup" loads the model when the daemon
  // starts, "on_demand" when a request first names it; "": startup for the first model and for placement =
  // "cluster", on demand for the others.
  std::string load;
  // How long the model stays loaded once idle, in milliseconds (TOML `keep_alive`: seconds, or ollama's
  // duration text "5m", "30s", "1h30m"); -1: for ever; keep_alive_default: the daemon's default (for ever for
  // a model loaded at start, 5 minutes for one loaded on demand, as ollama).
  int64_t keep_alive_ms = keep_alive_default;
  static constexpr int64_t keep_alive_default = -2;
  friend bool operator==(const model_settings&, const model_settings&) = default;

  // Throws settings_error for the first field no model can run with (name and path empty, counts of 0,
  // n_ctx_seq above n_ctx, an unknown kv_type or chat template family, an invalid override regex).
  void validate() const;
  // kv_type (K) and kv_type_v (V, else kv_type) as tensor types (validate() checked the names).
  type kv_cache_type() const;
  type kv_cache_type_v() const;
  // These settings validated, with the defaults that depend on other fields filled in (n_ctx_seq).
  model_settings resolved() const;
  // Cells of the model's embeddings context, and so the most tokens of one embedding input: one of
  // n_seq_max equal shares of n_ctx, at most n_ctx_seq (of resolved settings). An embedding has no answer to
  // leave room for, and a context of the whole pool beside the sessions' would double the KV memory.
  uint32_t embedding_cells() const;
};

// A keep-alive duration as ollama takes it: a number of seconds ("300", "2.5"), or Go's duration text ("5m",
// "30s", "1h30m", "250ms"); any negative value is -1 (for ever). Milliseconds; nullopt when it is neither.
std::optional<int64_t> parse_keep_alive(std::string_view text);

}  // namespace troupe::actors
