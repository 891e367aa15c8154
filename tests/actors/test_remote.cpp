// Every message type of actors/type_ids.h crosses a real CAF middleman connection between two processes:
// this test talks to the actors of an actors_peer process (tests/actors/peer_main.cpp) on 127.0.0.1,
// sending every request and subscribing to every stream, and checks at the end that each registered type
// went across (as a request, a reply, an event or inside one of them). What went across is what CAF itself
// serialized and deserialized in this process: every type of the block is registered here with a recording
// value factory (recorded_value), and the requests are sent as messages of such values, so each one saved
// into a BASP message for the peer, or loaded from one, records its type and every object inside it. What
// was sent must also have had its effect there (the tensor override's device: the peer's upload to CPU1
// holds the overridden tensor). Errors cross too, with their code and text. Every wait is bounded; the peer
// is killed at the end. A second case checks, without a peer, that each type's inspect() lists every field
// of its struct (a field left out never crosses, and nothing else notices).
#include <catch2/catch.hpp>

#include <caf/all.hpp>
#include <caf/detail/dynamic_message_data.hpp>
#include <caf/detail/type_erased_value_impl.hpp>
#include <caf/io/all.hpp>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <map>
#include <mutex>
#include <set>
#include <sstream>
#include <thread>
#include <type_traits>
#include <typeindex>
#include <utility>

#include "actors/allocator_actor.h"
#include "actors/device_actor.h"
#include "actors/errors.h"
#include "actors/loader_actor.h"
#include "actors/memory_accountant_actor.h"
#include "actors/peer_actor.h"
#include "actors/decoder_actor.h"
#include "actors/session_actor.h"
#include "actors/supervisor_actor.h"
#include "actors/type_ids.h"
#include "loader/gguf.h"
#include "loader/placement.h"
#include "tests/test_models.h"

extern char** environ;

using namespace troupe;
using namespace troupe::actors;

namespace {

constexpr auto timeout = std::chrono::seconds(30);

// The peer process: started with pipes on stdin and stdout, killed by the destructor.
class peer_process {
 public:
  peer_process() {
    int in[2], out[2];
    REQUIRE(pipe(in) == 0);
    REQUIRE(pipe(out) == 0);
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_adddup2(&fa, in[0], STDIN_FILENO);
    posix_spawn_file_actions_adddup2(&fa, out[1], STDOUT_FILENO);
    posix_spawn_file_actions_addclose(&fa, in[1]);
    posix_spawn_file_actions_addclose(&fa, out[0]);
    char* argv[] = {const_cast<char*>(TROUPE_ACTORS_PEER), nullptr};
    const int rc = posix_spawn(&pid_, TROUPE_ACTORS_PEER, &fa, nullptr, argv, environ);
    posix_spawn_file_actions_destroy(&fa);
    close(in[0]);
    close(out[1]);
    stdin_ = in[1];
    stdout_ = out[0];
    REQUIRE(rc == 0);
  }
  ~peer_process() {
    if (stdin_ >= 0) close(stdin_);  // the peer's signal to end
    int status = 0;
    for (int i = 0; i < 100; ++i) {
      if (waitpid(pid_, &status, WNOHANG) == pid_) {
        pid_ = -1;
        break;
      }
      usleep(20000);
    }
    if (pid_ > 0) {
      kill(pid_, SIGKILL);
      waitpid(pid_, &status, 0);
    }
    close(stdout_);
  }
  // The peer's output lines until "ready" ("key value" pairs), waiting at most 60 s.
  std::map<std::string, uint64_t> read_ready() {
    std::map<std::string, uint64_t> out;
    std::string buf;
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
    while (std::chrono::steady_clock::now() < deadline) {
      pollfd p{stdout_, POLLIN, 0};
      if (poll(&p, 1, 100) <= 0) continue;
      char c[256];
      const ssize_t n = read(stdout_, c, sizeof c);
      if (n <= 0) break;
      buf.append(c, static_cast<size_t>(n));
      size_t nl;
      while ((nl = buf.find('\n')) != std::string::npos) {
        std::istringstream line(buf.substr(0, nl));
        buf.erase(0, nl + 1);
        std::string key;
        uint64_t value = 0;
        line >> key >> value;
        if (key == "ready") return out;
        out[key] = value;
      }
    }
    FAIL("the peer did not get ready within 60 s");
    return out;
  }

