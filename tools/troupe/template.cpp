// troupe template: a chat template rendered over a conversation, as the reference renderer does
// (../shared/chat-templates/render.py), for checking a template or a model's file by hand.
//
//   troupe template ../shared/chat-templates/Qwen-Qwen3-0.6B.jinja --case case.json
//   troupe template models/SmolLM2-135M-Instruct.Q4_1.gguf --case a.json --case b.json
//   troupe template ../shared/chat-templates/*.jinja --case a.json --case b.json      (all in one process)
//
// A case is render.py's: {"messages": [...], "tools": [...]?, "add_generation_prompt": bool (default true),
// "bos_token": str, "eos_token": str, "extra": {...}?} ("extra": further template variables such as
// enable_thinking). A GGUF file gives its tokenizer.chat_template (or the named variant, --name tool_use) and,
// where the case names none, its BOS and EOS tokens' text. One template and one case: the prompt exactly on
// stdout; more: each after a line "==> TEMPLATE CASE <==". Exit status 2 and "error: ..." on stderr where a
// template refuses.
#include <algorithm>
#include <cstdio>
#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>

#include "llm/jinja/jinja.h"
#include "llm/vocab.h"
#include "loader/model_loader.h"
#include "tools/troupe/commands.h"

namespace troupe::cli {

namespace {

struct template_options {
  std::vector<std::string> sources;
  std::vector<std::string> cases;
  std::string name;  // a GGUF's named template (tokenizer.chat_template.NAME)
};

std::string read_file(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) throw error("cannot read " + path);
  std::stringstream s;
  s << f.rdbuf();
  return s.str();
}

int render_one(const template_options& o, const std::string& source, bool headers) {
  std::string text;
  std::string bos = "<s>", eos = "</s>";
  const bool gguf = source.size() > 5 && source.compare(source.size() - 5, 5, ".gguf") == 0;
  if (gguf) {
    model_loader loader(source);
    const gguf_file& meta = loader.meta();
    const std::string key = o.name.empty() ? "tokenizer.chat_template" : "tokenizer.chat_template." + o.name;
    const auto t = meta.get<std::string>(key);
    if (!t) throw error(source + " has no " + key);
    text = *t;
    const llm::vocab v(meta);
    if (v.bos() >= 0) bos = v.token_to_piece(v.bos(), true);
    if (v.eos() >= 0) eos = v.token_to_piece(v.eos(), true);
  } else {
    text = read_file(source);
  }
  llm::jinja::template_ tmpl;
  try {
    tmpl = llm::jinja::template_::parse(text);
  } catch (const llm::jinja::error& e) {
    std::fprintf(stderr, "error: %s%s%s\n", headers ? source.c_str() : "", headers ? ": " : "", e.what());
    return 2;
  }
  int rc = 0;
  for (const std::string& path : o.cases) {
    nlohmann::ordered_json kase;
    try {
      kase = nlohmann::ordered_json::parse(read_file(path));
    } catch (const nlohmann::json::exception& e) {
      throw error(path + ": not JSON: " + e.what());
    }
    if (!kase.is_object() || !kase.contains("messages")) throw error(path + ": a case needs \"messages\"");
    nlohmann::ordered_json ctx = {{"messages", kase["messages"]},
                                  {"add_generation_prompt", kase.value("add_generation_prompt", true)},
                                  {"bos_token", kase.value("bos_token", bos)},
                                  {"eos_token", kase.value("eos_token", eos)}};
    if (kase.contains("tools") && !kase["tools"].is_null()) ctx["tools"] = kase["tools"];
    if (kase.contains("extra") && kase["extra"].is_object()) {
      for (auto it = kase["extra"].begin(); it != kase["extra"].end(); ++it) ctx[it.key()] = it.value();
    }
    if (headers) std::printf("==> %s %s <==\n", source.c_str(), path.c_str());
    try {
      const std::string out = tmpl.render(ctx);
      std::fwrite(out.data(), 1, out.size(), stdout);
      if (headers) std::printf("\n");
    } catch (const llm::jinja::error& e) {
      std::fprintf(stderr, "error: %s%s%s%s%s\n", headers ? source.c_str() : "", headers ? " " : "", headers ? path.c_str() : "",
                   headers ? ": " : "", e.what());
      rc = 2;
    }
  }
  return rc;
}

int run_template(const template_options& o) {
  const bool headers = o.sources.size() > 1 || o.cases.size() > 1;
  int rc = 0;
  for (const std::string& source : o.sources) rc = std::max(rc, render_one(o, source, headers));
  std::fflush(stdout);
  return rc;
}

}  // namespace

command_fn add_template(CLI::App& app) {
  auto o = std::make_shared<template_options>();
  app.add_option("sources", o->sources, "chat templates (.jinja) or GGUF models whose template to render")->required();
  app.add_option("--case", o->cases, "a conversation as render.py's cases are (JSON); repeatable")->required();
  app.add_option("--name", o->name, "a GGUF's named template (tokenizer.chat_template.NAME, e.g. tool_use)");
  return [o] { return run_template(*o); };
}

}  // namespace troupe::cli
