// troupe bench: prompt-processing and generation throughput, like llama-bench.
//
//   troupe bench -m MODEL [-p 128[,512...]] [-n 64[,...]] [-d 0[,4096...]] [-t THREADS] [-r 5] [-b 512]
//                [-ctk f16[,q8_0...]] [-ctv TYPE[,...]] [-fa on|off|auto[,...]] [-o table|json]
//                [-ngl N] [--device A,B,...] [--rpc HOST:PORT[,HOST:PORT...] [--rpc-key-file F]]
//   troupe bench ops [...]   kernel throughput without a model (bench_ops.cpp)
//
// pp<N>: one batch of N tokens decoded at once (prompt processing), tokens per second.
// tg<N>: N tokens decoded one at a time (generation), tokens per second.
// Each test runs once as a warm-up, then -r times; the table shows mean ± standard deviation.
// -d N: the test runs after N tokens of context are already in the KV cache (llama-bench's -d: "pp512 @ d4096";
// the depth is decoded once per cache, untimed, and each run's own tokens are removed after it). -p, -n, -d,
// -ctk, -ctv and -fa take comma lists: every combination is run (one KV cache per type and -fa setting).
// The peak resident memory of the process (VmHWM) is printed at the end (and in the JSON of each test).
// --rpc: every layer on remote peers (`troupe peer`), split evenly over the first device of each; this
// process keeps the token embeddings. The table's last columns then give the round trips and the graphs
// sent per generated token.
// -ngl / --device: layers on local devices, as llama.cpp (llm/offload.h); the backend column names
// the devices holding layers. --device may name CPU instances (CPU1, ...: created, -t threads each) and,
// with --rpc, the peers' devices (RPC[host:port]#0). --pipeline on (the default) runs a prompt's
// micro-batches over several devices at once; --trace FILE writes a Chrome trace of the runs.
#include <algorithm>
#include <chrono>
#include <optional>
#include <cmath>
#include <cstdio>
#include <random>
#include <string>
#include <string_view>
#include <vector>

#include "backends/cpu/cpu_backend.h"
#include "backends/cpu/cpu_features.h"
#include "backends/cpu/kernels.h"
#include "backends/rpc/rpc.h"
#include "backends/rpc/wire/auth.h"
#include "llm/kv_cache.h"
#include "llm/llm_context.h"
#include "runtime/trace.h"
#include "tools/common/offload_options.h"
#include "tools/common/trace_option.h"
#include "tools/troupe/commands.h"