 private:
  pid_t pid_ = -1;
  int stdin_ = -1;
  int stdout_ = -1;
};

// The names of every type in troupe's type ID block.
template <caf::type_id_t... Is>
std::set<std::string> names(std::integer_sequence<caf::type_id_t, Is...>) {
  return {caf::type_name_by_id<caf::id_block::troupe::begin + Is>::value...};
}
std::set<std::string> registered_names() {
  return names(std::make_integer_sequence<caf::type_id_t, caf::id_block::troupe::end - caf::id_block::troupe::begin>{});
}

// "troupe::actors::memory_event" -> "memory_event" (what its inspect() calls it).
std::string short_name(const std::string& qualified) { return qualified.substr(qualified.rfind(':') + 1); }

// The message types of actors/messages.h (and the LLM layer's generate_params they carry), each of which
// must be registered: written out here, so that a type dropped from the block fails this test rather than
// leaving its list.
const std::set<std::string> message_types = {
    "memory_event", "device_status", "buft_usage", "memory_breakdown", "alloc_request", "buffer_info",
    "tensor_range", "range_upload", "upload_job", "upload_result", "decode_split", "split_result",
    "compute_reservation", "graph_plan", "owner_bytes", "allocator_usage", "device_layers", "tensor_override",
    "model_settings", "load_request", "load_progress", "model_info", "generate_params", "chat_message",
    "generate_request", "token_event", "generate_reply", "session_request", "session_prefix", "decode_step",
    "step_logits", "decoder_stats", "slot_status", "actor_status", "engine_status", "actor_directory", "peer_status",
    "peer_memory", "embed_request", "embed_reply"};

// ---- an inspector that walks what inspect() lists ----

// Records the caf::meta::type_name of every object inspect() reaches from a value (the value's own and those
// of the objects inside it, through vectors), and how many fields the outermost inspect() lists: what CAF's
// serializers visit, since they run the same inspect().
class name_walker {
 public:
  using result_type = void;
  static constexpr bool reads_state = true;
  static constexpr bool writes_state = false;

  std::set<std::string> names;
  size_t top_fields = 0;

  template <class... Ts>
  void operator()(Ts&&... xs) {
    const bool top = depth_++ == 0;
    const char* name = nullptr;
    size_t fields = 0;
    (visit(name, fields, xs), ...);
    --depth_;
    if (name != nullptr) names.insert(name);
    if (top) top_fields = fields;
  }

  template <class T>
  void walk(T& x) {
    using U = std::remove_cv_t<T>;
    if constexpr (caf::is_actor_handle<U>::value || std::is_arithmetic_v<U> || std::is_same_v<U, std::string>) {
      return;  // no objects inside
    } else if constexpr (requires(name_walker& f, U& y) { inspect(f, y); }) {
      inspect(*this, const_cast<U&>(x));
    } else if constexpr (requires(U& y) { y.begin(); y.end(); }) {
      for (auto& e : const_cast<U&>(x)) walk(e);
    }
  }

 private:
  template <class T>
  void visit(const char*& name, size_t& fields, T& x) {
    using U = std::remove_cv_t<T>;
    if constexpr (std::is_same_v<U, caf::meta::type_name_t>) {
      name = x.value;
    } else if constexpr (!caf::meta::is_annotation<U>::value) {
      ++fields;
      walk(x);
    }
  }

  int depth_ = 0;
};

// ---- what crossed: values of troupe's block that CAF serialized or deserialized in this process ----

struct crossing_log {
  std::mutex mutex;
  std::set<std::string> sent;      // saved into a message for the peer (type names, nested objects included)
  std::set<std::string> received;  // loaded from a message of the peer
};

crossing_log& crossings() {
  static crossing_log log;
  return log;
}

template <class T>
void record(std::set<std::string>& into, const T& x) {
  name_walker w;
  w.walk(x);
  std::lock_guard l(crossings().mutex);
  into.insert(w.names.begin(), w.names.end());
}

// A message element of type T that records its names when CAF's serializer saves it or its deserializer
// loads it (CAF makes the elements of every incoming message through the factory record_type installs).
template <class T>
class recorded_value : public caf::detail::type_erased_value_impl<T> {
 public:
  using super = caf::detail::type_erased_value_impl<T>;
  using super::super;

