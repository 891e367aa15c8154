// troupe serve: the daemon. A TOML configuration (net/http/daemon_config.h), command-line flags over it,
// an engine with the configured devices and models, and the OpenAI-compatible HTTP API (net/http/daemon.h).
//
//   troupe serve --config configs/daemon.toml
//   troupe serve -m models/SmolLM2-135M-Instruct.Q4_1.gguf --port 8080     (no file: one model from flags)
//   troupe serve -m MODEL -ngl 99                                           (every layer on the first GPU)
//   troupe serve -m MODEL -c 8192 -np 4 -ctk q8_0 --cache-ram 4096          (llama-server's flags)
//   troupe serve --models-dir ~/models --memory-budget 8192                 (every GGUF there, on demand)
//
// Startup: listens first (GET /health says "loading"), loads the models, prints the memory breakdown and
// the address, then "ready". SIGTERM/SIGINT: stops accepting, lets in-flight answers finish (up to
// server.shutdown_grace_s, then cancels them), frees everything, prints the final memory breakdown, exits 0.
#include <signal.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <mutex>
#include <thread>

#include "actors/engine.h"
#include "net/cluster/cluster_engine.h"
#include "backends/rpc/wire/auth.h"
#include "net/http/daemon_config.h"
#include "net/http/daemon.h"
#include "runtime/log.h"
#include "tools/common/offload_options.h"
#include "tools/common/trace_option.h"
#include "tools/troupe/commands.h"

namespace troupe::cli {

namespace {

struct serve_options {
  std::string config;
  std::string model;
  std::string name;
  std::string host;
  int port = -1;
  std::vector<std::string> api_keys;
  int threads = -1;
  int parallel = -1;
  int ctx = -1;
  int batch = -1, ubatch = -1;
  int cache_ram = -1;  // MiB
  std::string cache_type_k, cache_type_v, flash_attn;
  bool context_shift = false;
  std::string chat_template, chat_template_file;
  std::string log_level;
  llm::offload_request offload;
  std::string trace;  // Chrome trace of the daemon's run, written at exit
  std::string models_dir;
  int memory_budget = -1;  // MiB on every device
  std::string keep_alive;
};

int signal_pipe[2] = {-1, -1};

extern "C" void on_signal(int sig) {
  const unsigned char b = static_cast<unsigned char>(sig);
  (void)!write(signal_pipe[1], &b, 1);
}

log_level parse_level(const std::string& s) {
  if (s == "debug") return log_level::debug;
  if (s == "warn") return log_level::warn;
  if (s == "error") return log_level::error;
  return log_level::info;
}

// Log lines with a UTC timestamp on stderr, one write per line (threads do not interleave).
void stderr_sink(log_level level, std::string_view msg) {
  static std::mutex m;
  char ts[32];
  const auto now = std::chrono::system_clock::now();
  const std::time_t t = std::chrono::system_clock::to_time_t(now);
  std::tm tm{};
  gmtime_r(&t, &tm);
  std::strftime(ts, sizeof ts, "%Y-%m-%dT%H:%M:%SZ", &tm);
  std::lock_guard l(m);
  std::fprintf(stderr, "%s %-5s %.*s\n", ts, std::string(log_level_name(level)).c_str(), static_cast<int>(msg.size()),
               msg.data());
  std::fflush(stderr);
}

int run_serve(const serve_options& o) {
  const cli::trace_guard tracing(o.trace);
  http::daemon_config cfg;
  if (!o.config.empty()) {
    cfg = http::load_daemon_config(o.config);
  }
  // Flags over the file.
  if (!o.model.empty()) {
    actors::model_settings m;
    if (!cfg.engine.models.empty()) m = cfg.engine.models.front();
    m.path = o.model;
    m.name = !o.name.empty() ? o.name : std::filesystem::path(o.model).stem().string();
    cfg.engine.models.clear();
    cfg.engine.models.push_back(m);
  } else if (!o.name.empty()) {
    if (cfg.engine.models.size() != 1) throw error("--name needs --model or a configuration with one model");
    cfg.engine.models.front().name = o.name;
  }
  // --models-dir: its files become models here, so that the flags below apply to them too.
  if (!o.models_dir.empty()) cfg.server.models_dir = o.models_dir;
  for (actors::model_settings& m : http::models_in_dir(cfg)) cfg.engine.models.push_back(std::move(m));
  if (o.memory_budget >= 0) cfg.server.memory_budget_mib = {{"*", static_cast<uint64_t>(o.memory_budget)}};
  if (!o.keep_alive.empty()) {
    const std::optional<int64_t> ms = actors::parse_keep_alive(o.keep_alive);
    if (!ms) throw error("--keep-alive must be seconds or a duration such as 5m (negative: for ever), not '" + o.keep_alive + "'");
    for (actors::model_settings& m : cfg.engine.models) m.keep_alive_ms = *ms;
  }
  if (!o.host.empty()) cfg.server.host = o.host;
  if (o.port >= 0) {
    if (o.port > 65535) throw error("--port must be from 0 to 65535");
    cfg.server.port = static_cast<uint16_t>(o.port);
  }
  for (const std::string& k : o.api_keys) cfg.server.api_keys.push_back(k);
  if (o.threads >= 0) {
    cfg.engine.n_threads = o.threads;
    for (actors::model_settings& m : cfg.engine.models) m.n_threads = o.threads;
  }
  if (o.parallel > 0) {
    for (actors::model_settings& m : cfg.engine.models) m.n_seq_max = static_cast<uint32_t>(o.parallel);
  }
  for (actors::model_settings& m : cfg.engine.models) {
    if (o.ctx > 0) m.n_ctx = static_cast<uint32_t>(o.ctx);
    if (o.batch > 0) m.n_batch = static_cast<uint32_t>(o.batch);
    if (o.ubatch > 0) m.n_ubatch = static_cast<uint32_t>(o.ubatch);
    if (o.cache_ram >= 0) m.prompt_cache_mib = static_cast<uint32_t>(o.cache_ram);
    if (!o.cache_type_k.empty()) m.kv_type = o.cache_type_k;
    if (!o.cache_type_v.empty()) m.kv_type_v = o.cache_type_v;
    if (!o.flash_attn.empty()) m.flash_attn = o.flash_attn;
    if (o.context_shift) m.context_shift = true;
    // A flag replaces the file's template choice, whichever key that used.
    if (!o.chat_template.empty()) {
      m.chat_template = o.chat_template;
      m.chat_template_file.clear();
    }
    if (!o.chat_template_file.empty()) {
      m.chat_template_file = o.chat_template_file;
      m.chat_template.clear();
    }
  }
  if (o.offload.given()) {  // -ngl / --device replace every model's devices table
    for (actors::model_settings& m : cfg.engine.models) {
      m.devices.clear();
      for (const auto& [name, layers] : llm::offload_layers(o.offload, m.path)) m.devices.push_back({name, layers});
    }
  }
  if (o.offload.cpu_moe || o.offload.n_cpu_moe > 0) {  // --cpu-moe / --n-cpu-moe: as each model's cpu_moe
    for (actors::model_settings& m : cfg.engine.models) {
      for (const std::string& p : llm::cpu_moe_patterns(o.offload.cpu_moe, o.offload.n_cpu_moe)) m.overrides.push_back({p, "CPU"});
    }
  }
  if (!o.log_level.empty()) cfg.logging.level = o.log_level;
  http::validate_daemon_config(cfg);

  set_log_sink(stderr_sink);
  set_log_level(parse_level(cfg.logging.level));

  const bool loopback = cfg.server.host == "127.0.0.1" || cfg.server.host == "localhost" || cfg.server.host == "::1";
  if (!loopback && cfg.server.api_keys.empty()) {
    TROUPE_LOG(warn, "serving on " << cfg.server.host << " without API keys: anyone who can reach it may use it");
  }

  // SIGINT/SIGTERM: a handler that only writes the signal number into a pipe (async-signal-safe, whichever
  // thread takes the signal); a watcher thread reads it and stops the daemon.
  if (pipe(signal_pipe) != 0) throw error("serve: cannot create the signal pipe");
  struct sigaction sa {};
  sa.sa_handler = on_signal;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGINT, &sa, nullptr);
  sigaction(SIGTERM, &sa, nullptr);
  signal(SIGPIPE, SIG_IGN);

