// Every message type of actors/type_ids.h crosses a real CAF middleman connection between two processes:
// this test talks to the actors of an actors_peer process (tests/actors/peer_main.cpp) on 127.0.0.1,
// sending every request and subscribing to every stream, and checks at the end that each registered type
// went across (as a request, a reply, an event or inside one of them). Errors cross too, with their code
// and text. Every wait is bounded; the peer is killed at the end.
#include <catch2/catch.hpp>

#include <caf/all.hpp>
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

template <class T, class Handle, class... Ts>
caf::expected<T> ask(caf::scoped_actor& self, const Handle& h, Ts&&... xs) {
  caf::expected<T> out{caf::make_error(caf::sec::request_timeout)};
  self->request(h, timeout, std::forward<Ts>(xs)...)
      .receive([&](T& v) { out = std::move(v); }, [&](caf::error& e) { out = std::move(e); });
  return out;
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
  cfg.load<caf::io::middleman>();
  caf::actor_system sys{cfg};
  caf::scoped_actor self{sys};
  std::set<std::string> crossed;
  auto mark = [&](std::initializer_list<const char*> ts) {
    for (const char* t : ts) crossed.insert(std::string("troupe::actors::") + t);
  };

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
  mark({"engine_status", "actor_status"});
  const auto dir = ask<actor_directory>(self, sup, get_atom_v, directory_atom_v);
  REQUIRE(dir);
  REQUIRE(dir->device_names == std::vector<std::string>{"CPU", "CPU1"});
  mark({"actor_directory"});
  const memory_accountant_actor acct = dir->accountant;
  const device_actor cpu1 = dir->devices[1];
  const allocator_actor alloc1 = dir->allocators[1];
  const loader_actor loader = dir->loader;

  // ---- memory accountant: record, device report, subscription ----
  const auto sub = ask<bool>(self, acct, subscribe_atom_v, breakdown_subscriber{events});
  REQUIRE(sub);
  CHECK(*sub);
  self->send(acct, record_atom_v, memory_event{"Remote", "Remote", false, 2, 1000, "remote-test"});
  self->send(acct, device_atom_v, device_status{"Remote", "a remote test device", 1 << 20, 1 << 19, false, 0});
  auto b = ask<memory_breakdown>(self, acct, get_atom_v, breakdown_atom_v);
  REQUIRE(b);
  CHECK(b->compute == 1000);
  CHECK(b->table.find("Remote") != std::string::npos);
  self->send(acct, record_atom_v, memory_event{"Remote", "Remote", false, 2, -1000, "remote-test"});
  mark({"memory_event", "device_status", "memory_breakdown", "buft_usage"});

  // ---- loader (through the supervisor): a load with progress to this process ----
  load_request lr;
  // Micro-batches of 2 tokens: the scheduler's step below runs through the peer's pipeline as several.
  lr.model = {.name = "m", .path = model->string(), .devices = {{"CPU1", 2}}, .n_ctx = 256, .n_ubatch = 2, .n_seq_max = 2,
              .n_threads = 1, .overrides = {{"^output_norm", "CPU1"}}};
  lr.progress = events;
  const auto info = ask<model_info>(self, sup, load_atom_v, lr);
  REQUIRE(info);
  CHECK(info->uploads.size() == 2);
  mark({"load_request", "model_settings", "device_layers", "tensor_override", "model_info", "upload_result"});
  self->send(loader, cancel_atom_v, std::string("not-loading"));
  const auto bad = ask<model_info>(self, sup, load_atom_v, load_request{{.name = "bad", .path = "/nonexistent.gguf"}, {}});
  REQUIRE_FALSE(bad);
  CHECK(is(bad.error(), errc::failed));
  CHECK(describe(bad.error()).find("/nonexistent.gguf") != std::string::npos);

  // ---- sessions: completion and chat, streamed to this process ----
  const auto sess = ask<session_actor>(self, sup, open_atom_v, session_request{"m"});
  REQUIRE(sess);
  mark({"session_request"});
  generate_request gr;
  gr.prompt = "Once upon a time";
  gr.params.max_tokens = 12;
  gr.params.temperature = 0.0f;
  gr.subscriber = events;
  const auto reply = ask<generate_reply>(self, *sess, generate_atom_v, gr);
  if (!reply) FAIL(describe(reply.error()));
  CHECK(reply->tokens.size() == 12);
  mark({"generate_request", "generate_reply", "token_event"});
  crossed.insert("troupe::llm::generate_params");  // inside generate_request
  generate_request chat;
  chat.chat = true;
  chat.messages = {{"user", "Hi"}};
  chat.params.max_tokens = 4;
  const auto chat_reply = ask<generate_reply>(self, *sess, generate_atom_v, chat);
  REQUIRE(chat_reply);
  mark({"chat_message"});
  // What the session holds, for another session to share (n answers, one prefill); sharing into itself is
  // refused by the scheduler.
  const auto prefix = ask<session_prefix>(self, *sess, get_atom_v, prefix_atom_v);
  REQUIRE(prefix);
  CHECK(prefix->model == "m");
  CHECK(prefix->tokens.size() > 4);
  const auto self_share = ask<bool>(self, *sess, share_atom_v, *prefix);
  REQUIRE_FALSE(self_share);
  CHECK(is(self_share.error(), errc::bad_request));
  mark({"session_prefix"});
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
  mark({"embed_request", "embed_reply"});
  self->send(*sess, cancel_atom_v);
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
  // 3 tokens: 2 micro-batches, each a split on CPU, one on CPU1 (layers 3..4 and the output norm) and one
  // more on CPU (the output), every one on the peer's device actor of its device.
  CHECK(splits_on(cpu1) - cpu1_before == 2);
  CHECK(splits_on(cpu) - cpu_before == 4);
  self->send(sched, end_atom_v, *seq);
  const auto stats = ask<decoder_stats>(self, sched, get_atom_v, stats_atom_v);
  REQUIRE(stats);
  CHECK(stats->n_sessions == 2);
  CHECK(value_or<bool>(ask<bool>(self, sched, detach_atom_v, *seq), false));
  mark({"decode_step", "step_logits", "decoder_stats"});

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
  mark({"alloc_request", "buffer_info", "range_upload", "tensor_range", "upload_job", "decode_split", "split_result"});

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
  mark({"compute_reservation", "graph_plan", "allocator_usage", "owner_bytes"});

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
  self->send(rpeer, attach_atom_v, std::string("remote-model"));
  const auto attached = ask<peer_status>(self, rpeer, get_atom_v, status_atom_v);
  REQUIRE(attached);
  CHECK(attached->models == std::vector<std::string>{"remote-model"});
  self->send(rpeer, detach_atom_v, std::string("remote-model"));
  mark({"peer_status", "peer_memory"});

  // ---- events that came back: load progress, tokens, memory updates ----
  {
    std::lock_guard l(box->mutex);
    CHECK_FALSE(box->progress.empty());
    if (!box->progress.empty()) CHECK(box->progress.back().done == box->progress.back().total);
    CHECK(box->tokens.size() >= 12);
    CHECK_FALSE(box->updates.empty());
    CHECK_FALSE(box->peer_updates.empty());
  }
  mark({"load_progress"});
  self->send(acct, unsubscribe_atom_v, breakdown_subscriber{events});
  self->send(rpeer, unsubscribe_atom_v, peer_subscriber{events});

  // ---- unload and shutdown: the final breakdown is zero ----
  CHECK(value_or<bool>(ask<bool>(self, sup, unload_atom_v, std::string("m")), false));
  self->send(sup, cancel_atom_v, std::string("m"));
  const auto final_b = ask<memory_breakdown>(self, sup, shutdown_atom_v);
  REQUIRE(final_b);
  CHECK(final_b->model + final_b->context + final_b->compute == 0);  // the embeddings context's memory too
  CHECK(final_b->n_rejected == 0);

  // Every registered type went across.
  const std::set<std::string> all = registered_names();
  CHECK(all.size() >= 36);  // the block is not empty; each type is checked below
  for (const std::string& t : all) {
    INFO("type " << t);
    CHECK(crossed.count(t) == 1);
  }
  self->send_exit(events, caf::exit_reason::user_shutdown);
}
