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

}  // namespace

load_result run_load(const load_params& p) {
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
        if (p.chat) {
          body["messages"] = json::array({{{"role", "user"}, {"content", p.prompt}}});
        } else {
          body["prompt"] = p.prompt;
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