  caf::error load(caf::deserializer& source) override {
    caf::error err = super::load(source);
    if (!err) record(crossings().received, value());
    return err;
  }
  caf::error save(caf::serializer& sink) const override {
    caf::error err = super::save(sink);
    if (!err) record(crossings().sent, value());
    return err;
  }
  caf::type_erased_value_ptr copy() const override { return caf::type_erased_value_ptr{new recorded_value(value())}; }

 private:
  const T& value() const { return *static_cast<const T*>(this->get()); }
};

// Replaces the value factories add_message_types registered for T with recording ones.
template <class T>
void record_type(caf::actor_system_config& cfg, const std::string& name) {
  INFO("type " << name);
  const auto it = cfg.value_factories_by_name.find(name);
  REQUIRE(it != cfg.value_factories_by_name.end());  // registered by add_message_types
  auto factory = [] { return caf::type_erased_value_ptr{new recorded_value<T>()}; };
  it->second = factory;
  cfg.value_factories_by_rtti[std::type_index(typeid(T))] = factory;
}

template <caf::type_id_t... Is>
void record_block(caf::actor_system_config& cfg, std::integer_sequence<caf::type_id_t, Is...>) {
  (record_type<typename caf::type_by_id<caf::id_block::troupe::begin + Is>::type>(
       cfg, caf::type_name_by_id<caf::id_block::troupe::begin + Is>::value),
   ...);
}

template <class T>
constexpr bool in_block() {
  if constexpr (caf::detail::is_complete<caf::type_id<T>>::value) {
    return caf::type_id<T>::value >= caf::id_block::troupe::begin && caf::type_id<T>::value < caf::id_block::troupe::end;
  } else {
    return false;
  }
}

// An element of a message, as CAF's make_message stores it (const char* as std::string, atom constants as
// atom values); a recorded one for the types of the block.
template <class T>
caf::type_erased_value_ptr element_of(T&& x) {
  using U = typename caf::unbox_message_element<typename caf::detail::implicit_conversions<std::decay_t<T>>::type>::type;
  if constexpr (in_block<U>()) {
    return caf::type_erased_value_ptr{new recorded_value<U>(std::forward<T>(x))};
  } else {
    return caf::make_type_erased_value<U>(std::forward<T>(x));
  }
}

// The message (xs...), its elements of the block recorded when the middleman serializes it for the peer.
template <class... Ts>
caf::message traced_message(Ts&&... xs) {
  auto data = caf::make_counted<caf::detail::dynamic_message_data>();
  (data->append(element_of(std::forward<Ts>(xs))), ...);
  return caf::message{caf::message::data_ptr{std::move(data)}};
}

// ---- the fields of a struct, counted without inspect() ----

// Converts to anything: T{any_field{}, ...} compiles for as many initializers as T has fields (its direct
// members, a base class counting as one).
struct any_field {
  template <class T>
  operator T() const;  // never defined: only in requires-expressions
};

template <class T, size_t... I>
constexpr bool takes_initializers(std::index_sequence<I...>) {
  return requires { T{(static_cast<void>(I), any_field{})...}; };
}

template <class T, size_t N = 0>
constexpr size_t aggregate_fields() {
  if constexpr (takes_initializers<T>(std::make_index_sequence<N + 1>{})) {
    return aggregate_fields<T, N + 1>();
  } else {
    return N;
  }
}

// The message structs that extend another (inspect() lists the base's fields with their own).
template <class T>
struct base_of {
  using type = void;
};
template <>
struct base_of<llm::generate_params> {
  using type = llm::sampling_params;
};
template <>
struct base_of<generate_reply> {
  using type = llm::generate_result;
};
template <>
struct base_of<llm::token_logprob> {
  using type = llm::token_prob;
};

template <class T>
constexpr size_t struct_fields() {
  static_assert(std::is_aggregate_v<T>, "a message type is a plain struct");
  using B = typename base_of<T>::type;
  if constexpr (std::is_void_v<B>) {
    return aggregate_fields<T>();
  } else {
    return aggregate_fields<T>() - 1 + struct_fields<B>();
  }
}

// inspect()'s fields for T against T's own; a type whose inspect() does not name it has no count.
template <class T>
void check_fields(const std::string& name) {
  INFO("type " << name);
  name_walker w;
  T x{};
  inspect(w, x);
  CHECK(w.names.count(short_name(name)) == 1);
  CHECK(w.top_fields == struct_fields<T>());
}

template <caf::type_id_t... Is>
void check_block_fields(std::integer_sequence<caf::type_id_t, Is...>) {
  (check_fields<typename caf::type_by_id<caf::id_block::troupe::begin + Is>::type>(
       caf::type_name_by_id<caf::id_block::troupe::begin + Is>::value),
   ...);
}

// Events the peer sends to actors of this process.
struct inbox {
  std::mutex mutex;
  std::vector<load_progress> progress;
  std::vector<token_event> tokens;
  std::vector<memory_breakdown> updates;
  std::vector<peer_status> peer_updates;
};

// Every stream's receiver at once: converts to each subscriber handle (progress, tokens, memory, peers).
using collector_actor = caf::typed_actor<caf::reacts_to<progress_atom, load_progress>, caf::reacts_to<token_atom, token_event>,
                                         caf::reacts_to<update_atom, memory_breakdown>, caf::reacts_to<update_atom, peer_status>>;

collector_actor::behavior_type collector(collector_actor::pointer, std::shared_ptr<inbox> box) {
  return {
      [box](progress_atom, const load_progress& p) {
        std::lock_guard l(box->mutex);
        box->progress.push_back(p);
      },
      [box](token_atom, const token_event& t) {
        std::lock_guard l(box->mutex);
        box->tokens.push_back(t);
      },
      [box](update_atom, const memory_breakdown& b) {
        std::lock_guard l(box->mutex);
        box->updates.push_back(b);
      },
      [box](update_atom, const peer_status& s) {
        std::lock_guard l(box->mutex);
        box->peer_updates.push_back(s);
      },
  };
}

// What Handle answers to (Ts...), as CAF's typed request checks it.
template <class Handle, class... Ts>
using reply_to = caf::response_type_unbox<caf::signatures_of_t<Handle>,
                                          caf::detail::type_list<typename caf::detail::implicit_conversions<std::decay_t<Ts>>::type...>>;

// A request to a typed actor (checked against its interface at compile time, as a typed request is), sent as
// a traced message; the reply's values are recorded as CAF deserializes them.
template <class T, class Handle, class... Ts>
caf::expected<T> ask(caf::scoped_actor& self, const Handle& h, Ts&&... xs) {
  static_assert(reply_to<Handle, Ts...>::valid, "the actor does not take this message");
  static_assert(std::is_same_v<typename reply_to<Handle, Ts...>::type, caf::detail::type_list<T>>, "the actor answers with another type");
  caf::expected<T> out{caf::make_error(caf::sec::request_timeout)};
  self->request(caf::actor_cast<caf::actor>(h), timeout, traced_message(std::forward<Ts>(xs)...))
      .receive([&](T& v) { out = std::move(v); }, [&](caf::error& e) { out = std::move(e); });
  return out;
}

// A one-way message to a typed actor, traced.
template <class Handle, class... Ts>
void tell(caf::scoped_actor& self, const Handle& h, Ts&&... xs) {
  static_assert(reply_to<Handle, Ts...>::valid, "the actor does not take this message");
  self->send(caf::actor_cast<caf::actor>(h), traced_message(std::forward<Ts>(xs)...));
}

template <class T>
T value_or(const caf::expected<T>& e, T fallback) {
  return e ? *e : fallback;
}

}  // namespace

