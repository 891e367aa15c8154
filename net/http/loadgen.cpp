#include "net/http/loadgen.h"

#include <httplib.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <mutex>
#include <thread>

namespace troupe::http {

namespace {

using clock_type = std::chrono::steady_clock;
using json = nlohmann::json;

double percentile(std::vector<double> v, double q) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const size_t i = std::min(v.size() - 1, static_cast<size_t>(q * static_cast<double>(v.size())));
  return v[i];
}

double mean(const std::vector<double>& v) {
  if (v.empty()) return 0;
  double s = 0;
  for (double x : v) s += x;
  return s / static_cast<double>(v.size());
}

// One streamed chat completion: its time to the first piece, its text, its usage.
struct chat_answer {
  bool ok = false;
  std::string error;
  double seconds = 0, ttft = -1;
  std::string content;
  json usage;
};

chat_answer stream_chat(httplib::Client& cli, const load_params& p, const json& messages, int seed) {
  chat_answer a;
  const json body = {{"model", p.model},        {"max_tokens", p.max_tokens}, {"temperature", p.temperature},
                     {"seed", seed},            {"messages", messages},       {"stream", true},
                     {"stream_options", {{"include_usage", true}}}};
  std::string text;
  httplib::Request req;
  req.method = "POST";
  req.path = "/v1/chat/completions";
  req.body = body.dump();
  req.set_header("Content-Type", "application/json");
  const auto start = clock_type::now();
  req.content_receiver = [&](const char* data, size_t n, uint64_t, uint64_t) {
    if (a.ttft < 0) a.ttft = std::chrono::duration<double>(clock_type::now() - start).count();
    text.append(data, n);
    return true;
  };
  httplib::Result res = cli.send(req);
  a.seconds = std::chrono::duration<double>(clock_type::now() - start).count();
  if (!res) {
    a.error = "no response (" + httplib::to_string(res.error()) + ")";
    return a;
  }
  if (res->status != 200) {
    a.error = "HTTP " + std::to_string(res->status) + ": " + text.substr(0, 200);
    return a;
  }
  try {
    size_t pos = 0;
    while ((pos = text.find("data: ", pos)) != std::string::npos) {
      const size_t end = text.find('\n', pos);
      const std::string event = text.substr(pos + 6, end == std::string::npos ? std::string::npos : end - pos - 6);
      pos = end == std::string::npos ? text.size() : end;
      if (event.rfind("[DONE]", 0) == 0) continue;
      const json j = json::parse(event);
      if (j.contains("error")) throw std::runtime_error(j["error"].dump());
      if (j.contains("usage") && j["usage"].is_object()) a.usage = j["usage"];
      if (j.contains("choices") && !j["choices"].empty()) {
        const json& d = j["choices"][0].value("delta", json::object());
        if (d.contains("content") && d["content"].is_string()) a.content += d["content"].get<std::string>();
      }
    }
    if (!a.usage.is_object()) throw std::runtime_error("no usage chunk");
  } catch (const std::exception& e) {
    a.error = std::string("bad stream: ") + e.what();
    return a;
  }
  if (a.usage.value("completion_tokens", 0) == 0) {
    a.error = "no tokens generated";
    return a;
  }
  a.ok = true;
  return a;
}

uint64_t cached_of(const json& usage) {
  if (!usage.contains("prompt_tokens_details") || !usage["prompt_tokens_details"].is_object()) return 0;
  return usage["prompt_tokens_details"].value("cached_tokens", 0);
}

// About n words of text that differ with `seed` (a conversation's or the common system text).
std::string words(int n, uint32_t seed) {
  static const char* const vocab[] = {
      "the",    "river",  "stone",   "garden", "light",  "winter", "market", "engine", "window", "letter",
      "forest", "silver", "harbor",  "candle", "quiet",  "bright", "record", "travel", "number", "yellow",
      "spring", "valley", "castle",  "mirror", "paper",  "signal", "bridge", "orange", "planet", "shadow",
      "thread", "copper", "meadow",  "pocket", "ribbon", "saddle", "timber", "velvet", "wander", "zephyr",
      "amber",  "basket", "cobalt",  "desert", "ember",  "falcon", "glacier", "hollow", "island", "jungle"};
  constexpr uint32_t n_vocab = sizeof vocab / sizeof vocab[0];
  std::string out;
  uint32_t x = seed * 2654435761u + 12345u;
  for (int i = 0; i < n; ++i) {
    x = x * 1664525u + 1013904223u;
    if (i > 0) out += (i % 12 == 0) ? ". " : " ";
    out += vocab[(x >> 16) % n_vocab];
  }
  return out + ".";
}

// Runs work(i) for i in [0, n) on `clients` threads, a connection per request: a conversation's turns are
// seconds apart, longer than servers keep an idle connection (llama-server closes one after 5 s, and a
// request written to it then fails with a read error).
template <class F>
void on_clients(const load_params& p, int n, F work) {
  std::atomic<int> next{0};
  std::vector<std::thread> threads;
  for (int c = 0; c < std::min(p.clients, n); ++c) {
    threads.emplace_back([&] {
      for (int i = next.fetch_add(1); i < n; i = next.fetch_add(1)) {
        httplib::Client cli(p.host, p.port);
        cli.set_keep_alive(false);
        cli.set_read_timeout(p.timeout_s, 0);
        cli.set_write_timeout(p.timeout_s, 0);
        if (!p.api_key.empty()) cli.set_bearer_token_auth(p.api_key);
        work(cli, i);
      }
    });
  }
  for (std::thread& t : threads) t.join();
}

load_result run_conversations(const load_params& p) {
  load_result r;
  std::mutex m;
  std::vector<double> first, later, latency;
  const bool turns = p.workload == "turns";
  const int n_conv = turns ? p.conversations : p.clients;
  const int n_turns = turns ? p.turns : 1;
  const std::string common = "You are a helpful assistant. " + words(p.system_words, 7);
  std::vector<json> messages(static_cast<size_t>(n_conv));
  std::vector<uint64_t> prev_prompt(static_cast<size_t>(n_conv), 0), prev_completion(static_cast<size_t>(n_conv), 0);
  for (int c = 0; c < n_conv; ++c) {
    const std::string system =
        turns ? "You are assistant " + std::to_string(c) + ". " + words(p.system_words, static_cast<uint32_t>(100 + c)) : common;
    messages[static_cast<size_t>(c)] = json::array({{{"role", "system"}, {"content", system}}});
  }
  const auto t0 = clock_type::now();
  for (int t = 0; t < n_turns; ++t) {
    on_clients(p, n_conv, [&](httplib::Client& cli, int c) {
      const auto ci = static_cast<size_t>(c);
      json msgs;
      {
        std::lock_guard l(m);
        messages[ci].push_back({{"role", "user"},
                                {"content", "Question " + std::to_string(t + 1) + " of conversation " + std::to_string(c) +
                                                ": tell me about " + words(3, static_cast<uint32_t>(1000 * c + t)) }});
        msgs = messages[ci];
      }
      const chat_answer a = stream_chat(cli, p, msgs, c * 100 + t);
      std::lock_guard l(m);
      if (!a.ok) {
        ++r.failed;
        if (r.errors.size() < 8) r.errors.push_back("conversation " + std::to_string(c) + " turn " + std::to_string(t + 1) + ": " + a.error);
        messages[ci].push_back({{"role", "assistant"}, {"content", ""}});
        return;
      }
      ++r.ok;
      latency.push_back(a.seconds);
      (turns && t == 0 ? first : later).push_back(a.ttft);
      const uint64_t prompt = a.usage.value("prompt_tokens", 0), completion = a.usage.value("completion_tokens", 0);
      r.prompt_tokens += prompt;
      r.completion_tokens += completion;
      r.prompt_tokens_cached += cached_of(a.usage);
      if (turns) {
        const uint64_t before = prev_prompt[ci] + prev_completion[ci];
        r.prompt_tokens_new += prompt > before ? prompt - before : 0;
        prev_prompt[ci] = prompt;
        prev_completion[ci] = completion;
      }
      messages[ci].push_back({{"role", "assistant"}, {"content", a.content}});
    });
  }
  r.wall_seconds = std::chrono::duration<double>(clock_type::now() - t0).count();
  r.p50 = percentile(latency, 0.5);
  r.p90 = percentile(latency, 0.9);
  r.p99 = percentile(latency, 0.99);
  r.max = latency.empty() ? 0 : *std::max_element(latency.begin(), latency.end());
  r.ttft_first_mean = mean(first);
  r.ttft_later_mean = mean(later);
  r.ttft_later_p50 = percentile(later, 0.5);
  r.ttft_later_p95 = percentile(later, 0.95);
  r.ttft_p50 = percentile(later, 0.5);
  r.tokens_per_second = r.wall_seconds > 0 ? static_cast<double>(r.completion_tokens) / r.wall_seconds : 0;
  r.requests_per_second = r.wall_seconds > 0 ? r.ok / r.wall_seconds : 0;
  return r;
}

// One long chat (request 0) and p.conversations short ones, all at once.
load_result run_long_short(const load_params& p) {
  load_result r;
  std::mutex m;
  std::vector<double> shorts, latency;
  const int n = 1 + p.conversations;
  const auto t0 = clock_type::now();
  on_clients(p, n, [&](httplib::Client& cli, int i) {
    const std::string text = i == 0 ? "Summarize this text in one sentence. " + words(p.long_words, 4242)
                                    : "Question " + std::to_string(i) + ": tell me about " + words(3, static_cast<uint32_t>(i));
    const chat_answer a = stream_chat(cli, p, json::array({{{"role", "user"}, {"content", text}}}), i);
    std::lock_guard l(m);
    if (!a.ok) {
      ++r.failed;
      if (r.errors.size() < 8) r.errors.push_back((i == 0 ? std::string("the long chat: ") : "short chat " + std::to_string(i) + ": ") + a.error);
      return;
    }
    ++r.ok;
    latency.push_back(a.seconds);
    if (i == 0) {
      r.ttft_first_mean = a.ttft;
    } else {
      shorts.push_back(a.ttft);
    }
    r.prompt_tokens += a.usage.value("prompt_tokens", 0);
    r.completion_tokens += a.usage.value("completion_tokens", 0);
    r.prompt_tokens_cached += cached_of(a.usage);
  });
  r.wall_seconds = std::chrono::duration<double>(clock_type::now() - t0).count();
  r.p50 = percentile(latency, 0.5);
  r.max = latency.empty() ? 0 : *std::max_element(latency.begin(), latency.end());
  r.ttft_later_mean = mean(shorts);
  r.ttft_later_p50 = percentile(shorts, 0.5);
  r.ttft_later_p95 = percentile(shorts, 0.95);
  r.tokens_per_second = r.wall_seconds > 0 ? static_cast<double>(r.completion_tokens) / r.wall_seconds : 0;
  return r;
}

}  // namespace

