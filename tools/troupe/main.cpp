// troupe: the command-line front end.
//
//   troupe inspect MODEL.gguf      metadata, tensors, placement and memory plan
//   troupe bench -m MODEL          prompt and generation throughput
//   troupe quantize IN OUT TYPE    quantize a model's weight matrices
//   troupe peer --port 50052       serve this machine's devices to other troupe processes
//   troupe node --join HOST:PORT   the same, as a node of a cluster (troupe serve with [cluster])
//   troupe serve --config F.toml   the daemon: OpenAI-compatible HTTP API over the actor runtime
//   troupe template T.jinja --case C.json   a chat template rendered over a conversation
//   troupe perplexity -m M -f T    perplexity over a text file
//   troupe devices                 the devices this build can use (also --list-devices on every program)
//
// Every subcommand prints a clear message and exits 1 on bad input; nothing aborts.
#include <cstdio>
#include <exception>
#include <map>

#include "backends/registry.h"
#include "backends/rpc/wire/protocol.h"
#include "runtime/log.h"
#include "tools/common/offload_options.h"
#include "tools/troupe/commands.h"

int main(int argc, char** argv) {
  CLI::App app{"troupe: an actor-model runtime for LLM inference"};
  app.require_subcommand(1);
  std::map<CLI::App*, troupe::cli::command_fn> commands;
  auto add = [&](const char* name, const char* help, troupe::cli::command_fn (*make)(CLI::App&)) {
    CLI::App* sub = app.add_subcommand(name, help);
    commands[sub] = make(*sub);
  };
  add("inspect", "show a GGUF model's metadata, tensors, placement and memory plan", troupe::cli::add_inspect);
  add("bench", "prompt-processing and generation throughput (llama-bench style)", troupe::cli::add_bench);
  add("quantize", "rewrite a model with its weight matrices in another type", troupe::cli::add_quantize);
  add("perplexity", "perplexity of a model over a text file", troupe::cli::add_perplexity);
  CLI::App* tmpl = app.add_subcommand("template", "render a chat template (a .jinja file or a model's) over a conversation");
  commands[tmpl] = troupe::cli::add_template(*tmpl);
  add("serve", "the daemon: an OpenAI-compatible HTTP API (configured by a TOML file)", troupe::cli::add_serve);
  add("peer", "serve this machine's devices to other troupe processes (remote peers)", troupe::cli::add_peer);
  add("node", "serve this machine's devices and join a cluster's coordinator", troupe::cli::add_node);
  CLI::App* devices = app.add_subcommand("devices", "the devices this build can use, and backends without one");
  commands[devices] = [] {
    std::printf("%s", troupe::format_devices().c_str());
    return 0;
  };
  try {
    std::vector<std::string> args = troupe::cli::llama_spellings(argc, argv);
    app.parse(args);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  // The RPC debug switch asks for lines at debug level: the logger lets them through.
  if (troupe::rpc::debug_from_env() && troupe::get_log_level() > troupe::log_level::debug) {
    troupe::set_log_level(troupe::log_level::debug);
  }
  try {
    // Every command but `template` (no devices: it starts in milliseconds) may use the devices.
    if (!tmpl->parsed()) troupe::register_builtin_backends();
    for (auto& [sub, run] : commands) {
      if (sub->parsed()) return run();
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "troupe: %s\n", e.what());
    return 1;
  }
  return 1;
}