TEST_CASE("every message type crosses a middleman connection between two processes", "[actors][remote]") {
  const auto model = test::model_path("stories260K.gguf");
  if (!model) return;
  peer_process peer;
  const auto ids = peer.read_ready();
  REQUIRE(ids.count("port"));

  caf::actor_system_config cfg;
  add_message_types(cfg);
  record_block(cfg, std::make_integer_sequence<caf::type_id_t, caf::id_block::troupe::end - caf::id_block::troupe::begin>{});
  {
    std::lock_guard l(crossings().mutex);
    crossings().sent.clear();
    crossings().received.clear();
  }
  cfg.load<caf::io::middleman>();
  caf::actor_system sys{cfg};
  caf::scoped_actor self{sys};

  auto sup_or = sys.middleman().remote_actor<supervisor_actor>("127.0.0.1", static_cast<uint16_t>(ids.at("port")));
  REQUIRE(sup_or);
  const supervisor_actor sup = *sup_or;
  auto box = std::make_shared<inbox>();
  const collector_actor events = sys.spawn(collector, box);

  // ---- supervisor: status, directory ----
  const auto status = ask<engine_status>(self, sup, get_atom_v, status_atom_v);
  REQUIRE(status);
  REQUIRE(status->actors.size() == 3);  // device:CPU, device:CPU1, loader
  CHECK(status->actors[1].name == "device:CPU1");
  const auto dir = ask<actor_directory>(self, sup, get_atom_v, directory_atom_v);
  REQUIRE(dir);
  REQUIRE(dir->device_names == std::vector<std::string>{"CPU", "CPU1"});
  const memory_accountant_actor acct = dir->accountant;
  const device_actor cpu1 = dir->devices[1];
  const allocator_actor alloc1 = dir->allocators[1];
  const loader_actor loader = dir->loader;

  // ---- memory accountant: record, device report, subscription ----
  const auto sub = ask<bool>(self, acct, subscribe_atom_v, breakdown_subscriber{events});
  REQUIRE(sub);
  CHECK(*sub);
  tell(self, acct, record_atom_v, memory_event{"Remote", "Remote", false, 2, 1000, "remote-test"});
  tell(self, acct, device_atom_v, device_status{"Remote", "a remote test device", 1 << 20, 1 << 19, false, 0});
  auto b = ask<memory_breakdown>(self, acct, get_atom_v, breakdown_atom_v);
  REQUIRE(b);
  CHECK(b->compute == 1000);
  CHECK(b->table.find("Remote") != std::string::npos);
  tell(self, acct, record_atom_v, memory_event{"Remote", "Remote", false, 2, -1000, "remote-test"});

  // ---- loader (through the supervisor): a load with progress to this process ----
  load_request lr;
  // Micro-batches of 2 tokens: the scheduler's step below runs through the peer's pipeline as several.
  lr.model = {.name = "m", .path = model->string(), .devices = {{"CPU1", 2}}, .n_ctx = 256, .n_ubatch = 2, .n_seq_max = 2,
              .n_threads = 1, .overrides = {{"^output_norm", "CPU1"}}};
  lr.progress = events;
  const auto info = ask<model_info>(self, sup, load_atom_v, lr);
  REQUIRE(info);
  CHECK(info->uploads.size() == 2);
  // What the request said took effect in the peer. The devices take 2 of the model's layers, so without the
  // override the output layer (output_norm.weight with it) stays on the host: CPU1's upload is the bytes of
  // layers n_layer - 2 .. n_layer - 1 and of output_norm.weight exactly, as the file gives them, the host's
  // the rest. An override dropped on the way, or one the loader ignores, leaves output_norm.weight on "CPU".
  {
    const gguf_file file = read_gguf(*model);
    std::map<std::string, uint64_t> want;
    for (const gguf_tensor_info& t : file.tensors()) {
      const bool on_cpu1 = layer_of(t.name) >= static_cast<int>(info->n_layer) - 2 || t.name == "output_norm.weight";
      want[on_cpu1 ? "CPU1" : "CPU"] += t.n_bytes;
    }
    std::map<std::string, uint64_t> uploaded;
    for (const upload_result& u : info->uploads) uploaded[u.device] += u.bytes;
    CHECK(info->n_layer > 2);
    CHECK(uploaded == want);
  }
  tell(self, loader, cancel_atom_v, std::string("not-loading"));
  const auto bad = ask<model_info>(self, sup, load_atom_v, load_request{{.name = "bad", .path = "/nonexistent.gguf"}, {}});
  REQUIRE_FALSE(bad);
  CHECK(is(bad.error(), errc::failed));
  CHECK(describe(bad.error()).find("/nonexistent.gguf") != std::string::npos);

  // ---- sessions: completion and chat, streamed to this process ----
  const auto sess = ask<session_actor>(self, sup, open_atom_v, session_request{"m"});
  REQUIRE(sess);
  generate_request gr;
  gr.prompt = "Once upon a time";
  gr.params.max_tokens = 12;
  gr.params.temperature = 0.0f;
  gr.subscriber = events;
  const auto reply = ask<generate_reply>(self, *sess, generate_atom_v, gr);
  if (!reply) FAIL(describe(reply.error()));
  CHECK(reply->tokens.size() == 12);
  generate_request chat;
  chat.chat = true;
  chat.messages = {{"user", "Hi"}};
  chat.params.max_tokens = 4;
  const auto chat_reply = ask<generate_reply>(self, *sess, generate_atom_v, chat);
  REQUIRE(chat_reply);
  // What the session holds, for another session to share (n answers, one prefill); sharing into itself is
  // refused by the scheduler.
  const auto prefix = ask<session_prefix>(self, *sess, get_atom_v, prefix_atom_v);
  REQUIRE(prefix);
  CHECK(prefix->model == "m");
  CHECK(prefix->tokens.size() > 4);
  const auto self_share = ask<bool>(self, *sess, share_atom_v, *prefix);
  REQUIRE_FALSE(self_share);
  CHECK(is(self_share.error(), errc::bad_request));
  // An embedding: the session checks the ids and delegates to the model's decoder actor, whose reply comes
  // straight back to this process; an id outside the vocabulary is refused by the session.
  const auto emb = ask<embed_reply>(self, *sess, embed_atom_v, embed_request{{1, 403, 407}});
  if (!emb) FAIL(describe(emb.error()));
  CHECK(emb->embedding.size() == 64);  // stories260K's n_embd
  double norm2 = 0;
  for (const float x : emb->embedding) norm2 += static_cast<double>(x) * x;
  CHECK(norm2 == Approx(1.0).epsilon(1e-5));
  const auto out_of_vocab = ask<embed_reply>(self, *sess, embed_atom_v, embed_request{{1, static_cast<int32_t>(info->n_vocab)}});
  REQUIRE_FALSE(out_of_vocab);
  CHECK(is(out_of_vocab.error(), errc::bad_request));
  tell(self, *sess, cancel_atom_v);
  CHECK(value_or<bool>(ask<bool>(self, *sess, reset_atom_v), false));

  // ---- scheduler of the model: attach, a step through the peer's pipeline, stats, detach ----
  REQUIRE(dir->model_names.empty());
  const auto dir2 = ask<actor_directory>(self, sup, get_atom_v, directory_atom_v);
  REQUIRE(dir2);
  REQUIRE(dir2->model_names == std::vector<std::string>{"m"});
  const decoder_actor sched = dir2->decoders[0];
  // This scoped actor stands in for a session (it only steps; the scheduler checks the sender).
  const auto seq = ask<int32_t>(self, sched, attach_atom_v, caf::actor_cast<session_actor>(self));
  REQUIRE(seq);
  const auto foreign = ask<step_logits>(self, sched, step_atom_v, decode_step{0, 0, {1}});  // the session's sequence
  REQUIRE_FALSE(foreign);
  CHECK(is(foreign.error(), errc::bad_request));
  // Splits the peer's device actors have computed (nothing else decodes in the peer meanwhile).
  auto splits_on = [&](const device_actor& d) {
    const auto s = ask<device_status>(self, d, memory_atom_v);
    REQUIRE(s);
    return s->n_splits;
  };
  const device_actor cpu = dir->devices[0];
  const uint64_t cpu_before = splits_on(cpu);
  const uint64_t cpu1_before = splits_on(cpu1);
  const auto logits = ask<step_logits>(self, sched, step_atom_v, decode_step{*seq, 0, {1, 403, 407}});
  REQUIRE(logits);
  CHECK(logits->logits.size() == info->n_vocab);
  // The session above holds "Once upon a time..." ([1, 403, 407, ...]): the step takes the first two
  // positions from its cells (prefix reuse across sequences, crossing the network in step_logits::reused)
  // and decodes one token: one micro-batch, a split on CPU, one on CPU1 (layers 3..4 and the output norm)
  // and one more on CPU (the output), every one on the peer's device actor of its device.
  CHECK(logits->reused == 2);
  CHECK(splits_on(cpu1) - cpu1_before == 1);
  CHECK(splits_on(cpu) - cpu_before == 2);
  tell(self, sched, end_atom_v, *seq);
  const auto stats = ask<decoder_stats>(self, sched, get_atom_v, stats_atom_v);
  REQUIRE(stats);
  CHECK(stats->n_sessions == 2);
  CHECK(value_or<bool>(ask<bool>(self, sched, detach_atom_v, *seq), false));

  // ---- device actor CPU1: buffers, range uploads, reads, a staged upload, a split ----
  const auto buf = ask<buffer_info>(self, cpu1, alloc_atom_v, alloc_request{4096, 2, "remote"});
  REQUIRE(buf);
  CHECK(buf->buft == "CPU1");
  std::vector<char> data(100);
  for (size_t i = 0; i < data.size(); ++i) data[i] = static_cast<char>(i * 7);
  CHECK(value_or<uint64_t>(ask<uint64_t>(self, cpu1, upload_atom_v, range_upload{buf->id, 16, data}), 0) == 100);
  const auto back = ask<std::vector<char>>(self, cpu1, get_atom_v, tensor_range{buf->id, 16, 100});
  REQUIRE(back);
  CHECK(*back == data);
  const auto oob = ask<std::vector<char>>(self, cpu1, get_atom_v, tensor_range{buf->id, 4090, 100});
  REQUIRE_FALSE(oob);
  CHECK(is(oob.error(), errc::bad_request));
  const auto mem = ask<device_status>(self, cpu1, memory_atom_v);
  REQUIRE(mem);
  CHECK(mem->n_buffers == 1);
  CHECK(value_or<uint64_t>(ask<uint64_t>(self, cpu1, free_atom_v, buf->id), 0) == 4096);
  const auto staged = ask<upload_result>(self, cpu1, upload_atom_v, upload_job{ids.at("load"), "CPU1"});
  REQUIRE(staged);
  CHECK(staged->bytes > 0);
  const auto unknown = ask<upload_result>(self, cpu1, upload_atom_v, upload_job{999999, "CPU1"});
  REQUIRE_FALSE(unknown);
  CHECK(is(unknown.error(), errc::not_found));
  // A decode split task of the peer's process, run by its CPU1 device actor for this one.
  const auto split = ask<split_result>(self, cpu1, compute_atom_v, decode_split{ids.at("split"), 0});
  REQUIRE(split);
  CHECK(split->split == 0);
  CHECK(splits_on(cpu1) == mem->n_splits + 1);
  // An id that names no split task in the device's process (a graph's, there) finds nothing.
  const auto foreign_split = ask<split_result>(self, cpu1, compute_atom_v, decode_split{ids.at("graph"), 0});
  REQUIRE_FALSE(foreign_split);
  CHECK(is(foreign_split.error(), errc::not_found));
  const auto buf2 = ask<buffer_info>(self, cpu1, alloc_atom_v, alloc_request{1024, 2, "remote"});
  REQUIRE(buf2);
  CHECK(value_or<uint64_t>(ask<uint64_t>(self, cpu1, free_atom_v, all_atom_v), 0) == 1024);

  // ---- allocator actor CPU1: a reservation, a planned graph, usage, release ----
  CHECK(value_or<int64_t>(ask<int64_t>(self, alloc1, reserve_atom_v, compute_reservation{"remote", 8192}), 0) == 8192);
  const auto planned = ask<uint64_t>(self, alloc1, plan_atom_v, graph_plan{ids.at("graph"), "remote-graph"});
  REQUIRE(planned);
  CHECK(*planned > 0);
  const auto usage = ask<allocator_usage>(self, alloc1, get_atom_v, usage_atom_v);
  REQUIRE(usage);
  CHECK(usage->owners.size() >= 2);
  CHECK(value_or<uint64_t>(ask<uint64_t>(self, alloc1, release_atom_v, std::string("remote")), 0) == 8192);
  CHECK(value_or<uint64_t>(ask<uint64_t>(self, alloc1, release_atom_v, std::string("remote-graph")), 0) == *planned);

  // ---- remote-peer actor: status (up), memory over its connection, a model attached, state updates ----
  REQUIRE(ids.count("peer_port"));
  auto peer_or = sys.middleman().remote_actor<peer_actor>("127.0.0.1", static_cast<uint16_t>(ids.at("peer_port")));
  REQUIRE(peer_or);
  const peer_actor rpeer = *peer_or;
  CHECK(value_or<bool>(ask<bool>(self, rpeer, subscribe_atom_v, peer_subscriber{events}), false));
  caf::expected<peer_status> ps{caf::error{}};
  for (int i = 0; i < 300; ++i) {  // at most ~30 s
    ps = ask<peer_status>(self, rpeer, get_atom_v, status_atom_v);
    if (!ps || ps->state == "up") break;
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  REQUIRE(ps);
  CHECK(ps->state == "up");
  CHECK(ps->name == "loopback");
  CHECK(ps->epoch == 1);
  REQUIRE(ps->devices.size() == 1);
  const auto checked = ask<peer_status>(self, rpeer, check_atom_v);
  REQUIRE(checked);
  CHECK(checked->state == "up");
  const auto peer_mem = ask<peer_memory>(self, rpeer, memory_atom_v);
  REQUIRE(peer_mem);
  REQUIRE(peer_mem->devices.size() == 1);
  CHECK(peer_mem->devices[0].total > 0);
  tell(self, rpeer, attach_atom_v, std::string("remote-model"));
  const auto attached = ask<peer_status>(self, rpeer, get_atom_v, status_atom_v);
  REQUIRE(attached);
  CHECK(attached->models == std::vector<std::string>{"remote-model"});
  tell(self, rpeer, detach_atom_v, std::string("remote-model"));

  // ---- events that came back: load progress, tokens, memory updates ----
  {
    std::lock_guard l(box->mutex);
    CHECK_FALSE(box->progress.empty());
    if (!box->progress.empty()) CHECK(box->progress.back().done == box->progress.back().total);
    CHECK(box->tokens.size() >= 12);
    CHECK_FALSE(box->updates.empty());
    CHECK_FALSE(box->peer_updates.empty());
  }
  tell(self, acct, unsubscribe_atom_v, breakdown_subscriber{events});
  tell(self, rpeer, unsubscribe_atom_v, peer_subscriber{events});

  // ---- unload and shutdown: the final breakdown is zero ----
  CHECK(value_or<bool>(ask<bool>(self, sup, unload_atom_v, std::string("m")), false));
  tell(self, sup, cancel_atom_v, std::string("m"));
  const auto final_b = ask<memory_breakdown>(self, sup, shutdown_atom_v);
  REQUIRE(final_b);
  CHECK(final_b->model + final_b->context + final_b->compute == 0);  // the embeddings context's memory too
  CHECK(final_b->n_rejected == 0);

  // Every message type is registered, and went across: CAF serialized it here for the peer or deserialized
  // it here from the peer (as a message element or inside one).
  std::set<std::string> registered;
  for (const std::string& t : registered_names()) registered.insert(short_name(t));
  CHECK(registered == message_types);
  std::set<std::string> sent, received;
  {
    std::lock_guard l(crossings().mutex);
    sent = crossings().sent;
    received = crossings().received;
  }
  for (const std::string& t : registered) {
    INFO("type " << t);
    CHECK(sent.count(t) + received.count(t) > 0);
  }
  // Both ways: requests and what they carry out, replies and events back.
  for (const char* t : {"load_request", "model_settings", "tensor_override", "device_layers", "generate_params", "memory_event"}) {
    INFO("sent " << t);
    CHECK(sent.count(t) == 1);
  }
  for (const char* t : {"model_info", "upload_result", "token_event", "buft_usage", "owner_bytes", "actor_status"}) {
    INFO("received " << t);
    CHECK(received.count(t) == 1);
  }
  self->send_exit(events, caf::exit_reason::user_shutdown);
}

TEST_CASE("every message type's inspect() lists every field of its struct", "[actors][remote]") {
  // A field left out of inspect() is never serialized: the receiver gets its default, and only a test that
  // happens to look at that field notices. Fields are counted from the struct itself (aggregate
  // initialization), bases through base_of.
  check_block_fields(std::make_integer_sequence<caf::type_id_t, caf::id_block::troupe::end - caf::id_block::troupe::begin>{});
  check_fields<llm::token_bias>("troupe::llm::token_bias");
  check_fields<llm::token_prob>("troupe::llm::token_prob");
  check_fields<llm::token_logprob>("troupe::llm::token_logprob");
  // The counting itself: a struct and one of its fields' worth of inspect().
  static_assert(struct_fields<tensor_override>() == 2);
  static_assert(struct_fields<model_settings>() == 26);
  static_assert(struct_fields<generate_reply>() == 10);
  static_assert(struct_fields<llm::generate_params>() == 23);
}