namespace troupe::cli {
namespace {

struct bench_options {
  std::string model;
  std::vector<int> n_prompt{128};
  std::vector<int> n_gen{64};
  std::vector<int> n_depth{0};
  std::vector<std::string> type_k{"f16"};
  std::vector<std::string> type_v;  // empty: K's
  std::vector<std::string> flash_attn{"auto"};
  int n_threads = 0;
  int reps = 5;
  int n_batch = 512;
  std::string output = "table";
  std::vector<std::string> rpc;  // peers holding the layers
  std::string rpc_key_file;
  llm::offload_request offload;
  std::string pipeline = "on";  // micro-batches of a prompt in flight over several devices at once
  std::string huge_pages = "on";  // host weights copied into 2 MiB pages where that pays
  std::string trace;            // Chrome trace of the measured runs
  int n_parallel = 1;           // sequences generating at once in the tg test
};

struct result {
  std::string test;
  int n_tokens = 0;
  int n_depth = 0;
  std::string type_k, type_v;
  bool flash_attn = true;
  std::vector<double> tps;
  double round_trips = 0;  // per token, with --rpc
  double graphs_sent = 0;
  double mean() const {
    double s = 0;
    for (double v : tps) s += v;
    return tps.empty() ? 0 : s / static_cast<double>(tps.size());
  }
  double stddev() const {
    if (tps.size() < 2) return 0;
    const double m = mean();
    double s = 0;
    for (double v : tps) s += (v - m) * (v - m);
    return std::sqrt(s / static_cast<double>(tps.size() - 1));
  }
};

std::vector<int32_t> random_tokens(int n, uint32_t n_vocab, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int32_t> d(0, static_cast<int32_t>(n_vocab) - 1);
  std::vector<int32_t> v(static_cast<size_t>(n));
  for (auto& t : v) t = d(rng);
  return v;
}

// The cache holding `depth` tokens of sequence 0, visible to sequences 1..n_seq-1 as well (shared cells):
// decoded n_batch tokens at a time, untimed.
void fill_depth(llm::llm_context& ctx, int depth, int n_seq, uint32_t n_vocab, uint32_t n_batch) {
  ctx.kv().clear();
  const std::vector<int32_t> tokens = random_tokens(depth, n_vocab, 3);
  for (int at = 0; at < depth;) {
    const int n = std::min<int>(static_cast<int>(n_batch), depth - at);
    llm::batch b;
    for (int i = 0; i < n; ++i) b.add(tokens[static_cast<size_t>(at + i)], at + i, 0, at + i + 1 == depth);
    ctx.decode(b);
    at += n;
  }
  for (int s = 1; s < n_seq && depth > 0; ++s) ctx.kv().seq_cp(0, s, 0, -1);
}

// A run's own positions (from `depth` on) removed from every sequence: the next run starts at the depth again.
void back_to_depth(llm::llm_context& ctx, int depth) { ctx.kv().seq_rm(-1, depth, -1); }

double run_pp(llm::llm_context& ctx, const std::vector<int32_t>& tokens, int depth) {
  back_to_depth(ctx, depth);
  llm::batch b;
  for (size_t i = 0; i < tokens.size(); ++i) b.add(tokens[i], depth + static_cast<int32_t>(i), 0, i + 1 == tokens.size());
  const auto t0 = std::chrono::steady_clock::now();
  ctx.decode(b);
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// n_parallel sequences generating at once: each step decodes one token of every sequence, in one batch,
// or (ring, several devices) as two groups of sequences whose steps go round the devices (decode_ring).
double run_tg(llm::llm_context& ctx, const std::vector<int32_t>& tokens, int n_parallel, bool ring, int depth) {
  back_to_depth(ctx, depth);
  const auto token_at = [&](size_t step, int s) { return tokens[(step + static_cast<size_t>(s)) % tokens.size()]; };
  const auto t0 = std::chrono::steady_clock::now();
  if (ring && n_parallel >= 2 && ctx.pipelines()) {
    const int halves[3] = {0, n_parallel / 2, n_parallel};
    const auto step_of = [&](size_t g, size_t step) {
      llm::batch b;
      for (int s = halves[g]; s < halves[g + 1]; ++s) b.add(token_at(step, s), depth + static_cast<int32_t>(step), s, true);
      return b;
    };
    std::vector<size_t> steps(2, 0);
    ctx.decode_ring({step_of(0, 0), step_of(1, 0)}, [&](size_t g, std::span<const float>, llm::batch& next) {
      if (++steps[g] == tokens.size()) return false;
      next = step_of(g, steps[g]);
      return true;
    });
  } else {
    llm::batch b;
    for (size_t i = 0; i < tokens.size(); ++i) {
      b.clear();
      for (int s = 0; s < n_parallel; ++s) b.add(token_at(i, s), depth + static_cast<int32_t>(i), s, true);
      ctx.decode(b);
    }
  }
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

std::string human_size(uint64_t b) {
  char buf[32];
  if (b >= (1ull << 30)) std::snprintf(buf, sizeof buf, "%.2f GiB", static_cast<double>(b) / (1ull << 30));
  else if (b >= (1ull << 20)) std::snprintf(buf, sizeof buf, "%.2f MiB", static_cast<double>(b) / (1ull << 20));
  else std::snprintf(buf, sizeof buf, "%.2f KiB", static_cast<double>(b) / (1ull << 10));
  return buf;
}

std::string human_params(uint64_t n) {
  char buf[32];
  if (n >= 1000000000ull) std::snprintf(buf, sizeof buf, "%.2f B", static_cast<double>(n) / 1e9);
  else if (n >= 1000000ull) std::snprintf(buf, sizeof buf, "%.2f M", static_cast<double>(n) / 1e6);
  else std::snprintf(buf, sizeof buf, "%.2f K", static_cast<double>(n) / 1e3);
  return buf;
}

// The process's peak resident memory (VmHWM of /proc/self/status), in bytes; 0 where there is none.
uint64_t peak_rss() {
  std::FILE* f = std::fopen("/proc/self/status", "r");
  if (f == nullptr) return 0;
  char line[256];
  unsigned long long kib = 0;
  while (std::fgets(line, sizeof line, f) != nullptr) {
    if (std::sscanf(line, "VmHWM: %llu kB", &kib) == 1) break;
  }
  std::fclose(f);
  return static_cast<uint64_t>(kib) << 10;
}

// -fa's values: on / 1 / auto (attention as one fused op where the cache allows it), off / 0.
std::optional<bool> flash_attn_named(const std::string& v) {
  if (v == "on" || v == "1" || v == "auto") return true;
  if (v == "off" || v == "0") return false;
  return std::nullopt;
}

int run_bench(const bench_options& o) {
  const auto negative = [](const std::vector<int>& v) { return std::any_of(v.begin(), v.end(), [](int x) { return x < 0; }); };
  if (negative(o.n_prompt) || negative(o.n_gen) || negative(o.n_depth) || o.reps < 1 || o.n_batch < 1 || o.n_parallel < 1 ||
      o.n_parallel > 64) {
    std::fprintf(stderr, "troupe bench: -p, -n, -d must be >= 0, -r and -b >= 1, -np in 1..64\n");
    return 1;
  }
  for (const std::string& t : o.type_k) {
    if (!llm::kv_cache_type_named(t)) {
      std::fprintf(stderr, "troupe bench: -ctk %s: the KV cache types are %s\n", t.c_str(), llm::kv_cache_type_names());
      return 1;
    }
  }
  for (const std::string& t : o.type_v) {
    if (!llm::kv_cache_type_named(t)) {
      std::fprintf(stderr, "troupe bench: -ctv %s: the KV cache types are %s\n", t.c_str(), llm::kv_cache_type_names());
      return 1;
    }
  }
  for (const std::string& f : o.flash_attn) {
    if (!flash_attn_named(f)) {
      std::fprintf(stderr, "troupe bench: -fa %s: on, off, auto, 1 or 0\n", f.c_str());
      return 1;
    }
  }
  llm::model_params mp;
  mp.huge_pages = o.huge_pages == "on";
  std::vector<std::shared_ptr<rpc::client>> peers;
  if (!o.rpc.empty()) {
    const std::string key = o.rpc_key_file.empty() ? std::string() : rpc::load_key_file(o.rpc_key_file);
    std::vector<device_i*> devs;
    for (const std::string& ep : o.rpc) {
      device_i* d = rpc::add_peer(ep, key).at(0);
      devs.push_back(d);
      peers.push_back(rpc::client_of(*d));
    }
    // Layers split evenly (the output layer goes with the last device), unless --device places them.
    const int n_layer = static_cast<int>(llm::model::open(o.model)->hp().n_layer);
    for (size_t i = 0; i < devs.size() && o.offload.devices.empty(); ++i) {
      const int begin = n_layer * static_cast<int>(i) / static_cast<int>(devs.size());
      const int end = n_layer * static_cast<int>(i + 1) / static_cast<int>(devs.size());
      mp.devices.emplace_back(devs[i], end - begin + (i + 1 == devs.size() ? 1 : 0));
    }
  }
  std::string backend = peers.empty() ? "CPU" : "RPC";
  if (o.offload.given()) {
    if (!peers.empty() && o.offload.devices.empty()) {
      std::fprintf(stderr, "troupe bench: --rpc places every layer; with -ngl, name the peers' devices in --device\n");
      return 1;
    }
    backend.clear();
    add_cpu_instances(o.offload, o.n_threads);
    mp.devices = llm::offload_devices(o.offload, o.model);
    for (const auto& [dev, layers] : mp.devices) backend += (backend.empty() ? "" : ",") + std::string(dev->name());
    if (backend.empty()) backend = "CPU";
  }
  mp.overrides = llm::cpu_moe_overrides(o.offload);
  auto m = llm::model::load(o.model, mp);
  const auto most = [](const std::vector<int>& v) { return v.empty() ? 0 : *std::max_element(v.begin(), v.end()); };
  const int max_prompt = most(o.n_prompt), max_gen = most(o.n_gen), max_depth = most(o.n_depth);
  const uint32_t n_ctx = static_cast<uint32_t>(max_depth + std::max(max_prompt, max_gen * o.n_parallel) + 32);
  const uint32_t n_batch = static_cast<uint32_t>(std::max({max_prompt, o.n_parallel, max_depth > 0 ? o.n_batch : 1}));
  const int threads = o.n_threads > 0 ? o.n_threads : cpu::hardware_threads();
  const std::vector<std::string> types_v = o.type_v.empty() ? std::vector<std::string>{""} : o.type_v;

  std::vector<result> results;
  uint64_t requests_before = 0;  // peers' requests counted before their stats were reset
  bool pipelined = false;
  if (!o.trace.empty()) trace::enable(true);
  // One KV cache (a context) per cache type pair and -fa setting; in it, every depth, then every test at it.
  for (const std::string& tk : o.type_k) {
    for (const std::string& tv_given : types_v) {
      const std::string tv = tv_given.empty() ? tk : tv_given;
      for (const std::string& fa_name : o.flash_attn) {
        const bool fa = *flash_attn_named(fa_name);
        llm::llm_context ctx(*m, llm::context_params{.n_ctx = n_ctx, .n_batch = n_batch, .n_ubatch = static_cast<uint32_t>(o.n_batch),
                                                     .n_seq_max = static_cast<uint32_t>(o.n_parallel),
                                                     .type_k = *llm::kv_cache_type_named(tk), .type_v = *llm::kv_cache_type_named(tv),
                                                     .flash_attn = fa, .n_threads = o.n_threads,
                                                     .n_pipeline = o.pipeline == "on" ? 4u : 1u});
        pipelined = pipelined || ctx.pipelines();
        for (const int depth : o.n_depth) {
          fill_depth(ctx, depth, o.n_parallel, m->hp().n_vocab, n_batch);
          const std::string at = depth > 0 ? " @ d" + std::to_string(depth) : "";
          for (const int n_prompt : o.n_prompt) {
            if (n_prompt == 0) continue;
            result r{"pp" + std::to_string(n_prompt) + at, n_prompt, {}};
            r.n_depth = depth, r.type_k = tk, r.type_v = tv, r.flash_attn = fa;
            const auto toks = random_tokens(n_prompt, m->hp().n_vocab, 1);
            run_pp(ctx, toks, depth);  // warm-up
            for (int i = 0; i < o.reps; ++i) r.tps.push_back(n_prompt / run_pp(ctx, toks, depth));
            results.push_back(r);
          }
          for (const int n_gen : o.n_gen) {
            if (n_gen == 0) continue;
            result r{"tg" + std::to_string(n_gen) + at, n_gen, {}};
            r.n_depth = depth, r.type_k = tk, r.type_v = tv, r.flash_attn = fa;
            const auto toks = random_tokens(n_gen, m->hp().n_vocab, 2);
            const bool ring = o.pipeline == "on";
            run_tg(ctx, toks, o.n_parallel, ring, depth);
            for (auto& p : peers) {
              requests_before += p->stats().requests;
              p->reset_stats();
            }
            for (int i = 0; i < o.reps; ++i) r.tps.push_back(n_gen * o.n_parallel / run_tg(ctx, toks, o.n_parallel, ring, depth));
            for (auto& p : peers) {
              r.round_trips += static_cast<double>(p->stats().round_trips);
              r.graphs_sent += static_cast<double>(p->stats().graphs_sent);
            }
            r.round_trips /= static_cast<double>(n_gen) * o.reps;
            r.graphs_sent /= static_cast<double>(n_gen) * o.reps;
            results.push_back(r);
          }
        }
      }
    }
  }
  const uint64_t rss = peak_rss();

  if (!o.trace.empty()) {
    trace::enable(false);
    trace::write(o.trace);
  }
  // The CPU's matrix-product kernels per test, for the weight types of the model's matrices (what runs on the
  // CPU backend; the prompt's micro-batches are of min(n_prompt, -b) rows, a decode step of -np rows).
  std::vector<type> matrix_types;
  for (const gguf_tensor_info& t : m->loader().tensors()) {
    if (t.n_dims >= 2 && std::find(matrix_types.begin(), matrix_types.end(), t.type) == matrix_types.end()) {
      matrix_types.push_back(t.type);
    }
  }
  std::sort(matrix_types.begin(), matrix_types.end(),
            [](type a, type b) { return std::string_view(type_name(a)) < std::string_view(type_name(b)); });
  const auto cpu_kernels = [&](const result& r) {
    const int64_t rows = r.test[0] == 'p' ? std::min(r.n_tokens, o.n_batch) : o.n_parallel;
    std::string out(cpu::isa_name(cpu::active_isa()));
    for (size_t i = 0; i < matrix_types.size(); ++i) {
      out += (i == 0 ? ": " : ", ") + std::string(type_name(matrix_types[i])) + " " +
             cpu::mul_mat_kernel_family(matrix_types[i], rows);
    }
    return out;
  };
  const std::string model_desc = m->hp().name + " " + human_params(m->n_params());
  const uint64_t model_bytes = m->n_bytes(), model_params = m->n_params();
  // The model goes before the peers' frames are counted (the contexts went already): their buffers' frees are
  // frames too (every frame the peers were sent, as the server logs one line each with TROUPE_RPC_DEBUG).
  m.reset();
  uint64_t requests = requests_before;
  for (auto& p : peers) requests += p->stats().requests;
  if (o.output == "json") {
    std::printf("[\n");
    for (size_t i = 0; i < results.size(); ++i) {
      const result& r = results[i];
      std::printf("  {\"model\": \"%s\", \"model_type\": \"%s\", \"model_size\": %llu, \"model_n_params\": %llu, "
                  "\"backend\": \"%s\", \"n_threads\": %d, \"n_batch\": %d, \"test\": \"%s\", \"n_prompt\": %d, "
                  "\"n_gen\": %d, \"n_depth\": %d, \"type_k\": \"%s\", \"type_v\": \"%s\", \"flash_attn\": %s, \"n_ubatch\": %d, "
                  "\"devices\": \"%s\", \"n_parallel\": %d, \"pipeline\": %s, \"max_rss_bytes\": %llu, \"avg_ts\": %.3f, "
                  "\"stddev_ts\": %.3f, \"cpu_kernels\": \"%s\", \"samples_ts\": [",
                  o.model.c_str(), model_desc.c_str(), static_cast<unsigned long long>(model_bytes),
                  static_cast<unsigned long long>(model_params), backend.c_str(), threads, o.n_batch, r.test.c_str(),
                  r.test[0] == 'p' ? r.n_tokens : 0, r.test[0] == 't' ? r.n_tokens : 0, r.n_depth, r.type_k.c_str(),
                  r.type_v.c_str(), r.flash_attn ? "true" : "false", o.n_batch, backend.c_str(), o.n_parallel,
                  pipelined ? "true" : "false", static_cast<unsigned long long>(rss), r.mean(), r.stddev(),
                  cpu_kernels(r).c_str());
      for (size_t k = 0; k < r.tps.size(); ++k) std::printf("%s%.3f", k ? ", " : "", r.tps[k]);
      std::printf("]");
      if (!peers.empty() && r.test[0] == 't') {
        std::printf(", \"round_trips_per_token\": %.3f, \"graphs_sent_per_token\": %.3f", r.round_trips, r.graphs_sent);
      }
      if (!peers.empty()) std::printf(", \"rpc_requests\": %llu", static_cast<unsigned long long>(requests));
      std::printf("}%s\n", i + 1 < results.size() ? "," : "");
    }
    std::printf("]\n");
    return 0;
  }
  // The cache's types and -fa get columns when they were asked for (as llama-bench shows what differs).
  const bool kv_columns = o.type_k != std::vector<std::string>{"f16"} || !o.type_v.empty() || o.flash_attn != std::vector<std::string>{"auto"};
  std::printf("| %-24s | %10s | %10s | %-7s | %7s |", "model", "size", "params", "backend", "threads");
  if (kv_columns) std::printf(" %6s | %6s | %3s |", "type_k", "type_v", "fa");
  std::printf(" %15s | %20s |\n", "test", "t/s");
  std::printf("| %s | %s | %s | %s | %s |", std::string(24, '-').c_str(), std::string(10, '-').c_str(),
              std::string(10, '-').c_str(), std::string(7, '-').c_str(), std::string(7, '-').c_str());
  if (kv_columns) std::printf(" %s | %s | %s |", std::string(6, '-').c_str(), std::string(6, '-').c_str(), std::string(3, '-').c_str());
  std::printf(" %s | %s |\n", std::string(15, '-').c_str(), std::string(20, '-').c_str());
  for (const result& r : results) {
    char tps[48];
    std::snprintf(tps, sizeof tps, "%.2f ± %.2f", r.mean(), r.stddev());
    std::printf("| %-24s | %10s | %10s | %-7s | %7d |", model_desc.c_str(), human_size(model_bytes).c_str(),
                human_params(model_params).c_str(), backend.c_str(), threads);
    if (kv_columns) std::printf(" %6s | %6s | %3d |", r.type_k.c_str(), r.type_v.c_str(), r.flash_attn ? 1 : 0);
    std::printf(" %15s | %21s |\n", r.test.c_str(), tps);
  }
  if (rss > 0) std::printf("\npeak resident memory: %s\n", human_size(rss).c_str());
  for (const result& r : results) {
    if (peers.empty() || r.test[0] != 't') continue;
    std::printf("\n%s on %zu peer(s): %.2f round trips and %.3f graphs sent per generated token\n", r.test.c_str(),
                peers.size(), r.round_trips, r.graphs_sent);
  }
  if (!peers.empty()) std::printf("%llu requests sent to the peers in all\n", static_cast<unsigned long long>(requests));
  return 0;
}

}  // namespace

command_fn add_bench(CLI::App& app) {
  auto o = std::make_shared<bench_options>();
  // `troupe bench ops`: kernel throughput without a model (bench_ops.cpp); -m is required otherwise.
  CLI::App* ops = app.add_subcommand("ops", "CPU kernel throughput: memcpy, matrix-vector, matrix-matrix, dispatch");
  const command_fn run_ops = add_bench_ops(*ops);
  // `troupe bench http`: a load test against a running daemon (bench_http.cpp).
  CLI::App* http = app.add_subcommand("http", "load test of a running daemon: latency percentiles, tokens/s");
  const command_fn run_http = add_bench_http(*http);
  app.add_option("-m,--model", o->model, "GGUF model file");
  app.add_option("-p,--n-prompt", o->n_prompt, "prompt tokens (0: skip the pp test); a comma list runs each")->delimiter(',');
  app.add_option("-n,--n-gen", o->n_gen, "generated tokens (0: skip the tg test); a comma list runs each")->delimiter(',');
  app.add_option("-d,--n-depth", o->n_depth, "tokens already in the KV cache before each test (llama-bench's -d); a comma list runs each")
      ->delimiter(',');
  app.add_option("--cache-type-k", o->type_k, "(-ctk) KV cache type of K: f16, f32, bf16, q8_0, q4_0, ...; a comma list runs each")
      ->delimiter(',');
  app.add_option("--cache-type-v", o->type_v, "(-ctv) KV cache type of V (default K's); a comma list runs each")->delimiter(',');
  app.add_option("--flash-attn", o->flash_attn, "(-fa) attention as one fused op: on, off, auto (1, 0); a comma list runs each")
      ->delimiter(',');
  app.add_option("-t,--threads", o->n_threads, "CPU threads (0: all)");
  app.add_option("-r,--repetitions", o->reps, "repetitions of each test");
  app.add_option("-b,--ubatch-size", o->n_batch, "(-ub) tokens per graph");
  app.add_option("--pipeline", o->pipeline,
                 "on: a prompt's micro-batches in flight over the devices at once (several devices only); off: one at a time")
      ->check(CLI::IsMember({"on", "off"}));
  app.add_option("--huge-pages", o->huge_pages,
                 "on: host weights copied out of the file mapping into 2 MiB pages where the kernel offers them (faster generation); off: used in place")
      ->check(CLI::IsMember({"on", "off"}));
  app.add_option("--n-parallel", o->n_parallel, "(-np) sequences generating at once in the tg test (tg counts all their tokens)");
  add_trace_option(app, o->trace);
  app.add_option("-o,--output", o->output, "table or json")->check(CLI::IsMember({"table", "json"}));
  app.add_option("--rpc", o->rpc, "remote peers (troupe peer) holding every layer, split evenly: HOST:PORT,...")
      ->delimiter(',');
  app.add_option("--rpc-key-file", o->rpc_key_file, "the peers' shared key (troupe peer --auth-key-file)");
  add_offload_options(app, o->offload);
  return [o, ops, run_ops, http, run_http] {
    if (ops->parsed()) return run_ops();
    if (http->parsed()) return run_http();
    if (o->model.empty()) {
      std::fprintf(stderr, "troupe bench: -m MODEL is required (or use `troupe bench ops` / `troupe bench http`)\n");
      return 1;
    }
    return run_bench(*o);
  };
}

}  // namespace troupe::cli