  // A cluster's coordinator (net/cluster/cluster_engine.h): the engine in an actor system with the middleman
  // and the cluster's types, the coordinator published on [cluster] host:port, the placer.
  std::unique_ptr<cluster::cluster_engine> coordinating;
  std::unique_ptr<engine> own_eng;
  if (cfg.cluster.enabled) {
    const http::cluster_config& cc = cfg.cluster;
    coordinating = std::make_unique<cluster::cluster_engine>(
        cfg.engine, cluster::coordinator_settings{.host = cc.host,
                                                   .port = cc.port,
                                                   .key = cc.key_file.empty() ? std::string() : rpc::load_key_file(cc.key_file),
                                                   .tls = {cc.tls_cert, cc.tls_key, cc.tls_ca},
                                                   .heartbeat = std::chrono::milliseconds(cc.heartbeat_ms),
                                                   .down_after = std::chrono::milliseconds(cc.down_after_ms),
                                                   .coordinator_devices = cc.coordinator_devices,
                                                   .margin = uint64_t{cc.margin_mib} << 20,
                                                   .rebalance_on_join = cc.rebalance == "on_join"});
  } else {
    own_eng = std::make_unique<engine>(cfg.engine);
  }
  engine& eng = coordinating ? coordinating->engine() : *own_eng;
  http::daemon d(eng, cfg);
  if (coordinating) {
    d.set_cluster_status([&coordinating] { return coordinating->status_json(); });
    d.set_placement([&coordinating, &d](const actors::model_settings& s, bool first) {
      return coordinating->placement().place(s, first, [&d] { return d.stopping(); });
    });
  }
  const int port = d.bind();
  std::thread server([&] { d.serve(); });