load_result run_load(const load_params& p) {
  if (p.workload == "turns" || p.workload == "shared-prefix") return run_conversations(p);
  if (p.workload == "long+short") return run_long_short(p);
  if (p.workload != "load") {
    load_result r;
    r.failed = 1;
    r.errors.push_back("unknown workload '" + p.workload + "' (load, turns, shared-prefix or long+short)");
    return r;
  }
  load_result r;
  std::mutex m;
  std::vector<double> latency, ttft;
  std::atomic<int> next{0};
  const std::string path = p.chat ? "/v1/chat/completions" : "/v1/completions";
  const auto fail = [&](int i, const std::string& why) {
    std::lock_guard l(m);
    ++r.failed;
    if (r.errors.size() < 8) r.errors.push_back("request " + std::to_string(i) + ": " + why);
  };
  const auto t0 = clock_type::now();
  std::vector<std::thread> threads;
  for (int c = 0; c < p.clients; ++c) {
    threads.emplace_back([&] {
      httplib::Client cli(p.host, p.port);
      cli.set_keep_alive(true);
      cli.set_read_timeout(p.timeout_s, 0);
      cli.set_write_timeout(p.timeout_s, 0);
      if (!p.api_key.empty()) cli.set_bearer_token_auth(p.api_key);
      for (int i = next.fetch_add(1); i < p.requests; i = next.fetch_add(1)) {
        json body = {{"model", p.model}, {"max_tokens", p.max_tokens}, {"temperature", p.temperature}, {"seed", i}};
        const std::string prompt = p.prompt + ", " + words(2, static_cast<uint32_t>(i));  // distinct prompts
        if (p.chat) {
          body["messages"] = json::array({{{"role", "user"}, {"content", prompt}}});
        } else {
          body["prompt"] = prompt;
        }
        if (p.stream) {
          body["stream"] = true;
          body["stream_options"] = {{"include_usage", true}};
        }
        const auto start = clock_type::now();
        double first = -1;
        std::string text;
        httplib::Request req;
        req.method = "POST";
        req.path = path;
        req.body = body.dump();
        req.set_header("Content-Type", "application/json");
        if (p.stream) {
          req.content_receiver = [&](const char* data, size_t n, uint64_t, uint64_t) {
            if (first < 0) first = std::chrono::duration<double>(clock_type::now() - start).count();
            text.append(data, n);
            return true;
          };
        }
        httplib::Result res = cli.send(req);
        const double secs = std::chrono::duration<double>(clock_type::now() - start).count();
        if (!res) {
          fail(i, "no response (" + httplib::to_string(res.error()) + ")");
          continue;
        }
        if (res->status != 200) {
          fail(i, "HTTP " + std::to_string(res->status) + ": " + (p.stream ? text : res->body).substr(0, 200));
          continue;
        }
        if (!p.stream) text = res->body;
        json usage;
        try {
          if (p.stream) {
            // The usage chunk is the last data event before [DONE].
            if (text.find("data: [DONE]") == std::string::npos) throw std::runtime_error("the stream did not end with [DONE]");
            const size_t u = text.rfind("data: {\"choices\":[]");
            if (u == std::string::npos) throw std::runtime_error("no usage chunk");
            usage = json::parse(text.substr(u + 6, text.find('\n', u) - u - 6)).at("usage");
          } else {
            const json j = json::parse(text);
            if (j.contains("error")) throw std::runtime_error(j["error"].dump());
            if (j.at("choices").empty()) throw std::runtime_error("no choices");
            usage = j.at("usage");
          }
        } catch (const std::exception& e) {
          fail(i, std::string("bad body: ") + e.what());
          continue;
        }
        const uint64_t completion = usage.value("completion_tokens", 0);
        if (completion == 0) {
          fail(i, "no tokens generated");
          continue;
        }
        std::lock_guard l(m);
        ++r.ok;
        latency.push_back(secs);
        if (first >= 0) ttft.push_back(first);
        r.completion_tokens += completion;
        r.prompt_tokens += usage.value("prompt_tokens", 0);
      }
    });
  }
  for (std::thread& t : threads) t.join();
  r.wall_seconds = std::chrono::duration<double>(clock_type::now() - t0).count();
  r.p50 = percentile(latency, 0.5);
  r.p90 = percentile(latency, 0.9);
  r.p99 = percentile(latency, 0.99);
  r.max = latency.empty() ? 0 : *std::max_element(latency.begin(), latency.end());
  r.ttft_p50 = percentile(ttft, 0.5);
  r.tokens_per_second = r.wall_seconds > 0 ? static_cast<double>(r.completion_tokens) / r.wall_seconds : 0;
  r.requests_per_second = r.wall_seconds > 0 ? r.ok / r.wall_seconds : 0;
  return r;
}

