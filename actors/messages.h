// The message types troupe's actors exchange. Every struct here may cross a process boundary (CAF
// middleman), so each has inspect() and is registered in actors/type_ids.h; tests/actors/test_remote.cpp
// sends every one of them between two processes.
//
// Conventions: sizes and offsets are bytes (uint64_t); kinds are memory_kind as uint8_t; ids of
// in-process objects (a load job, a decode split task, a graph) are uint64_t handles into the runtime's
// local_registry (actors/local_registry.h) that mean nothing in another process, where a request naming
// one fails with errc::not_found. Handles in messages are typed (actors/handles.h).
#pragma once

#include <caf/meta/type_name.hpp>

#include <cstdint>
#include <string>
#include <vector>

#include "actors/handles.h"
#include "actors/model_settings.h"
#include "llm/generate_params.h"

namespace troupe::actors {

// ---- memory accounting ----

// An allocation (bytes > 0) or release (bytes < 0) of one kind of memory in one buffer type.
struct memory_event {
  std::string buft;      // buffer type name: "CPU", "CPU1"
  std::string device;    // device the memory belongs to
  bool is_host = false;  // host memory (the breakdown's Host row)
  uint8_t kind = 0;      // memory_kind: 0 model, 1 context, 2 compute
  int64_t bytes = 0;
  std::string owner;     // who holds it: "model:NAME", "context:NAME", "device:CPU1#3"
  friend bool operator==(const memory_event&, const memory_event&) = default;
};

// A device's memory and state, as its device actor reports it.
struct device_status {
  std::string name;
  std::string description;
  uint64_t total = 0;
  uint64_t free = 0;
  bool host = false;       // the device's default buffer type is host memory (no device row of its own)
  uint64_t n_buffers = 0;  // buffers the device actor owns (alloc_atom)
  uint64_t n_splits = 0;   // graph splits it computed (splits of model decodes)
  friend bool operator==(const device_status&, const device_status&) = default;
};

// Bytes per kind of one buffer type.
struct buft_usage {
  std::string buft;
  std::string device;
  bool is_host = false;
  uint64_t model = 0;
  uint64_t context = 0;
  uint64_t compute = 0;
  friend bool operator==(const buft_usage&, const buft_usage&) = default;
};

// The memory breakdown: the table users see, the same as JSON, and the numbers behind it.
struct memory_breakdown {
  std::string table;  // format_memory_table (MiB)
  std::string json;   // format_memory_json (bytes)
  std::vector<buft_usage> entries;
  uint64_t model = 0;  // totals over every buffer type
  uint64_t context = 0;
  uint64_t compute = 0;
  uint64_t n_events = 0;   // events recorded so far
  uint64_t n_rejected = 0; // releases of more than was recorded (an accounting bug somewhere)
  friend bool operator==(const memory_breakdown&, const memory_breakdown&) = default;
};

// ---- device actor ----

struct alloc_request {
  uint64_t size = 0;
  uint8_t kind = 0;  // memory_kind it is accounted as
  std::string owner;
  friend bool operator==(const alloc_request&, const alloc_request&) = default;
};

struct buffer_info {
  uint64_t id = 0;
  uint64_t size = 0;
  std::string buft;
  friend bool operator==(const buffer_info&, const buffer_info&) = default;
};

// Bytes [offset, offset + size) of a buffer the device actor owns.
struct tensor_range {
  uint64_t buffer = 0;
  uint64_t offset = 0;
  uint64_t size = 0;
  friend bool operator==(const tensor_range&, const tensor_range&) = default;
};

// Bytes to write at offset of a buffer the device actor owns.
struct range_upload {
  uint64_t buffer = 0;
  uint64_t offset = 0;
  std::vector<char> data;
  friend bool operator==(const range_upload&, const range_upload&) = default;
};

// Upload the weights of a staged load (an in-process load_job) that go to buffer type `buft`.
struct upload_job {
  uint64_t job = 0;
  std::string buft;
  friend bool operator==(const upload_job&, const upload_job&) = default;
};

struct upload_result {
  std::string buft;
  std::string device;
  uint64_t bytes = 0;
  double seconds = 0;
  friend bool operator==(const upload_result&, const upload_result&) = default;
};

// Compute split `split` of the decode graph of a model context: `task` is the local_registry id of the
// split task (engine_env.h) its decoder actor registered for the device actor.
struct decode_split {
  uint64_t task = 0;
  uint32_t split = 0;
  friend bool operator==(const decode_split&, const decode_split&) = default;
};

struct split_result {
  uint32_t microbatch = 0;
  uint32_t split = 0;
  double seconds = 0;
  friend bool operator==(const split_result&, const split_result&) = default;
};

// ---- allocator actor ----

// The owner's compute memory of the allocator's buffer type is now `bytes` (held by a synchronous
// scheduler inside the owner).
struct compute_reservation {
  std::string owner;
  uint64_t bytes = 0;
  friend bool operator==(const compute_reservation&, const compute_reservation&) = default;
};

// Place an in-process graph's tensors in compute buffers the allocator owns for `owner`.
struct graph_plan {
  uint64_t graph = 0;
  std::string owner;
  friend bool operator==(const graph_plan&, const graph_plan&) = default;
};

struct owner_bytes {
  std::string owner;
  uint64_t bytes = 0;
  friend bool operator==(const owner_bytes&, const owner_bytes&) = default;
};

struct allocator_usage {
  std::string buft;
  std::vector<owner_bytes> owners;
  uint64_t total = 0;
  uint64_t n_reallocations = 0;  // buffers grown for planned graphs
  friend bool operator==(const allocator_usage&, const allocator_usage&) = default;
};

// ---- loading ----

// A model to load: its settings (model_settings.h, validated and resolved by the loader) and who hears
// of the progress.
struct load_request {
  model_settings model;
  progress_listener progress;  // optional: receives (progress_atom, load_progress)
  friend bool operator==(const load_request&, const load_request&) = default;
};

struct load_progress {
  std::string model;
  uint64_t done = 0;
  uint64_t total = 0;
  friend bool operator==(const load_progress&, const load_progress&) = default;
};

struct model_info {
  std::string name;
  std::string path;
  std::string arch;
  uint32_t n_layer = 0;
  uint32_t n_vocab = 0;
  uint32_t n_ctx_train = 0;
  uint64_t n_params = 0;
  uint64_t weight_bytes = 0;           // bytes of weights over every buffer type
  std::string chat_template;           // the family of its chat template ("chatml", "llama3", ...)
  std::vector<upload_result> uploads;  // per target buffer type
  double upload_seconds = 0;           // wall time of the uploads (from the first dispatch to the last answer)
  double load_seconds = 0;             // wall time of the whole load
  friend bool operator==(const model_info&, const model_info&) = default;
};

// ---- sessions ----

// Sampling, length and stop strings of one answer: the LLM layer's own parameters, as they are.
using generation_params = llm::generate_params;

struct chat_message {
  std::string role;
  std::string content;
  friend bool operator==(const chat_message&, const chat_message&) = default;
};

struct generate_request {
  bool chat = false;                   // true: messages through the model's chat template, or (messages empty)
                                       // the prompt is a chat already rendered with it (llm::chat_tokens);
                                       // false: prompt as plain text
  std::string prompt;
  std::vector<int32_t> prompt_ids;     // chat false and not empty: the prompt as token ids, used as given
  std::vector<chat_message> messages;
  generation_params params;
  token_subscriber subscriber;         // optional: receives (token_atom, token_event) per piece
  friend bool operator==(const generate_request&, const generate_request&) = default;
};

struct token_event {
  uint64_t session = 0;
  std::string piece;
  int32_t token = -1;
  // With generate_params::logprobs >= 0: the log-probabilities of the tokens sampled since the previous
  // event (the tokens whose text this piece completes).
  std::vector<llm::token_logprob> logprobs;
  friend bool operator==(const token_event&, const token_event&) = default;
};

// The answer (the LLM layer's result: text, finish, tokens, prompt and generation figures) of a session.
struct generate_reply : llm::generate_result {
  uint64_t session = 0;
  friend bool operator==(const generate_reply&, const generate_reply&) = default;
};

struct session_request {
  std::string model;
  friend bool operator==(const session_request&, const session_request&) = default;
};

// Token ids to embed, used as given (no BOS added): at most the model's embedding_cells(), each in its vocabulary.
struct embed_request {
  std::vector<int32_t> tokens;
  friend bool operator==(const embed_request&, const embed_request&) = default;
};

// Their embedding: [n_embd], pooled as the GGUF declares (mean where it declares none), length 1.
struct embed_reply {
  std::vector<float> embedding;
  friend bool operator==(const embed_reply&, const embed_reply&) = default;
};

// ---- decoder actor ----

// Decode `tokens` on sequence `seq` after keeping its first `keep` cache positions.
// What a session holds in its model's cache: another session of the same model can share it (n answers
// to one prompt, one prefill).
struct session_prefix {
  std::string model;
  int32_t seq = -1;
  std::vector<int32_t> tokens;
  friend bool operator==(const session_prefix&, const session_prefix&) = default;
};

struct decode_step {
  int32_t seq = 0;
  int32_t keep = 0;
  std::vector<int32_t> tokens;
  // Context shift first (llm::sequence_step): positions [shift_at, shift_at + shift_n) of seq dropped and
  // the later ones moved down by shift_n; keep counts after it.
  int32_t shift_at = 0;
  int32_t shift_n = 0;
  friend bool operator==(const decode_step&, const decode_step&) = default;
};

struct step_logits {
  int32_t seq = 0;
  std::vector<float> logits;  // [n_vocab] of the step's last token
  uint32_t batch_steps = 0;   // steps decoded in the same batch (1: alone)
  int32_t reused = 0;         // prompt positions the step took from another sequence's cells, not decoded
                              // (negative: positions before its keep decoded again, evicted while idle)
  friend bool operator==(const step_logits&, const step_logits&) = default;
};

// One session sequence of a model, as GET /slots shows it (llama-server's shape).
struct slot_status {
  int32_t id = 0;             // the sequence id
  bool attached = false;      // a session holds it
  bool is_processing = false; // a step of it is waiting, decoding or held for another's prefix
  uint32_t n_tokens = 0;      // positions it holds in the KV cache (its conversation so far)
  friend bool operator==(const slot_status&, const slot_status&) = default;
};

struct decoder_stats {
  std::string model;
  uint64_t n_batches = 0;   // batched decodes
  uint64_t n_steps = 0;     // session steps decoded
  uint64_t n_tokens = 0;
  uint32_t max_steps = 0;   // most steps in one batch
  uint32_t n_sessions = 0;  // attached now
  uint64_t kv_bytes = 0;
  uint64_t compute_bytes = 0;
  uint32_t n_in_flight = 0;    // decodes in the context's pipeline now (the scheduler answers meanwhile)
  uint32_t max_in_flight = 0;  // most at once: 2 when sequence groups overlapped on a model over devices
  // Prefix reuse across sequences (llm/prefix_index.h): prompt positions taken from other sequences' cells
  // instead of decoded, conversations kept in the pool after their session moved on, those dropped for room,
  // and the kept ones now with their positions.
  uint64_t reused_tokens = 0;
  uint64_t kept_conversations = 0;
  uint64_t kept_evictions = 0;
  uint32_t kept_now = 0;
  uint64_t kept_tokens_now = 0;
  // The host-RAM prompt cache: prompt positions written back from it instead of decoded, conversations
  // saved to it, and those it holds now with their bytes.
  uint64_t restored_tokens = 0;
  uint64_t saved_conversations = 0;
  uint32_t host_entries = 0;
  uint64_t host_bytes = 0;
  uint64_t idle_evictions = 0;   // idle sessions' sequences whose cells went for room
  uint32_t kv_cells = 0;         // the pool's cells (n_ctx)
  uint32_t kv_cells_used = 0;    // in use now (sessions' sequences and kept conversations)
  uint32_t kv_cells_shared = 0;  // held by more than one sequence now (shared prefixes)
  std::vector<slot_status> slots;  // the sessions' sequences
  friend bool operator==(const decoder_stats&, const decoder_stats&) = default;
};

// ---- remote peers ----

// A remote peer as its peer actor sees it (actors/peer_actor.h).
struct peer_status {
  std::string name;                  // as configured ("gpu-box")
  std::string address;               // "host:port"
  std::string state;                 // "connecting", "up" or "down"
  uint64_t epoch = 0;                // connections made so far: increments on every reconnect
  uint32_t failures = 0;             // failed attempts since the connection was last up (backoff step)
  uint64_t retry_in_ms = 0;          // down: time until the next attempt
  uint64_t health_checks = 0;        // health checks that passed
  std::string last_error;            // why it went down or failed to connect; kept after a reconnect
  std::vector<std::string> devices;  // its devices' registry names ("RPC[host:port]#0"); empty until first up
  std::vector<std::string> models;   // models whose weights are on it
  friend bool operator==(const peer_status&, const peer_status&) = default;
};

// The memory of a peer's devices, asked over its connection.
struct peer_memory {
  std::string peer;
  std::vector<device_status> devices;  // in the peer's device order
  friend bool operator==(const peer_memory&, const peer_memory&) = default;
};

// ---- supervisor ----

struct actor_status {
  std::string name;   // "device:CPU1", "loader", "model:stories"
  bool up = true;
  uint32_t restarts = 0;
  std::string last_error;
  friend bool operator==(const actor_status&, const actor_status&) = default;
};

struct engine_status {
  std::vector<actor_status> actors;
  std::vector<std::string> models;
  std::vector<peer_status> peers;  // remote peers given to the supervisor
  friend bool operator==(const engine_status&, const engine_status&) = default;
};

// Handles of a runtime's actors (for hosts and remote peers that talk to them directly).
struct actor_directory {
  memory_accountant_actor accountant;
  loader_actor loader;
  std::vector<std::string> device_names;
  std::vector<device_actor> devices;        // device actors, in device_names order
  std::vector<allocator_actor> allocators;  // allocator actors, one per device's buffer type, same order
  std::vector<std::string> model_names;
  std::vector<decoder_actor> decoders;  // one per loaded model, in model_names order
  std::vector<std::string> peer_names;
  std::vector<peer_actor> peers;            // peer actors, in peer_names order
  friend bool operator==(const actor_directory&, const actor_directory&) = default;
};

// ---- inspect ----

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, memory_event& x) {
  return f(caf::meta::type_name("memory_event"), x.buft, x.device, x.is_host, x.kind, x.bytes, x.owner);
}
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, device_status& x) {
  return f(caf::meta::type_name("device_status"), x.name, x.description, x.total, x.free, x.host, x.n_buffers,
           x.n_splits);
}
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, buft_usage& x) {
  return f(caf::meta::type_name("buft_usage"), x.buft, x.device, x.is_host, x.model, x.context, x.compute);
}
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, memory_breakdown& x) {
  return f(caf::meta::type_name("memory_breakdown"), x.table, x.json, x.entries, x.model, x.context, x.compute,
           x.n_events, x.n_rejected);
}
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, alloc_request& x) {
  return f(caf::meta::type_name("alloc_request"), x.size, x.kind, x.owner);
}
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, buffer_info& x) {
  return f(caf::meta::type_name("buffer_info"), x.id, x.size, x.buft);
}
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, tensor_range& x) {
  return f(caf::meta::type_name("tensor_range"), x.buffer, x.offset, x.size);
}
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, range_upload& x) {
  return f(caf::meta::type_name("range_upload"), x.buffer, x.offset, x.data);
}
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, upload_job& x) {
  return f(caf::meta::type_name("upload_job"), x.job, x.buft);
}
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, upload_result& x) {
  return f(caf::meta::type_name("upload_result"), x.buft, x.device, x.bytes, x.seconds);
}
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, decode_split& x) {
  return f(caf::meta::type_name("decode_split"), x.task, x.split);
}
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, split_result& x) {
  return f(caf::meta::type_name("split_result"), x.microbatch, x.split, x.seconds);
}
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, compute_reservation& x) {
  return f(caf::meta::type_name("compute_reservation"), x.owner, x.bytes);
}
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, graph_plan& x) {
  return f(caf::meta::type_name("graph_plan"), x.graph, x.owner);
}
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, owner_bytes& x) {
  return f(caf::meta::type_name("owner_bytes"), x.owner, x.bytes);
}
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, allocator_usage& x) {
  return f(caf::meta::type_name("allocator_usage"), x.buft, x.owners, x.total, x.n_reallocations);
}
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, device_layers& x) {
  return f(caf::meta::type_name("device_layers"), x.device, x.layers);
}
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, tensor_override& x) {
  return f(caf::meta::type_name("tensor_override"), x.pattern, x.device);
}
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, model_settings& x) {
  return f(caf::meta::type_name("model_settings"), x.name, x.path, x.devices, x.use_mmap, x.huge_pages, x.parallel, x.n_ctx, x.n_batch,
           x.n_ubatch, x.n_pipeline, x.n_seq_max, x.n_threads, x.n_ctx_seq, x.prompt_cache_mib, x.kv_type, x.kv_type_v, x.flash_attn, x.context_shift, x.chat_template, x.chat_template_file, x.aliases,
           x.overrides, x.placement, x.min_nodes, x.load, x.keep_alive_ms);
}

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, load_request& x) {
  return f(caf::meta::type_name("load_request"), x.model, x.progress);
}
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, load_progress& x) {
  return f(caf::meta::type_name("load_progress"), x.model, x.done, x.total);
}
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, model_info& x) {
  return f(caf::meta::type_name("model_info"), x.name, x.path, x.arch, x.n_layer, x.n_vocab, x.n_ctx_train, x.n_params,
           x.weight_bytes, x.chat_template, x.uploads, x.upload_seconds, x.load_seconds);
}
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, chat_message& x) {
  return f(caf::meta::type_name("chat_message"), x.role, x.content);
}
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, generate_request& x) {
  return f(caf::meta::type_name("generate_request"), x.chat, x.prompt, x.prompt_ids, x.messages, x.params, x.subscriber);
}
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, token_event& x) {
  return f(caf::meta::type_name("token_event"), x.session, x.piece, x.token, x.logprobs);
}
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, generate_reply& x) {
  return f(caf::meta::type_name("generate_reply"), x.session, x.text, x.finish, x.stop_match, x.tokens, x.n_prompt,
           x.n_prompt_decoded, x.prompt_seconds, x.gen_seconds, x.logprobs);
}
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, session_request& x) {
  return f(caf::meta::type_name("session_request"), x.model);
}
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, embed_request& x) {
  return f(caf::meta::type_name("embed_request"), x.tokens);
}
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, embed_reply& x) {
  return f(caf::meta::type_name("embed_reply"), x.embedding);
}
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, session_prefix& x) {
  return f(caf::meta::type_name("session_prefix"), x.model, x.seq, x.tokens);
}
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, decode_step& x) {
  return f(caf::meta::type_name("decode_step"), x.seq, x.keep, x.tokens, x.shift_at, x.shift_n);
}
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, step_logits& x) {
  return f(caf::meta::type_name("step_logits"), x.seq, x.logits, x.batch_steps, x.reused);
}
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, decoder_stats& x) {
  return f(caf::meta::type_name("decoder_stats"), x.model, x.n_batches, x.n_steps, x.n_tokens, x.max_steps, x.n_sessions,
           x.kv_bytes, x.compute_bytes, x.n_in_flight, x.max_in_flight, x.reused_tokens, x.kept_conversations,
           x.kept_evictions, x.kept_now, x.kept_tokens_now, x.restored_tokens, x.saved_conversations, x.host_entries,
           x.host_bytes, x.idle_evictions, x.kv_cells, x.kv_cells_used, x.kv_cells_shared, x.slots);
}
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, slot_status& x) {
  return f(caf::meta::type_name("slot_status"), x.id, x.attached, x.is_processing, x.n_tokens);
}
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, actor_status& x) {
  return f(caf::meta::type_name("actor_status"), x.name, x.up, x.restarts, x.last_error);
}
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, engine_status& x) {
  return f(caf::meta::type_name("engine_status"), x.actors, x.models, x.peers);
}
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, peer_status& x) {
  return f(caf::meta::type_name("peer_status"), x.name, x.address, x.state, x.epoch, x.failures, x.retry_in_ms,
           x.health_checks, x.last_error, x.devices, x.models);
}
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, peer_memory& x) {
  return f(caf::meta::type_name("peer_memory"), x.peer, x.devices);
}
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, actor_directory& x) {
  return f(caf::meta::type_name("actor_directory"), x.accountant, x.loader, x.device_names, x.devices, x.allocators,
           x.model_names, x.decoders, x.peer_names, x.peers);
}

}  // namespace troupe::actors

// The LLM layer's generation parameters cross process boundaries inside generate_request.
namespace troupe::llm {

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, token_bias& x) {
  return f(caf::meta::type_name("token_bias"), x.token, x.bias);
}

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, generate_params& x) {
  return f(caf::meta::type_name("generate_params"), x.max_tokens, x.seed, x.temperature, x.top_k, x.top_p, x.min_p,
           x.penalty_last_n, x.repeat_penalty, x.frequency_penalty, x.presence_penalty, x.logit_bias, x.stop,
           x.logprobs, x.grammar, x.grammar_triggers, x.n_ctx, x.context_shift, x.n_keep, x.reasoning_budget,
           x.reasoning_start, x.reasoning_end, x.reasoning_open, x.preserved_tokens);
}

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, token_prob& x) {
  return f(caf::meta::type_name("token_prob"), x.token, x.logprob, x.text);
}

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, token_logprob& x) {
  return f(caf::meta::type_name("token_logprob"), x.token, x.logprob, x.text, x.top);
}

}  // namespace troupe::llm
