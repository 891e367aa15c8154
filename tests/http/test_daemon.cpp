// The daemon end to end: a real `troupe serve` process on 127.0.0.1 (tests/http/daemon_process.h), real
// HTTP over loopback (cpp-httplib's client, and raw sockets where a test must drop a connection itself),
// stories260K with greedy decoding against the reference tokens of ../shared/models/README.md.
#include <catch2/catch.hpp>

#include <algorithm>

#include <arpa/inet.h>
#include <httplib.h>
#include <netinet/in.h>
#include <poll.h>
#include <nlohmann/json.hpp>
#include <sys/socket.h>

#include <atomic>
#include <cmath>
#include <condition_variable>
#include <mutex>
#include <optional>
#include <regex>
#include <thread>

#include "net/http/loadgen.h"
#include "tests/http/client_socket.h"
#include "tests/http/daemon_process.h"
#include "tests/http/stories_daemon.h"
#include "tests/test_models.h"

using namespace troupe;
using namespace troupe::test;
using json = nlohmann::json;
using Catch::Matchers::Contains;

namespace {

// The data events of a server-sent event stream, in order ("[DONE]" included).
std::vector<std::string> sse_events(const std::string& body) {
  std::vector<std::string> out;
  size_t pos = 0;
  while ((pos = body.find("data: ", pos)) != std::string::npos) {
    const size_t end = body.find("\n\n", pos);
    out.push_back(body.substr(pos + 6, end - pos - 6));
    pos = end == std::string::npos ? body.size() : end;
  }
  return out;
}

// A raw HTTP/1.1 request on its own socket, so that the test decides when the connection drops.
class raw_request : public test::client_socket {
 public:
  raw_request(int port, const std::string& path, const std::string& body) : client_socket(port) {
    REQUIRE(connected());
    REQUIRE(send_text("POST " + path + " HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nContent-Length: " +
                      std::to_string(body.size()) + "\r\n\r\n" + body));
  }
};

// Polls until pred() holds (true) or 20 s passed.
template <class Pred>
bool eventually(Pred pred) {
  for (int i = 0; i < 1000; ++i) {
    if (pred()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return false;
}

}  // namespace

TEST_CASE("daemon: chat and completions, plain and streamed, equal the reference tokens", "[http][daemon]") {
  const auto model = test::model_path("stories260K.gguf");
  if (!model) return;
  test::daemon_process d(stories_config(model->string()));
  httplib::Client c("127.0.0.1", d.port());
  c.set_read_timeout(60, 0);

  auto h = c.Get("/health");
  REQUIRE(h);
  CHECK(h->status == 200);
  CHECK(json::parse(h->body)["status"] == "ok");

  auto m = c.Get("/v1/models");
  REQUIRE(m);
  const json models = json::parse(m->body);
  REQUIRE(models["data"].size() == 1);
  CHECK(models["data"][0]["id"] == "stories");
  CHECK(models["data"][0]["meta"]["n_ctx_seq"] == 1024);
  CHECK(models["data"][0]["meta"]["parallel"] == 4);

  SECTION("plain chat") {
    auto r = c.Post("/v1/chat/completions", greedy_chat().dump(), "application/json");
    REQUIRE(r);
    REQUIRE(r->status == 200);
    const json j = json::parse(r->body);
    CHECK(j["object"] == "chat.completion");
    CHECK(j["model"] == "stories");
    CHECK(j["choices"][0]["tokens"].get<std::vector<int>>() == reference_tokens);
    CHECK(j["choices"][0]["message"]["content"] == reference_text);
    CHECK(j["choices"][0]["finish_reason"] == "length");
    CHECK(j["usage"]["prompt_tokens"] == 5);
    CHECK(j["usage"]["completion_tokens"] == 32);
  }
  SECTION("streamed chat, with usage") {
    json body = greedy_chat();
    body["stream"] = true;
    body["stream_options"] = {{"include_usage", true}};
    auto r = c.Post("/v1/chat/completions", body.dump(), "application/json");
    REQUIRE(r);
    REQUIRE(r->status == 200);
    CHECK(r->get_header_value("Content-Type") == "text/event-stream");
    const std::vector<std::string> ev = sse_events(r->body);
    REQUIRE(ev.size() >= 4);
    CHECK(ev.back() == "[DONE]");
    std::string text;
    for (size_t i = 0; i + 3 < ev.size(); ++i) {
      const json j = json::parse(ev[i]);
      CHECK(j["object"] == "chat.completion.chunk");
      if (i == 0) CHECK(j["choices"][0]["delta"]["role"] == "assistant");
      text += j["choices"][0]["delta"]["content"].get<std::string>();
    }
    CHECK(text == reference_text);
    CHECK(json::parse(ev[ev.size() - 3])["choices"][0]["finish_reason"] == "length");
    const json usage = json::parse(ev[ev.size() - 2]);
    CHECK(usage["choices"].empty());
    CHECK(usage["usage"]["completion_tokens"] == 32);
  }
  SECTION("completions, plain and streamed") {
    const json body = {{"model", "stories"}, {"prompt", "Once upon a time"}, {"temperature", 0}, {"max_tokens", 32},
                       {"return_tokens", true}};
    auto r = c.Post("/v1/completions", body.dump(), "application/json");
    REQUIRE(r);
    REQUIRE(r->status == 200);
    const json j = json::parse(r->body);
    CHECK(j["object"] == "text_completion");
    CHECK(j["choices"][0]["tokens"].get<std::vector<int>>() == reference_tokens);
    CHECK(j["choices"][0]["text"] == reference_text);

    json sb = body;
    sb["stream"] = true;
    auto s = c.Post("/v1/completions", sb.dump(), "application/json");
    REQUIRE(s);
    const std::vector<std::string> ev = sse_events(s->body);
    REQUIRE(ev.size() >= 3);
    std::string text;
    for (size_t i = 0; i + 2 < ev.size(); ++i) text += json::parse(ev[i])["choices"][0]["text"].get<std::string>();
    CHECK(text == reference_text);
  }
  SECTION("logit_bias: -100 bans the greedy answer's first token and +100 forces a token") {
    json body = greedy_chat(4);
    body["logit_bias"] = {{std::to_string(reference_tokens[0]), -100}};
    auto r = c.Post("/v1/chat/completions", body.dump(), "application/json");
    REQUIRE(r);
    REQUIRE(r->status == 200);
    const std::vector<int> banned = json::parse(r->body)["choices"][0]["tokens"].get<std::vector<int>>();
    REQUIRE_FALSE(banned.empty());
    CHECK(banned[0] != reference_tokens[0]);
    CHECK(std::find(banned.begin(), banned.end(), reference_tokens[0]) == banned.end());

    body["logit_bias"] = {{"401", 100}};
    r = c.Post("/v1/chat/completions", body.dump(), "application/json");
    REQUIRE(r);
    REQUIRE(r->status == 200);
    CHECK(json::parse(r->body)["choices"][0]["tokens"].get<std::vector<int>>() == std::vector<int>{401, 401, 401, 401});

    // A token id outside the vocabulary (stories260K has 512): a 400 naming logit_bias.
    body["logit_bias"] = {{"512", 5}};
    r = c.Post("/v1/chat/completions", body.dump(), "application/json");
    REQUIRE(r);
    INFO(r->body);
    CHECK(r->status == 400);
    CHECK(json::parse(r->body)["error"]["param"] == "logit_bias");
    CHECK_THAT(r->body, Contains("outside the vocabulary"));
  }
  SECTION("logprobs: the sampled token's log-probability and the most likely, sorted, on chat and completions") {
    json body = greedy_chat();
    body["logprobs"] = true;
    body["top_logprobs"] = 2;
    auto r = c.Post("/v1/chat/completions", body.dump(), "application/json");
    REQUIRE(r);
    REQUIRE(r->status == 200);
    const json j = json::parse(r->body);
    CHECK(j["choices"][0]["tokens"].get<std::vector<int>>() == reference_tokens);  // greedy answer unchanged
    const json& content = j["choices"][0]["logprobs"]["content"];
    REQUIRE(content.size() == reference_tokens.size());
    std::string text;
    for (const json& t : content) {
      const double lp = t["logprob"].get<double>();
      CHECK(lp <= 0.0);
      REQUIRE(t["top_logprobs"].size() == 2);
      // Greedy: the sampled token is the most likely one.
      CHECK(t["top_logprobs"][0]["token"] == t["token"]);
      CHECK(t["top_logprobs"][0]["logprob"].get<double>() == lp);
      CHECK(t["top_logprobs"][1]["logprob"].get<double>() <= lp);
      CHECK(std::exp(lp) + std::exp(t["top_logprobs"][1]["logprob"].get<double>()) <= 1.0 + 1e-6);
      std::string bytes;
      for (const json& b : t["bytes"]) bytes += static_cast<char>(b.get<int>());
      CHECK(bytes == t["token"].get<std::string>());
      text += t["token"].get<std::string>();
    }
    CHECK(text == reference_text);

    const json cb = {{"model", "stories"}, {"prompt", "Once upon a time"}, {"temperature", 0}, {"max_tokens", 8},
                     {"logprobs", 3}};
    r = c.Post("/v1/completions", cb.dump(), "application/json");
    REQUIRE(r);
    REQUIRE(r->status == 200);
    const json lp = json::parse(r->body)["choices"][0]["logprobs"];
    REQUIRE(lp["tokens"].size() == 8);
    REQUIRE(lp["token_logprobs"].size() == 8);
    REQUIRE(lp["top_logprobs"].size() == 8);
    size_t offset = 0;
    for (size_t i = 0; i < 8; ++i) {
      CHECK(lp["token_logprobs"][i].get<double>() <= 0.0);
      CHECK(lp["top_logprobs"][i].size() <= 3);
      CHECK(lp["top_logprobs"][i].contains(lp["tokens"][i].get<std::string>()));
      CHECK(lp["text_offset"][i].get<size_t>() == offset);
      offset += lp["tokens"][i].get<std::string>().size();
    }
    // Sampling at temperature 0.7 with top_k 2 (top_p, min_p off): the distribution each token was drawn
    // from is the two candidates left, so their probabilities add up to 1 and the token is one of them.
    json tb = greedy_chat(16);
    tb["temperature"] = 0.7;
    tb["top_k"] = 2;
    tb["top_p"] = 1;
    tb["min_p"] = 0;
    tb["seed"] = 11;
    tb["logprobs"] = true;
    tb["top_logprobs"] = 5;
    r = c.Post("/v1/chat/completions", tb.dump(), "application/json");
    REQUIRE(r);
    REQUIRE(r->status == 200);
    const json sampled = json::parse(r->body)["choices"][0]["logprobs"]["content"];
    REQUIRE_FALSE(sampled.empty());
    for (const json& t : sampled) {
      REQUIRE(t["top_logprobs"].size() == 2);
      double sum = 0;
      bool found = false;
      for (const json& e : t["top_logprobs"]) {
        sum += std::exp(e["logprob"].get<double>());
        found |= e["token"] == t["token"] && e["logprob"] == t["logprob"];
      }
      CHECK(sum == Approx(1.0).epsilon(1e-5));
      CHECK(found);
    }
    // Streamed: each chunk carries its tokens' entries; together they are the plain answer's.
    json sb = greedy_chat();
    sb["logprobs"] = true;
    sb["top_logprobs"] = 2;
    sb["stream"] = true;
    auto s = c.Post("/v1/chat/completions", sb.dump(), "application/json");
    REQUIRE(s);
    REQUIRE(s->status == 200);
    json streamed = json::array();
    for (const std::string& ev : sse_events(s->body)) {
      if (ev == "[DONE]") continue;
      const json chunk = json::parse(ev);
      if (chunk["choices"].empty() || chunk["choices"][0]["logprobs"].is_null()) continue;
      for (const json& t : chunk["choices"][0]["logprobs"]["content"]) streamed.push_back(t);
    }
    CHECK(streamed == content);
    json sc = cb;
    sc["stream"] = true;
    s = c.Post("/v1/completions", sc.dump(), "application/json");
    REQUIRE(s);
    std::vector<size_t> offsets;
    for (const std::string& ev : sse_events(s->body)) {
      if (ev == "[DONE]") continue;
      const json chunk = json::parse(ev);
      if (chunk["choices"].empty() || chunk["choices"][0]["logprobs"].is_null()) continue;
      for (const json& o : chunk["choices"][0]["logprobs"]["text_offset"]) offsets.push_back(o.get<size_t>());
    }
    CHECK(offsets == lp["text_offset"].get<std::vector<size_t>>());
    // Without the field: null, as before.
    r = c.Post("/v1/chat/completions", greedy_chat(2).dump(), "application/json");
    REQUIRE(r);
    CHECK(json::parse(r->body)["choices"][0]["logprobs"].is_null());
  }
  SECTION("completions of a prompt given as token ids") {
    // ../shared/models/README.md: "Once upon a time" with BOS is [1, 403, 407, 261, 378].
    for (const json& prompt : {json::array({1, 403, 407, 261, 378}), json::array({json::array({1, 403, 407, 261, 378})})}) {
      INFO(prompt.dump());
      const json body = {{"model", "stories"}, {"prompt", prompt}, {"temperature", 0}, {"max_tokens", 32}, {"return_tokens", true}};
      auto r = c.Post("/v1/completions", body.dump(), "application/json");
      REQUIRE(r);
      REQUIRE(r->status == 200);
      const json j = json::parse(r->body);
      CHECK(j["choices"][0]["tokens"].get<std::vector<int>>() == reference_tokens);
      CHECK(j["choices"][0]["text"] == reference_text);
      CHECK(j["usage"]["prompt_tokens"] == 5);
    }
    const json bad = {{"model", "stories"}, {"prompt", {1, 403, 9999}}, {"max_tokens", 4}};
    auto r = c.Post("/v1/completions", bad.dump(), "application/json");
    REQUIRE(r);
    CHECK(r->status == 400);
    CHECK(json::parse(r->body)["error"]["param"] == "prompt");
    CHECK_THAT(r->body, Contains("outside the vocabulary"));
  }
  SECTION("stop strings end the answer before them") {
    json body = greedy_chat();
    body["stop"] = "Lily";
    auto r = c.Post("/v1/chat/completions", body.dump(), "application/json");
    REQUIRE(r);
    const json j = json::parse(r->body);
    CHECK(j["choices"][0]["message"]["content"] == ", there was a little girl named ");
    CHECK(j["choices"][0]["finish_reason"] == "stop");
  }
  SECTION("memory and metrics") {
    c.Post("/v1/chat/completions", greedy_chat(4).dump(), "application/json");
    auto mem = c.Get("/v1/memory");
    REQUIRE(mem);
    REQUIRE(mem->status == 200);
    const json mj = json::parse(mem->body);
    CHECK(mj.dump().find("\"model\"") != std::string::npos);
    auto mt = c.Get("/metrics");
    REQUIRE(mt);
    CHECK_THAT(mt->body, Contains("troupe_memory_bytes{buft=\"CPU\""));
    CHECK(metric(c, "troupe_generated_tokens_total") >= 4);
    CHECK(metric(c, "troupe_requests_total{endpoint=\"chat\",status=\"200\"}") >= 1);
    CHECK(metric(c, "troupe_model_ready{model=\"stories\"}") == 1);
  }
}

TEST_CASE("daemon: concurrent requests are batched and each answer is right", "[http][daemon]") {
  const auto model = test::model_path("stories260K.gguf");
  if (!model) return;
  test::daemon_process d(stories_config(model->string()));
  constexpr int n = 8;
  std::vector<std::vector<int>> tokens(n);
  std::vector<int> status(n, 0);
  std::vector<std::thread> threads;
  for (int i = 0; i < n; ++i) {
    threads.emplace_back([&, i] {
      httplib::Client c("127.0.0.1", d.port());
      c.set_read_timeout(120, 0);
      json body = greedy_chat();
      body["stream"] = i % 2 == 1;
      auto r = c.Post("/v1/chat/completions", body.dump(), "application/json");
      if (!r) return;
      status[i] = r->status;
      if (i % 2 == 0) tokens[i] = json::parse(r->body)["choices"][0]["tokens"].get<std::vector<int>>();
    });
  }
  for (std::thread& t : threads) t.join();
  for (int i = 0; i < n; ++i) {
    INFO("request " << i);
    CHECK(status[i] == 200);
    if (i % 2 == 0) CHECK(tokens[i] == reference_tokens);
  }
  httplib::Client c("127.0.0.1", d.port());
  CHECK(metric(c, "troupe_requests_total{endpoint=\"chat\",status=\"200\"}") == n);
  CHECK(metric(c, "troupe_sessions{model=\"stories\",state=\"busy\"}") == 0);
  // The scheduler decoded steps of several sessions together (8 answers of 32 tokens each).
  CHECK(metric(c, "troupe_decode_steps_total{model=\"stories\"}") >= n * 30);
  CHECK(metric(c, "troupe_decode_batch_max{model=\"stories\"}") >= 2);
  CHECK(metric(c, "troupe_decode_batches_total{model=\"stories\"}") < metric(c, "troupe_decode_steps_total{model=\"stories\"}"));
}

TEST_CASE("daemon: error cases in the OpenAI shape", "[http][daemon]") {
  const auto model = test::model_path("stories260K.gguf");
  if (!model) return;
  test::daemon_process d(stories_config(model->string(), "api_keys = [\"sesame\"]\n", 256, 2, 64));
  httplib::Client c("127.0.0.1", d.port());
  c.set_read_timeout(60, 0);
  const auto expect = [&](httplib::Result r, int status, const std::string& type, const std::string& says) {
    REQUIRE(r);
    CHECK(r->status == status);
    const json j = json::parse(r->body);
    CHECK(j["error"]["type"] == type);
    CHECK_THAT(j["error"]["message"].get<std::string>(), Contains(says));
    return j;
  };
  // No key, a wrong key: 401 (health needs none).
  expect(c.Post("/v1/chat/completions", greedy_chat().dump(), "application/json"), 401, "invalid_request_error", "missing API key");
  c.set_bearer_token_auth("open");
  const json wrong = expect(c.Post("/v1/chat/completions", greedy_chat().dump(), "application/json"), 401,
                            "invalid_request_error", "invalid API key");
  CHECK(wrong["error"]["code"] == "invalid_api_key");
  expect(c.Get("/v1/models"), 401, "invalid_request_error", "invalid API key");
  httplib::Client anon("127.0.0.1", d.port());
  auto h = anon.Get("/health");
  REQUIRE(h);
  CHECK(h->status == 200);

  c.set_bearer_token_auth("sesame");
  auto ok = c.Post("/v1/chat/completions", greedy_chat(8).dump(), "application/json");
  REQUIRE(ok);
  CHECK(ok->status == 200);
  // Bad JSON, bad fields: 400 naming the field.
  expect(c.Post("/v1/chat/completions", "{\"model\": ", "application/json"), 400, "invalid_request_error", "not valid JSON");
  json hot = greedy_chat();
  hot["temperature"] = "hot";
  CHECK(expect(c.Post("/v1/chat/completions", hot.dump(), "application/json"), 400, "invalid_request_error", "temperature")
            ["error"]["param"] == "temperature");
  // Unknown model: 404.
  json other = greedy_chat();
  other["model"] = "gpt-5";
  CHECK(expect(c.Post("/v1/chat/completions", other.dump(), "application/json"), 404, "invalid_request_error", "gpt-5")
            ["error"]["code"] == "model_not_found");
  // A prompt longer than the session's context (64 tokens here): 400.
  json longp = greedy_chat();
  std::string words;
  for (int i = 0; i < 100; ++i) words += " Once upon a time";
  longp["messages"][0]["content"] = words;
  CHECK(expect(c.Post("/v1/chat/completions", longp.dump(), "application/json"), 400, "invalid_request_error", "tokens")
            ["error"]["code"] == "context_length_exceeded");
  // Unknown route: 404 in the same shape; a body over the limit: 413.
  expect(c.Get("/v1/nothing"), 404, "invalid_request_error", "no route");
  // The daemon still answers after all of it.
  auto again = c.Post("/v1/chat/completions", greedy_chat(32).dump(), "application/json");
  REQUIRE(again);
  REQUIRE(again->status == 200);
  CHECK(json::parse(again->body)["choices"][0]["tokens"].get<std::vector<int>>() == reference_tokens);
}

TEST_CASE("daemon: a full queue answers 503, and a client that disconnects cancels its answer", "[http][daemon]") {
  const auto model = test::model_path("stories260K.gguf");
  if (!model) return;
  // One session, no queue: a second request while the first generates is refused.
  test::daemon_process d(stories_config(model->string(), "queue_limit = 0\n", 8192, 1, 8192));
  httplib::Client c("127.0.0.1", d.port());
  c.set_read_timeout(60, 0);
  json long_answer = {{"model", "stories"}, {"prompt", "Once upon a time"}, {"max_tokens", 8000}, {"stream", true}};
  {
    raw_request first(d.port(), "/v1/completions", long_answer.dump());
    REQUIRE(first.read_until("data: "));
    auto busy = c.Post("/v1/chat/completions", greedy_chat().dump(), "application/json");
    REQUIRE(busy);
    CHECK(busy->status == 503);
    CHECK_THAT(json::parse(busy->body)["error"]["message"].get<std::string>(), Contains("queue is full"));
    first.close_now();  // the client goes away mid-answer
  }
  REQUIRE(eventually([&] { return metric(c, "troupe_requests_cancelled_total") == 1; }));
  REQUIRE(eventually([&] { return metric(c, "troupe_sessions{model=\"stories\",state=\"busy\"}") == 0; }));
  CHECK(d.wait_for_log("client went away", std::chrono::seconds(5)));
  CHECK(metric(c, "troupe_generated_tokens_total") < 8000);

  // A plain (non-streamed) answer notices the disconnect too (by its whitespace heartbeat).
  {
    json plain = long_answer;
    plain["stream"] = false;
    raw_request second(d.port(), "/v1/completions", plain.dump());
    REQUIRE(second.read_until("\r\n\r\n"));  // headers sent: generating
    second.close_now();
  }
  REQUIRE(eventually([&] { return metric(c, "troupe_requests_cancelled_total") == 2; }));
  REQUIRE(eventually([&] { return metric(c, "troupe_sessions{model=\"stories\",state=\"busy\"}") == 0; }));

  // The session is free again: the next answer is whole and right.
  auto r = c.Post("/v1/chat/completions", greedy_chat().dump(), "application/json");
  REQUIRE(r);
  REQUIRE(r->status == 200);
  CHECK(json::parse(r->body)["choices"][0]["tokens"].get<std::vector<int>>() == reference_tokens);
}

TEST_CASE("daemon: SIGTERM drains in-flight answers, frees everything and exits 0", "[http][daemon]") {
  const auto model = test::model_path("stories260K.gguf");
  if (!model) return;
  test::daemon_process d(stories_config(model->string(), "", 8192, 1, 8192));
  raw_request inflight(d.port(), "/v1/completions",
                       json{{"model", "stories"}, {"prompt", "Once upon a time"}, {"max_tokens", 2000}, {"stream", true}}.dump());
  REQUIRE(inflight.read_until("data: "));
  d.signal(SIGTERM);
  // The answer in flight still ends properly (finished, or cut at the grace period) with [DONE].
  CHECK(inflight.read_until("data: [DONE]"));
  CHECK(d.wait_exit(std::chrono::seconds(30)) == 0);
  const std::string log = d.log();
  CHECK_THAT(log, Contains("received SIGTERM"));
  CHECK_THAT(log, Contains("stopped: 0 bytes still held"));
  httplib::Client c("127.0.0.1", d.port());
  c.set_connection_timeout(1, 0);
  CHECK_FALSE(c.Get("/health"));  // no longer listening
}

TEST_CASE("daemon: a bad configuration is refused with the file, line and key", "[http][daemon]") {
  test::daemon_process d("[server]\nport = 0\nbogus = 1\n", {}, false);
  CHECK(d.wait_exit(std::chrono::seconds(30)) == 1);
  CHECK_THAT(d.log(), Contains("daemon.toml:3") && Contains("unknown key 'bogus' in [server]"));
  test::daemon_process m("[server]\nport = 0\n[[model]]\nname = \"m\"\npath = \"/nonexistent/m.gguf\"\n", {}, false);
  CHECK(m.wait_exit(std::chrono::seconds(30)) == 1);
  CHECK_THAT(m.log(), Contains("model 'm'") && Contains("/nonexistent/m.gguf"));
  // A file that is not GGUF: the load fails, the daemon says why and exits 1 (after freeing what it had).
  const auto junk = std::filesystem::temp_directory_path() / ("troupe-junk-" + std::to_string(getpid()) + ".gguf");
  std::ofstream(junk) << "this is not a GGUF file at all, just some text that is long enough";
  test::daemon_process j("[server]\nport = 0\n[[model]]\nname = \"junk\"\npath = \"" + junk.string() + "\"\n", {}, false);
  const int jrc = j.wait_exit(std::chrono::seconds(30));
  INFO(j.log());
  CHECK(jrc == 1);
  CHECK_THAT(j.log(), Contains("startup failed") && Contains(junk.string()));
  std::filesystem::remove(junk);
}

// `troupe peer --port P` on 127.0.0.1 (0: any free port): its address from the first line it prints;
// SIGTERMed at the end (or SIGKILLed by kill()).
class peer_server {
 public:
  explicit peer_server(int port = 0) {
    int out = -1;
    std::tie(pid_, out) = test::spawn_piped({TROUPE_BIN, "peer", "--port", std::to_string(port), "-t", "1", "--device", "cpu"}, STDOUT_FILENO);
    std::string line;
    char ch = 0;
    pollfd pfd{out, POLLIN, 0};
    while (line.find('\n') == std::string::npos && poll(&pfd, 1, 30000) > 0 && read(out, &ch, 1) == 1) line += ch;
    close(out);
    std::smatch m;
    REQUIRE(std::regex_search(line, m, std::regex("listening on (127\\.0\\.0\\.1:[0-9]+)")));
    address_ = m[1];
  }
  ~peer_server() {
    if (pid_ <= 0) return;
    ::kill(pid_, SIGTERM);
    waitpid(pid_, nullptr, 0);
  }
  void kill() {
    ::kill(pid_, SIGKILL);
    waitpid(pid_, nullptr, 0);
    pid_ = -1;
  }
  const std::string& address() const { return address_; }
  int port() const { return std::stoi(address_.substr(address_.rfind(':') + 1)); }

 private:
  pid_t pid_ = -1;
  std::string address_;
};

TEST_CASE("daemon: a configured remote peer holds the model's layers, dies and comes back", "[http][daemon][peer]") {
  const auto model = test::model_path("stories260K.gguf");
  if (!model) return;
  peer_server peer;
  // Every layer (and the output) on the peer's CPU device; the answer is still the reference.
  test::daemon_process d("[server]\nport = 0\n[[peer]]\nname = \"box\"\naddress = \"" + peer.address() +
                         "\"\n[[model]]\nname = \"stories\"\npath = \"" + model->string() +
                         "\"\nchat_template = \"raw\"\nthreads = 1\nn_ctx = 512\nn_seq_max = 2\n"
                         "devices = [{ device = \"RPC[" + peer.address() + "]#0\", layers = 5 }]\n");
  CHECK_THAT(d.log(), Contains("peer box (" + peer.address() + ") is up with 1 device(s)"));
  httplib::Client c("127.0.0.1", d.port());
  c.set_read_timeout(60, 0);
  auto r = c.Post("/v1/chat/completions", greedy_chat().dump(), "application/json");
  REQUIRE(r);
  REQUIRE(r->status == 200);
  CHECK(json::parse(r->body)["choices"][0]["tokens"].get<std::vector<int>>() == reference_tokens);
  // The weights are the peer's memory, not this host's.
  auto mem = c.Get("/metrics");
  REQUIRE(mem);
  CHECK_THAT(mem->body, Contains("troupe_memory_bytes{buft=\"RPC[" + peer.address() + "]#0\""));

  // A second session: a streamed answer holds the first one while another request comes.
  {
    json slow = greedy_chat(200);
    slow["stream"] = true;
    raw_request held(d.port(), "/v1/chat/completions", slow.dump());
    REQUIRE(held.read_until("data: "));
    r = c.Post("/v1/chat/completions", greedy_chat().dump(), "application/json");
    REQUIRE(r);
    REQUIRE(r->status == 200);
  }

  // The peer dies: the daemon keeps serving, says the model is down, and answers its requests with an
  // error naming the peer.
  const int port = peer.port();
  peer.kill();
  auto ready = [&] {
    auto h = c.Get("/health");
    return h && json::parse(h->body)["models"][0]["ready"].get<bool>();
  };
  REQUIRE(eventually([&] { return !ready(); }));
  auto h = c.Get("/health");
  REQUIRE(h);
  CHECK(h->status == 503);
  CHECK(json::parse(h->body)["status"] == "unavailable");
  CHECK(metric(c, "troupe_model_ready{model=\"stories\"}") == 0);
  r = c.Post("/v1/chat/completions", greedy_chat().dump(), "application/json");
  REQUIRE(r);
  CHECK_THAT(r->body, Contains("error") && Contains(peer.address()));

  // It comes back on the same port: the model is loaded onto it again by itself, and the next request is
  // answered right (on a new session: the old ones went with the old weights).
  peer_server again(port);
  REQUIRE(again.address() == peer.address());
  REQUIRE(eventually(ready));
  r = c.Post("/v1/chat/completions", greedy_chat().dump(), "application/json");
  REQUIRE(r);
  REQUIRE(r->status == 200);
  CHECK(json::parse(r->body)["choices"][0]["tokens"].get<std::vector<int>>() == reference_tokens);
  CHECK_THAT(d.log(), Contains("model stories is loaded again"));
  // The idle session of before had ended with the old weights: the request went to a new one.
  CHECK_THAT(d.log(), Contains("retrying on a new session"));
  d.signal(SIGTERM);
  CHECK(d.wait_exit(std::chrono::seconds(30)) == 0);
  CHECK_THAT(d.log(), Contains("stopped: 0 bytes still held"));
}

TEST_CASE("troupe bench --rpc: generation with every layer on a troupe peer", "[http][peer][bench]") {
  const auto model = test::model_path("stories260K.gguf");
  if (!model) return;
  peer_server peer;
  const auto [st, text] = test::run_captured({TROUPE_BIN, "bench", "-m", model->string(), "-p", "0", "-n", "16", "-r", "2",
                                              "-t", "1", "-o", "json", "--rpc", peer.address()});
  INFO(text);
  REQUIRE(WIFEXITED(st));
  REQUIRE(WEXITSTATUS(st) == 0);
  const json j = json::parse(text);
  REQUIRE(j.size() == 1);
  CHECK(j[0]["backend"] == "RPC");
  CHECK(j[0]["test"] == "tg16");
  CHECK(j[0]["avg_ts"].get<double>() > 0);
  // One round trip per token: inputs travel with the graph, the logits with the reply.
  CHECK(j[0]["round_trips_per_token"].get<double>() == 1.0);
  CHECK(j[0]["graphs_sent_per_token"].get<double>() < 0.5);
}

namespace {

// `troupe peer --port 0 -t 1` with `env` (NAME=VALUE) in its environment (TROUPE_RPC_DEBUG, GGML_RPC_DEBUG
// and TROUPE_LOG_LEVEL taken out of the rest), its stdout and stderr read into one text.
class logged_peer {
 public:
  explicit logged_peer(const std::string& env) {
    int out = -1;
    std::tie(pid_, out) = test::spawn_piped({TROUPE_BIN, "peer", "--port", "0", "-t", "1", "--device", "cpu"},
                                            {STDOUT_FILENO, STDERR_FILENO}, {"TROUPE_RPC_DEBUG", "GGML_RPC_DEBUG", "TROUPE_LOG_LEVEL", env});
    reader_ = std::thread([this, fd = out] {
      char buf[4096];
      for (ssize_t n; (n = read(fd, buf, sizeof buf)) > 0;) {
        std::lock_guard l(mu_);
        out_.append(buf, static_cast<size_t>(n));
        cv_.notify_all();
      }
      close(fd);
    });
    address_ = match(std::regex("listening on (127\\.0\\.0\\.1:[0-9]+)"), 1).value_or("");
  }
  ~logged_peer() {
    ::kill(pid_, SIGTERM);
    waitpid(pid_, nullptr, 0);
    reader_.join();
  }
  // Waits (at most a minute) until the output matches re; returns the match's group `group`, copied while
  // the lock is held (the reader thread grows the text, which moves it: a match kept past the lock would
  // point into freed memory, as ThreadSanitizer found), or nothing.
  std::optional<std::string> match(const std::regex& re, size_t group = 0) {
    std::unique_lock l(mu_);
    std::optional<std::string> got;
    cv_.wait_for(l, std::chrono::seconds(60), [&] {
      std::smatch m;
      if (!std::regex_search(out_, m, re)) return false;
      got = m[group].str();
      return true;
    });
    return got;
  }
  bool wait_for(const std::regex& re) { return match(re).has_value(); }
  std::string text() {
    std::lock_guard l(mu_);
    return out_;
  }
  const std::string& address() const { return address_; }

 private:
  pid_t pid_ = -1;
  std::mutex mu_;
  std::condition_variable cv_;
  std::string out_;
  std::string address_;
  std::thread reader_;
};

size_t count_matches(const std::string& text, const std::regex& re) {
  return static_cast<size_t>(std::distance(std::sregex_iterator(text.begin(), text.end(), re), std::sregex_iterator()));
}

}  // namespace

TEST_CASE("TROUPE_RPC_DEBUG=1 troupe peer serving troupe bench --rpc on SmolLM2: a debug line for every request it received, streamed uploads included", "[http][peer][bench][debug]") {
  const auto model = test::smollm2_path();
  if (!model) return;
  logged_peer peer("TROUPE_RPC_DEBUG=1");
  REQUIRE_FALSE(peer.address().empty());
  const auto [st, text] = test::run_captured({TROUPE_BIN, "bench", "-m", model->string(), "-p", "32", "-n", "4", "-r", "1",
                                              "-t", "1", "-o", "json", "--rpc", peer.address()});
  INFO(text);
  REQUIRE(WIFEXITED(st));
  REQUIRE(WEXITSTATUS(st) == 0);
  const json j = json::parse(text);
  REQUIRE(j.size() == 2);
  const uint64_t requests = j[1]["rpc_requests"].get<uint64_t>();
  // The bench's connection has closed: the peer's session logged it after its last command.
  CHECK(peer.wait_for(std::regex("\\[debug\\] rpc 127\\.0\\.0\\.1:[0-9]+: closed; freeing")));
  const std::string log = peer.text();
  const std::regex line("\\[debug\\] rpc 127\\.0\\.0\\.1:[0-9]+: (hello|device_count|alloc_buffer|get_alignment|get_max_size|"
                        "buffer_get_base|free_buffer|buffer_clear|set_tensor|set_tensor_hash|get_tensor|copy_tensor|graph_compute|"
                        "graph_recompute|get_device_memory|init_tensor|get_alloc_size) ");
  INFO(log.substr(0, 20000));
  CHECK(requests > 100);
  CHECK(count_matches(log, line) == requests);
  CHECK(count_matches(log, std::regex("set_tensor handle [0-9]+, offset [0-9]+, size [0-9]+ \\(streamed\\)")) > 0);  // weights over 1 MiB
  CHECK(log.find("graph_compute device 0, ") != std::string::npos);
}

TEST_CASE("GGML_RPC_DEBUG, the seed's name, switches the peer's debug lines on too", "[http][peer][debug]") {
  const auto model = test::model_path("stories260K.gguf");
  if (!model) return;
  for (const std::string value : {"1", "0"}) {
    INFO("GGML_RPC_DEBUG=" << value);
    logged_peer peer("GGML_RPC_DEBUG=" + value);
    REQUIRE_FALSE(peer.address().empty());
    const auto [st, text] = test::run_captured({TROUPE_BIN, "bench", "-m", model->string(), "-p", "0", "-n", "2", "-r", "1",
                                                "-t", "1", "-o", "json", "--rpc", peer.address()});
    REQUIRE(WIFEXITED(st));
    REQUIRE(WEXITSTATUS(st) == 0);
    if (value == "1") {
      CHECK(peer.wait_for(std::regex("\\[debug\\] rpc 127\\.0\\.0\\.1:[0-9]+: hello client [0-9.]+ -> ok")));
      CHECK(peer.wait_for(std::regex("\\[debug\\] rpc 127\\.0\\.0\\.1:[0-9]+: device_count -> 1 devices")));
    } else {
      CHECK(peer.text().find("[debug]") == std::string::npos);
    }
  }
}

TEST_CASE("daemon: load test, 16 clients and 200 requests on stories260K, none fails", "[http][daemon][load]") {
  const auto model = test::model_path("stories260K.gguf");
  if (!model) return;
  test::daemon_process d(stories_config(model->string(), "", 4096, 4));
  http::load_params p;
  p.port = d.port();
  p.model = "stories";
  p.clients = 16;
  p.requests = 200;
  p.max_tokens = 32;
  p.stream = true;
  const http::load_result r = http::run_load(p);
  INFO(http::format_load_result(p, r));
  CHECK(r.failed == 0);
  CHECK(r.ok == 200);
  CHECK(r.completion_tokens > 0);
  httplib::Client c("127.0.0.1", d.port());
  CHECK(metric(c, "troupe_requests_total{endpoint=\"chat\",status=\"200\"}") == 200);
}

TEST_CASE("daemon: a session whose streamed answer the client abandoned serves the next request at once", "[http][daemon]") {
  const auto model = test::model_path("stories260K.gguf");
  if (!model) return;
  // One session: every request after an abandoned stream gets the session that answered it.
  test::daemon_process d(stories_config(model->string(), "", 1024, 1));
  httplib::Client c("127.0.0.1", d.port());
  c.set_read_timeout(60, 0);
  json slow = greedy_chat(400);
  slow["stream"] = true;
  for (int i = 0; i < 10; ++i) {
    {
      raw_request gone(d.port(), "/v1/chat/completions", slow.dump());
      REQUIRE(gone.read_until("data: "));
    }  // closed after the first event
    auto r = c.Post("/v1/chat/completions", greedy_chat().dump(), "application/json");
    REQUIRE(r);
    INFO(r->body);
    REQUIRE(r->status == 200);
    CHECK(json::parse(r->body)["choices"][0]["tokens"].get<std::vector<int>>() == reference_tokens);
  }
  CHECK(d.log().find("is already answering") == std::string::npos);
}