std::string format_load_result(const load_params& p, const load_result& r) {
  char b[1024];
  if (p.workload == "long+short") {
    std::snprintf(b, sizeof b,
                  "long+short: one chat of %d words and %d short chats at once, max_tokens %d on %s: %d ok, %d failed in %.2f s\n"
                  "first piece: the long chat %.1f ms; the short chats mean %.1f ms, p50 %.1f ms, p95 %.1f ms\n"
                  "prompt tokens: %llu, from the server's cache %llu\n"
                  "throughput: %.1f generated tokens/s (%llu tokens)\n",
                  p.long_words, p.conversations, p.max_tokens, p.model.c_str(), r.ok, r.failed, r.wall_seconds,
                  r.ttft_first_mean * 1e3, r.ttft_later_mean * 1e3, r.ttft_later_p50 * 1e3, r.ttft_later_p95 * 1e3,
                  static_cast<unsigned long long>(r.prompt_tokens), static_cast<unsigned long long>(r.prompt_tokens_cached),
                  r.tokens_per_second, static_cast<unsigned long long>(r.completion_tokens));
    std::string out = b;
    for (const std::string& e : r.errors) out += "  failed: " + e + "\n";
    return out;
  }
  if (p.workload == "turns" || p.workload == "shared-prefix") {
    const bool turns = p.workload == "turns";
    const double computed = static_cast<double>(r.prompt_tokens - std::min(r.prompt_tokens, r.prompt_tokens_cached));
    std::string head = turns ? "turns: " + std::to_string(p.conversations) + " conversations x " + std::to_string(p.turns) +
                                   " turns, system texts of " + std::to_string(p.system_words) + " words"
                             : "shared-prefix: " + std::to_string(p.clients) + " clients behind one system text of " +
                                   std::to_string(p.system_words) + " words";
    std::snprintf(b, sizeof b,
                  "%s, %d clients, max_tokens %d on %s: %d ok, %d failed in %.2f s\n"
                  "%s"
                  "first piece%s: mean %.1f ms, p50 %.1f ms, p95 %.1f ms\n"
                  "prompt tokens: %llu, from the server's cache %llu, computed %.0f%s\n"
                  "throughput: %.1f generated tokens/s (%llu tokens)\n",
                  head.c_str(), std::min(p.clients, turns ? p.conversations : p.clients), p.max_tokens, p.model.c_str(),
                  r.ok, r.failed, r.wall_seconds,
                  turns ? ("first piece, turn 1: mean " + std::to_string(r.ttft_first_mean * 1e3).substr(0, 8) + " ms\n").c_str() : "",
                  turns ? ", turns 2.." : "", r.ttft_later_mean * 1e3, r.ttft_later_p50 * 1e3, r.ttft_later_p95 * 1e3,
                  static_cast<unsigned long long>(r.prompt_tokens), static_cast<unsigned long long>(r.prompt_tokens_cached),
                  computed,
                  turns ? (", new " + std::to_string(r.prompt_tokens_new) + " (computed / new " +
                           std::to_string(r.prompt_tokens_new > 0 ? computed / static_cast<double>(r.prompt_tokens_new) : 0.0).substr(0, 5) + ")").c_str()
                        : "",
                  r.tokens_per_second, static_cast<unsigned long long>(r.completion_tokens));
    std::string out = b;
    for (const std::string& e : r.errors) out += "  failed: " + e + "\n";
    return out;
  }
  std::snprintf(b, sizeof b,
                "load: %d clients, %d requests (%s%s, max_tokens %d) on %s: %d ok, %d failed in %.2f s\n"
                "latency: p50 %.1f ms, p90 %.1f ms, p99 %.1f ms, max %.1f ms%s\n"
                "throughput: %.1f requests/s, %.1f generated tokens/s (%llu tokens, %llu prompt tokens)\n",
                p.clients, p.requests, p.chat ? "chat" : "completions", p.stream ? ", streamed" : "", p.max_tokens,
                p.model.c_str(), r.ok, r.failed, r.wall_seconds, r.p50 * 1e3, r.p90 * 1e3, r.p99 * 1e3, r.max * 1e3,
                p.stream ? (", first piece p50 " + std::to_string(static_cast<int>(r.ttft_p50 * 1e3)) + " ms").c_str() : "",
                r.requests_per_second, r.tokens_per_second, static_cast<unsigned long long>(r.completion_tokens),
                static_cast<unsigned long long>(r.prompt_tokens));
  std::string out = b;
  for (const std::string& e : r.errors) out += "  failed: " + e + "\n";
  return out;
}

}  // namespace troupe::http
