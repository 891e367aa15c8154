// troupe-chat: chat with a GGUF model in the terminal, through troupe's actor runtime (actors/engine.h).
//
//   troupe-chat -m models/SmolLM2-135M-Instruct.Q4_1.gguf [-c CTX] [-n N] [--temp T] [--seed S]
//               [-sys PROMPT] [-t THREADS] [-ngl N] [--device A,B,...] [--list-devices]
//   troupe-chat -m MODEL -p "Once upon a time" --no-chat     completion, for scripts
//
// Type a message and press Enter; the answer streams as it is generated. /reset starts a new chat, /quit
// (or Ctrl-D) ends it, Ctrl-C stops the current answer. At exit: prompt and generation throughput and the
// memory breakdown. Line editing and history come from readline when the input is a terminal.
//
// The program is a client of the embedding API: an engine (its own actor system), the model loaded by
// the loader actor, one session actor holding the conversation (it reuses the cached prefix of earlier
// turns), the memory breakdown from the memory-accounting actor.
#include <CLI/CLI.hpp>
#include <readline/history.h>
#include <readline/readline.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <csignal>
#include <cstdio>
#include <ctime>
#include <iostream>
#include <optional>
#include <string>
#include <vector>

#include "actors/engine.h"
#include "tools/common/offload_options.h"
#include "tools/common/trace_option.h"

using namespace troupe;