  std::thread watcher([&] {
    unsigned char sig = 0;
    while (read(signal_pipe[0], &sig, 1) < 0 && errno == EINTR) {
    }
    if (sig != 0) TROUPE_LOG(info, "received " << (sig == SIGINT ? "SIGINT" : "SIGTERM") << ": shutting down");
    d.stop();
  });

  int rc = 0;
  try {
    d.load_models();
    if (coordinating) {
      coordinating->placement().watch([&d](const std::string& model, const std::string& why) { d.replace_model(model, why); });
    }
    const actors::memory_breakdown mem = eng.memory();
    std::fprintf(stderr, "%s", mem.table.c_str());
    TROUPE_LOG(info, "listening on http://" << cfg.server.host << ":" << port << " (OpenAI API at /v1)");
    TROUPE_LOG(info, "ready");
  } catch (const std::exception& e) {
    TROUPE_LOG(error, "startup failed: " << e.what());
    rc = 1;
    d.stop();
  }
  server.join();
  if (coordinating) coordinating->stop_placing();  // (its watcher may be placing a model again: stop() ends that)
  const unsigned char none = 0;  // ends the watcher when no signal came
  (void)!write(signal_pipe[1], &none, 1);
  watcher.join();
  const actors::memory_breakdown final = eng.shutdown();
  std::fprintf(stderr, "%s", final.table.c_str());
  TROUPE_LOG(info, "stopped: " << final.model + final.context + final.compute << " bytes still held");
  return rc;
}

}  // namespace

command_fn add_serve(CLI::App& app) {
  auto o = std::make_shared<serve_options>();
  app.add_option("--config", o->config, "daemon configuration (TOML; see configs/daemon.toml)");
  app.add_option("-m,--model", o->model, "serve this GGUF file (replaces the configuration's models)");
  app.add_option("--name", o->name, "the model's name in the API (default: the file name without .gguf)");
  app.add_option("--host", o->host, "address to listen on (default 127.0.0.1)");
  app.add_option("--port", o->port, "port to listen on; 0: any free port (default 8080)");
  app.add_option("--api-key", o->api_keys, "an accepted bearer key (repeatable)");
  app.add_option("-t,--threads", o->threads, "CPU threads for decoding; 0: all");
  cli::add_trace_option(app, o->trace);
  // llama-server's spellings where they mean the same (-np, -ctk, -ctv, -fa, -cram, -ub: tools/common).
  app.add_option("--parallel,--n-parallel", o->parallel, "(-np) parallel sessions per model");
  app.add_option("-c,--ctx-size,--ctx", o->ctx, "KV cache cells per model (one pool for its parallel sessions)");
  app.add_option("-b,--batch-size", o->batch, "prompt tokens per decode (n_batch)");
  app.add_option("--ubatch-size", o->ubatch, "(-ub) tokens per graph (n_ubatch)");
  app.add_option("--cache-ram", o->cache_ram, "(-cram) MiB of host memory for prompts evicted from the KV cache; 0: off")
      ->check(CLI::Range(0, 1 << 24));
  app.add_option("--cache-type-k", o->cache_type_k, "(-ctk) KV cache type of K (f16, f32, bf16, q8_0, q4_0, q4_1, q5_0, q5_1, iq4_nl)");
  app.add_option("--cache-type-v", o->cache_type_v, "(-ctv) KV cache type of V (the same names; default K's)");
  app.add_option("--flash-attn", o->flash_attn, "(-fa) attention as one fused op: on, off or auto")
      ->check(CLI::IsMember({"on", "off", "auto"}));
  app.add_flag("--context-shift", o->context_shift,
               "an answer at its context's limit drops the oldest half after the request's n_keep tokens and goes on");
  app.add_option("--chat-template", o->chat_template, "a built-in template family instead of the models' own (chatml, llama3, gemma, raw, ...)");
  app.add_option("--chat-template-file", o->chat_template_file, "a Jinja chat template file instead of the models' own");
  add_offload_options(app, o->offload);
  app.add_option("--models-dir", o->models_dir, "serve every .gguf file of this folder, named by its file, loaded on demand");
  app.add_option("--memory-budget", o->memory_budget,
                 "MiB the models may hold on each device; idle models unload to make room (default: the device's free memory)")
      ->check(CLI::Range(0, 1 << 30));
  app.add_option("--keep-alive", o->keep_alive, "how long a model stays loaded once idle: seconds or 5m, 1h (-1: for ever)");
  app.add_option("--log-level", o->log_level, "debug, info, warn or error")
      ->check(CLI::IsMember({"debug", "info", "warn", "error"}));
  return [o] {
    if (o->config.empty() && o->model.empty() && o->models_dir.empty()) {
      std::fprintf(stderr, "troupe serve: give --config FILE, --model FILE or --models-dir DIR\n");
      return 1;
    }
    return run_serve(*o);
  };
}

}  // namespace troupe::cli
