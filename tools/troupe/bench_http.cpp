// troupe bench http: a bounded load test against a running daemon (net/http/loadgen.h).
//
//   troupe serve --config configs/daemon.toml &
//   troupe bench http --port 8080 --model smollm2 --clients 16 --requests 200
//   troupe bench http --port 8080 --model smollm2 --workload turns --conversations 8 --turns 4 --clients 4
//   troupe bench http --port 8080 --model smollm2 --workload shared-prefix --clients 8 --system-words 1500
//   troupe bench http --port 8080 --model smollm2 --workload long+short --conversations 6 --clients 7
//
// Exits 1 when any request failed (the failures are listed).
#include <cstdio>

#include "net/http/loadgen.h"
#include "tools/troupe/commands.h"

namespace troupe::cli {

command_fn add_bench_http(CLI::App& app) {
  auto p = std::make_shared<http::load_params>();
  app.add_option("--host", p->host, "daemon address (default 127.0.0.1)");
  app.add_option("--port", p->port, "daemon port (default 8080)");
  app.add_option("--model", p->model, "model name (the requests' \"model\")")->required();
  app.add_option("--api-key", p->api_key, "bearer key");
  app.add_option("-c,--clients", p->clients, "concurrent clients (default 16)")->check(CLI::Range(1, 1024));
  app.add_option("-n,--requests", p->requests, "requests in all (default 200)")->check(CLI::Range(1, 1000000));
  app.add_option("--max-tokens", p->max_tokens, "max_tokens of each request (default 32)")->check(CLI::Range(1, 1 << 20));
  app.add_option("--prompt", p->prompt, "the user message (or prompt)");
  CLI::Option* temperature =
      app.add_option("--temperature", p->temperature, "sampling temperature (request i uses seed i; turns and shared-prefix: 0 unless given)");
  app.add_flag("--stream", p->stream, "stream the answers (server-sent events)");
  app.add_flag("!--chat,--completions", p->chat, "use /v1/completions instead of /v1/chat/completions");
  app.add_option("--workload", p->workload,
                 "load (one short prompt, --requests of it), turns (--conversations chats of --turns turns, each "
                 "with its own system text), shared-prefix (--clients chats behind one system text), long+short (one chat "
                 "of --long-words words among --conversations short ones, all at once)")
      ->check(CLI::IsMember({"load", "turns", "shared-prefix", "long+short"}));
  app.add_option("--conversations", p->conversations, "turns: conversations; long+short: short chats (default 8)")->check(CLI::Range(1, 4096));
  app.add_option("--long-words", p->long_words, "long+short: words of the long chat's message (default 4900, about 6,000 tokens)")
      ->check(CLI::Range(1, 1 << 20));
  app.add_option("--turns", p->turns, "turns: turns per conversation (default 4)")->check(CLI::Range(1, 1024));
  app.add_option("--system-words", p->system_words, "turns, shared-prefix: words of a system text (default 900)")
      ->check(CLI::Range(0, 1 << 20));
  return [p, temperature] {
    // Greedy unless asked otherwise: the same answers, so the same prompts, on every server measured.
    if (p->workload != "load" && temperature->count() == 0) p->temperature = 0.0f;
    const http::load_result r = http::run_load(*p);
    std::printf("%s", http::format_load_result(*p, r).c_str());
    const int expected = p->workload == "turns" ? p->conversations * p->turns
                         : p->workload == "shared-prefix" ? p->clients
                         : p->workload == "long+short"    ? p->conversations + 1
                                                          : p->requests;
    return r.failed == 0 && r.ok == expected ? 0 : 1;
  };
}

}  // namespace troupe::cli