namespace {

std::atomic<bool> interrupted{false};
std::atomic<bool> generating{false};

void on_sigint(int) {
  if (generating.load()) {
    interrupted.store(true);
  } else {
    // At the prompt: leave the way Ctrl-D does (the main loop sees the closed input).
    std::signal(SIGINT, SIG_DFL);
    std::raise(SIGINT);
  }
}

std::optional<std::string> read_line(bool tty) {
  if (tty) {
    char* line = readline("> ");
    if (line == nullptr) return std::nullopt;
    std::string s(line);
    std::free(line);
    if (!s.empty()) add_history(s.c_str());
    return s;
  }
  std::string s;
  if (!std::getline(std::cin, s)) return std::nullopt;
  return s;
}

struct totals {
  int64_t prompt_tokens = 0, gen_tokens = 0;
  double prompt_s = 0, gen_s = 0;
  void add(const actors::generate_reply& r) {
    prompt_tokens += r.n_prompt_decoded;
    gen_tokens += static_cast<int64_t>(r.tokens.size());
    prompt_s += r.prompt_seconds;
    gen_s += r.gen_seconds;
  }
};

void print_summary(const totals& t, engine& eng) {
  std::fprintf(stderr, "\nprompt: %lld tokens, %.2f t/s | generation: %lld tokens, %.2f t/s\n",
               static_cast<long long>(t.prompt_tokens), t.prompt_s > 0 ? t.prompt_tokens / t.prompt_s : 0.0,
               static_cast<long long>(t.gen_tokens), t.gen_s > 0 ? t.gen_tokens / t.gen_s : 0.0);
  std::fprintf(stderr, "%s", eng.memory().table.c_str());
}

int run(int argc, char** argv) {
  std::string model_path = "models/SmolLM2-135M-Instruct.Q4_1.gguf";
  uint32_t n_ctx = 2048;
  int n_predict = 512;
  float temp = 0.7f;
  uint32_t seed = 0;
  std::string system_prompt;
  int n_threads = 0;
  std::string prompt;
  bool no_chat = false;
  llm::offload_request offload;

  CLI::App app{"troupe-chat: chat with a GGUF model"};
  app.add_option("-m,--model", model_path, "GGUF model file");
  app.add_option("-c,--ctx-size", n_ctx, "context size in tokens");
  app.add_option("-n,--n-predict", n_predict, "most tokens per answer");
  app.add_option("--temp", temp, "sampling temperature (0: greedy)");
  app.add_option("--seed", seed, "random seed (0: from the clock)");
  app.add_option("--sys,--system-prompt", system_prompt, "system prompt (also -sys)");
  app.add_option("-t,--threads", n_threads, "CPU threads (0: all)");
  app.add_option("-p,--prompt", prompt, "prompt (with --no-chat: complete it and exit)");
  app.add_flag("--no-chat", no_chat, "complete the prompt instead of chatting");
  std::string chat_template, chat_template_file;
  app.add_option("--chat-template", chat_template, "a built-in template family instead of the model's own (chatml, llama3, gemma, raw, ...)");
  app.add_option("--chat-template-file", chat_template_file, "a Jinja chat template file instead of the model's own");
  cli::add_offload_options(app, offload);
  std::string trace_path;
  cli::add_trace_option(app, trace_path);
  std::vector<std::string> args = cli::llama_spellings(argc, argv);  // -sys, -ngl
  try {
    app.parse(args);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  if (no_chat && prompt.empty()) {
    std::fprintf(stderr, "troupe-chat: --no-chat needs a prompt (-p)\n");
    return 1;
  }
  if (seed == 0) seed = static_cast<uint32_t>(std::time(nullptr));
  const cli::trace_guard tracing(trace_path);

  // The device actors' backends are idle here (decoding runs on the model's scheduler): one thread each.
  // --device CPU1,...: the engine makes those CPU instances.
  engine eng({.cpu_instances = cli::max_cpu_instance(offload), .n_threads = 1});
  actors::model_settings ms{.n_ctx = n_ctx, .n_seq_max = 1, .n_threads = n_threads};
  ms.chat_template = chat_template;
  ms.chat_template_file = chat_template_file;
  for (const auto& [name, layers] : llm::offload_layers(offload, model_path)) ms.devices.push_back({name, layers});
  for (const std::string& p : llm::cpu_moe_patterns(offload.cpu_moe, offload.n_cpu_moe)) ms.overrides.push_back({p, "CPU"});
  const actors::model_info info = eng.load_model("chat", model_path, ms);
  session s = eng.open_session("chat");
  actors::generation_params gp;
  gp.max_tokens = n_predict;
  gp.temperature = temp;
  gp.seed = seed;
  totals t;

  std::signal(SIGINT, on_sigint);
  auto stream = [](std::string_view piece) {
    std::fwrite(piece.data(), 1, piece.size(), stdout);
    std::fflush(stdout);
    return !interrupted.load();
  };

  if (no_chat) {
    std::fwrite(prompt.data(), 1, prompt.size(), stdout);
    generating = true;
    const auto r = s.generate(prompt, gp, stream);
    generating = false;
    std::printf("\n");
    t.add(r);
    print_summary(t, eng);
    return 0;
  }

  std::fprintf(stderr, "troupe-chat: %s (%s, %u layers), chat template %s. /reset starts over, /quit ends.\n",
               model_path.c_str(), info.arch.c_str(), info.n_layer, info.chat_template.c_str());
  std::vector<actors::chat_message> history;
  if (!system_prompt.empty()) history.push_back({"system", system_prompt});
  const bool tty = isatty(STDIN_FILENO) != 0;
  std::optional<std::string> pending;
  if (!prompt.empty()) pending = prompt;
  for (;;) {
    std::optional<std::string> line = pending ? pending : read_line(tty);
    pending.reset();
    if (!line || *line == "/quit") break;
    if (*line == "/reset") {
      history.resize(system_prompt.empty() ? 0 : 1);
      s.reset();
      std::fprintf(stderr, "(new chat)\n");
      continue;
    }
    if (line->empty()) continue;
    history.push_back({"user", *line});
    interrupted = false;
    generating = true;
    actors::generate_reply r;
    try {
      r = s.chat(history, gp, stream);
    } catch (const actors::request_error& e) {
      generating = false;
      if (!e.is(actors::errc::capacity)) throw;
      std::fprintf(stderr, "\n(%s; /reset to start a new chat)\n", e.what());
      history.pop_back();
      continue;
    }
    generating = false;
    std::printf("%s\n", r.finish == "cancelled" ? " [stopped]" : "");
    history.push_back({"assistant", r.text});
    t.add(r);
  }
  print_summary(t, eng);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return run(argc, argv);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "troupe-chat: %s\n", e.what());
    return 1;
  }
}
