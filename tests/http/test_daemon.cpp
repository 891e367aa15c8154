// The daemon end to end: a real `troupe serve` process on 127.0.0.1 (tests/http/daemon_process.h), real
// HTTP over loopback (cpp-httplib's client), stories260K with greedy decoding against the reference tokens
// of ../shared/models/README.md: chat and completions plain and streamed, concurrent requests batched,
// embeddings on the model's sessions, and a load test. (Errors, cancellation and shutdown:
// test_daemon_failures.cpp; remote peers: test_daemon_peer.cpp.)
#include <catch2/catch.hpp>

#include <algorithm>

#include <httplib.h>
#include <nlohmann/json.hpp>

#include <cmath>
#include <csignal>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "llm/chat_template.h"
#include "llm/generator.h"
#include "llm/tool_calls.h"
#include "net/http/loadgen.h"
#include "tests/http/daemon_fixture.h"
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

// The embeddings of a /v1/embeddings answer (float encoding), in index order; each is checked to have
// stories260K's n_embd (64) values and length 1.
std::vector<std::vector<float>> embeddings_of(const std::string& body) {
  const json j = json::parse(body);
  CHECK(j["object"] == "list");
  CHECK(j["model"] == "stories");
  std::vector<std::vector<float>> out;
  for (size_t i = 0; i < j["data"].size(); ++i) {
    const json& d = j["data"][i];
    CHECK(d["object"] == "embedding");
    CHECK(d["index"] == i);
    out.push_back(d["embedding"].get<std::vector<float>>());
    CHECK(out.back().size() == 64);
    double norm2 = 0;
    for (const float x : out.back()) norm2 += static_cast<double>(x) * x;
    CHECK(norm2 == Approx(1.0).epsilon(1e-5));
  }
  return out;
}

// Values of the daemon's /metrics ("name{labels}" exactly as printed) from one reading, so that they agree
// with each other; -1 for each one absent.
std::vector<double> metrics_at_once(httplib::Client& c, const std::vector<std::string>& names) {
  std::vector<double> out(names.size(), -1);
  auto r = c.Get("/metrics");
  if (!r || r->status != 200) return out;
  for (size_t i = 0; i < names.size(); ++i) {
    const size_t at = r->body.find("\n" + names[i] + " ");
    if (at != std::string::npos) out[i] = std::stod(r->body.substr(at + names[i].size() + 2));
  }
  return out;
}

bool close_to(const std::vector<float>& a, const std::vector<float>& b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i) {
    if (std::fabs(a[i] - b[i]) > 1e-6f) return false;
  }
  return true;
}

// Standard base64 decoded (OpenAI's encoding_format "base64": little-endian float32).
std::vector<float> floats_of_base64(const std::string& text) {
  static const std::string table = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  std::string bytes;
  uint32_t acc = 0;
  int bits = 0;
  for (const char ch : text) {
    if (ch == '=') break;
    acc = (acc << 6) | static_cast<uint32_t>(table.find(ch));
    bits += 6;
    if (bits >= 8) {
      bits -= 8;
      bytes += static_cast<char>((acc >> bits) & 0xff);
    }
  }
  std::vector<float> out(bytes.size() / sizeof(float));
  std::memcpy(out.data(), bytes.data(), out.size() * sizeof(float));
  return out;
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
  CHECK(models["data"][0]["meta"]["n_ctx_seq"] == 4096);  // one pool: a session may take all of it
  CHECK(models["data"][0]["meta"]["n_ctx"] == 4096);
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
  // The scheduler waits up to flush_delay_us for every generating session's next step before it decodes
  // without it. A minute (far beyond any step's round trip) makes the wait, not the machine's speed, decide:
  // while two answers generate, every decode has both their steps. Only a step that never came would wait it
  // out, and every answer here sends its next step or its end.
  std::string config = stories_config(model->string(), "", 16384, 4);
  config.replace(config.find("[runtime]\n"), 10, "[runtime]\nflush_delay_us = 60000000\n");
  test::daemon_process d(config);
  httplib::Client c("127.0.0.1", d.port());
  c.set_read_timeout(120, 0);
  const std::string steps = "troupe_decode_steps_total{model=\"stories\"}";
  const std::string batches = "troupe_decode_batches_total{model=\"stories\"}";
  // Steps decoded together with another one so far (a decode of k steps counts k - 1).
  const auto shared_steps = [&] {
    const std::vector<double> v = metrics_at_once(c, {steps, batches});
    return v[0] - v[1];
  };

  // An answer that generates from before the others are sent until after they are answered, whatever the
  // machine's speed: 4000 tokens with end-of-sequence banned, plain (its heartbeat spaces are all it writes
  // meanwhile), its connection closed by the test at the end, which cancels it.
  json long_body = greedy_chat(4000);
  long_body["logit_bias"] = {{"2", -100}};
  raw_request held(d.port(), "/v1/chat/completions", long_body.dump());
  REQUIRE(held.read_until("\r\n\r\n"));  // headers sent: generating

  // One answer beside it: each of its 32 steps (the prompt's and 31 tokens') is decoded together with a step
  // of the long answer. A scheduler that decoded what is waiting without waiting for the other generating
  // session's step would decode the two answers' steps in turn.
  const double shared_before = shared_steps();
  auto one = c.Post("/v1/chat/completions", greedy_chat().dump(), "application/json");
  REQUIRE(one);
  REQUIRE(one->status == 200);
  CHECK(json::parse(one->body)["choices"][0]["tokens"].get<std::vector<int>>() == reference_tokens);
  CHECK(shared_steps() - shared_before >= 30);

  // Eight at once on the other three sessions (five wait in the queue): each answer is right.
  constexpr int n = 8;
  std::vector<std::vector<int>> tokens(n);
  std::vector<int> status(n, 0);
  std::vector<std::thread> threads;
  for (int i = 0; i < n; ++i) {
    threads.emplace_back([&, i] {
      httplib::Client ci("127.0.0.1", d.port());
      ci.set_read_timeout(120, 0);
      json body = greedy_chat();
      body["stream"] = i % 2 == 1;
      auto r = ci.Post("/v1/chat/completions", body.dump(), "application/json");
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
  held.close_now();
  // The long answer was still generating: cancelled when its client went away, not finished.
  CHECK(eventually([&] { return metric(c, "troupe_requests_cancelled_total") == 1; }));
  CHECK(eventually([&] { return metric(c, "troupe_sessions{model=\"stories\",state=\"busy\"}") == 0; }));
  CHECK(metric(c, "troupe_requests_total{endpoint=\"chat\",status=\"200\"}") == n + 1);
  // The scheduler decoded steps of several sessions together (nine answers of 32 tokens, and the long one).
  CHECK(metric(c, steps) >= (n + 1) * 30);
  CHECK(metric(c, "troupe_decode_batch_max{model=\"stories\"}") >= 2);
  CHECK(metric(c, batches) < metric(c, steps));
}

TEST_CASE("daemon: /v1/embeddings on the model's sessions, alongside completions", "[http][daemon][embeddings]") {
  const auto model = test::model_path("stories260K.gguf");
  if (!model) return;
  // Two sessions (n_ctx_seq 128): the requests below share them with a completion.
  test::daemon_process d(stories_config(model->string(), "", 256, 2));
  httplib::Client c("127.0.0.1", d.port());
  c.set_read_timeout(60, 0);
  const auto post = [&](const json& body) { return c.Post("/v1/embeddings", body.dump(), "application/json"); };

  // Text and token ids: "Once upon a time" with BOS is [1, 403, 407, 261, 378].
  auto r = post({{"model", "stories"}, {"input", {"Once upon a time", "The dog ran to the park."}}});
  REQUIRE(r);
  INFO(r->body);
  REQUIRE(r->status == 200);
  const std::vector<std::vector<float>> two = embeddings_of(r->body);
  REQUIRE(two.size() == 2);
  CHECK(json::parse(r->body)["usage"]["prompt_tokens"].get<int>() > 5);
  CHECK_FALSE(close_to(two[0], two[1]));
  r = post({{"model", "stories"}, {"input", {1, 403, 407, 261, 378}}});
  REQUIRE(r);
  REQUIRE(r->status == 200);
  const std::vector<std::vector<float>> ids = embeddings_of(r->body);
  REQUIRE(ids.size() == 1);
  CHECK(close_to(ids[0], two[0]));
  CHECK(json::parse(r->body)["usage"]["prompt_tokens"] == 5);
  r = post({{"model", "stories"}, {"input", "Once upon a time"}, {"encoding_format", "base64"}});
  REQUIRE(r);
  REQUIRE(r->status == 200);
  CHECK(close_to(floats_of_base64(json::parse(r->body)["data"][0]["embedding"].get<std::string>()), two[0]));

  // Refused before a session is taken: too long for a session's context, an id outside the vocabulary, an
  // unknown model.
  r = post({{"model", "stories"}, {"input", std::vector<int>(129, 1)}});
  REQUIRE(r);
  CHECK(r->status == 400);
  CHECK(json::parse(r->body)["error"]["code"] == "context_length_exceeded");
  r = post({{"model", "stories"}, {"input", {1, 512}}});
  REQUIRE(r);
  CHECK(r->status == 400);
  CHECK(json::parse(r->body)["error"]["param"] == "input");
  r = post({{"model", "nope"}, {"input", "x"}});
  REQUIRE(r);
  CHECK(r->status == 404);

  // Two embedding requests of many inputs and a completion started between them, all at once.
  const json many = {{"model", "stories"}, {"input", std::vector<std::string>(48, "Once upon a time there was a little dog.")}};
  int status[3] = {0, 0, 0};
  std::string bodies[3];
  const auto request = [&](int i, const std::string& path, const json& body) {
    httplib::Client own("127.0.0.1", d.port());
    own.set_read_timeout(120, 0);
    if (auto res = own.Post(path, body.dump(), "application/json")) {
      status[i] = res->status;
      bodies[i] = res->body;
    }
  };
  std::vector<std::thread> threads;
  threads.emplace_back(request, 0, "/v1/embeddings", many);
  threads.emplace_back(request, 1, "/v1/chat/completions", greedy_chat());
  threads.emplace_back(request, 2, "/v1/embeddings", many);
  for (std::thread& t : threads) t.join();
  for (int i = 0; i < 3; ++i) {
    INFO("request " << i << ": " << bodies[i]);
    REQUIRE(status[i] == 200);
  }
  CHECK(json::parse(bodies[1])["choices"][0]["tokens"].get<std::vector<int>>() == reference_tokens);
  const std::vector<std::vector<float>> first = embeddings_of(bodies[0]);
  const std::vector<std::vector<float>> second = embeddings_of(bodies[2]);
  REQUIRE(first.size() == 48);
  REQUIRE(second.size() == 48);
  for (size_t i = 0; i < first.size(); ++i) {
    CHECK(close_to(first[i], first[0]));
    CHECK(close_to(second[i], first[0]));
  }
  CHECK(metric(c, "troupe_requests_total{endpoint=\"embeddings\",status=\"200\"}") == 5);
  CHECK(metric(c, "troupe_sessions{model=\"stories\",state=\"busy\"}") == 0);

  // The embeddings context is freed with the model at shutdown.
  d.signal(SIGTERM);
  CHECK(d.wait_exit(std::chrono::seconds(30)) == 0);
  CHECK_THAT(d.log(), Contains("stopped: 0 bytes still held"));
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

TEST_CASE("daemon: a conversation another one pushed out of the only session comes back from the KV cache, with cached_tokens and the metrics saying so", "[http][daemon][prefix]") {
  const auto model = test::model_path("stories260K.gguf");
  if (!model) return;
  test::daemon_process d(stories_config(model->string(), "", 1024, 1));
  httplib::Client c("127.0.0.1", d.port());
  c.set_read_timeout(60, 0);
  const auto complete = [&](const std::string& prompt) {
    const json req{{"model", "stories"}, {"prompt", prompt}, {"temperature", 0}, {"max_tokens", 24}};
    auto r = c.Post("/v1/completions", req.dump(), "application/json");
    REQUIRE(r);
    REQUIRE(r->status == 200);
    return json::parse(r->body);
  };
  const std::string x = "Once upon a time, there was a little girl named Lily. She loved to play outside in the park.";
  const std::string y = "The little dog wanted to play with the ball, but the cat said no.";
  const json x1 = complete(x);  // from scratch
  CHECK(x1["usage"]["prompt_tokens_details"]["cached_tokens"] == 0);
  const json y1 = complete(y);  // takes the only session (its BOS from x's): x is kept in the pool
  CHECK(y1["usage"]["prompt_tokens_details"]["cached_tokens"] == 1);
  const json x2 = complete(x);  // x again: every prompt token but the last from the kept conversation
  const int n_prompt = x1["usage"]["prompt_tokens"];
  const int n_y = y1["usage"]["prompt_tokens"];
  CHECK(x2["usage"]["prompt_tokens_details"]["cached_tokens"] == n_prompt - 1);
  CHECK(x2["choices"][0]["text"] == x1["choices"][0]["text"]);
  CHECK(metric(c, "troupe_prompt_tokens_cached_total") == 1 + n_prompt - 1);
  CHECK(metric(c, "troupe_prompt_tokens_computed_total") == n_prompt + n_y - 1 + 1);
  // The session kept its own BOS; the other n_prompt - 2 came from the kept conversation's cells.
  CHECK(metric(c, "troupe_prefix_reused_tokens_total{model=\"stories\"}") == n_prompt - 2);
  CHECK(metric(c, "troupe_kept_conversations{model=\"stories\"}") >= 1);
}

TEST_CASE("daemon: GET /slots lists each session sequence with the positions it holds and whether it is answering", "[http][daemon][prefix]") {
  const auto model = test::model_path("stories260K.gguf");
  if (!model) return;
  test::daemon_process d(stories_config(model->string(), "", 1024, 2));
  httplib::Client c("127.0.0.1", d.port());
  c.set_read_timeout(60, 0);
  auto before = c.Get("/slots");
  REQUIRE(before);
  REQUIRE(before->status == 200);
  const json req{{"model", "stories"}, {"prompt", "Once upon a time"}, {"temperature", 0}, {"max_tokens", 8}};
  auto r = c.Post("/v1/completions", req.dump(), "application/json");
  REQUIRE(r);
  REQUIRE(r->status == 200);
  auto after = c.Get("/slots");
  REQUIRE(after);
  REQUIRE(after->status == 200);
  const json slots = json::parse(after->body);
  REQUIRE(slots.is_array());
  REQUIRE(slots.size() == 2);  // n_seq_max sequences of the one model
  int holding = 0;
  for (const json& s : slots) {
    CHECK(s["model"] == "stories");
    CHECK(s["n_ctx"] == 1024);  // one pool: a session may take all of it
    CHECK(s["is_processing"] == false);
    // The answered conversation: its prompt and the generated tokens decoded after it.
    const int n = s["n_tokens"];
    if (n >= 5 + 8 - 1 && n <= 5 + 8) ++holding;
  }
  INFO(after->body);
  CHECK(holding == 1);
}

TEST_CASE("troupe bench http's turns and shared-prefix workloads against a real daemon: every answer, and the later turns from the cache", "[http][daemon][prefix][load]") {
  const auto model = test::model_path("stories260K.gguf");
  if (!model) return;
  test::daemon_process d(stories_config(model->string(), "", 2048, 2));
  http::load_params p;
  p.port = d.port();
  p.model = "stories";
  p.workload = "turns";
  p.conversations = 3;
  p.turns = 3;
  p.clients = 2;
  p.system_words = 60;
  p.max_tokens = 8;
  p.temperature = 0;
  const http::load_result r = http::run_load(p);
  INFO(http::format_load_result(p, r));
  CHECK(r.failed == 0);
  CHECK(r.ok == 9);
  CHECK(r.prompt_tokens_new > 0);
  // Turns 2 and 3 take what their conversation held (its own session's, another's or a kept one's).
  CHECK(r.prompt_tokens_cached > 0);
  CHECK(r.prompt_tokens - r.prompt_tokens_cached <= r.prompt_tokens_new + r.prompt_tokens_new / 10 + 9);
  p.workload = "shared-prefix";
  p.clients = 3;
  const http::load_result s = http::run_load(p);
  INFO(http::format_load_result(p, s));
  CHECK(s.failed == 0);
  CHECK(s.ok == 3);
  // Both sessions now hold the common system text's cells, shared rather than copied.
  httplib::Client c("127.0.0.1", d.port());
  const std::vector<double> kv = metrics_at_once(c, {"troupe_kv_cells_shared{model=\"stories\"}", "troupe_kv_cells_used{model=\"stories\"}",
                                                     "troupe_kv_cells_total{model=\"stories\"}"});
  INFO("shared " << kv[0] << ", used " << kv[1] << ", total " << kv[2]);
  CHECK(kv[0] >= 60);  // at least the system text's words
  CHECK(kv[1] > kv[0]);
  CHECK(kv[2] == 2048);
}

TEST_CASE("daemon: one KV pool: a prompt longer than n_ctx / n_seq_max among short chats is admitted, and requests that do not fit beside the others wait for room instead of failing", "[http][daemon][pool]") {
  const auto model = test::model_path("stories260K.gguf");
  if (!model) return;
  // 512 cells, 4 sessions: the long chat (about 400 prompt tokens, far above 512 / 4) and 6 short ones,
  // 48 answer tokens each, reserve more than the pool together: some wait in the queue for the others.
  test::daemon_process d(stories_config(model->string(), "", 512, 4));
  http::load_params p;
  p.port = d.port();
  p.model = "stories";
  p.workload = "long+short";
  p.long_words = 75;  // stories260K's small vocabulary: about 4.5 tokens a word
  p.conversations = 6;
  p.clients = 7;
  p.max_tokens = 48;
  p.temperature = 0;
  const http::load_result r = http::run_load(p);
  INFO(http::format_load_result(p, r));
  CHECK(r.failed == 0);
  CHECK(r.ok == 7);
  CHECK(r.prompt_tokens > 128 + 6 * 5);  // the long prompt is above a quarter of the pool
  httplib::Client c("127.0.0.1", d.port());
  c.set_read_timeout(60, 0);
  // A prompt the pool can never hold is refused at once with both counts.
  std::string huge;
  for (int i = 0; i < 300; ++i) huge += "the little dog ran ";
  const json req{{"model", "stories"}, {"prompt", huge}, {"max_tokens", 8}};
  auto big = c.Post("/v1/completions", req.dump(), "application/json");
  REQUIRE(big);
  CHECK(big->status == 400);
  CHECK_THAT(big->body, Contains("512 tokens"));
  CHECK_THAT(big->body, Contains("context_length_exceeded"));
}

TEST_CASE("daemon: context_shift keeps an answer going past its context (the first tokens exact), and without it the answer ends with length at the limit", "[http][daemon][pool]") {
  const auto model = test::model_path("stories260K.gguf");
  if (!model) return;
  // One session of 96 cells. EOS (2) banned so that the answer runs into the limit.
  const json req{{"model", "stories"}, {"prompt", "Once upon a time"}, {"temperature", 0}, {"max_tokens", 200},
                 {"logit_bias", {{"2", -100}}}, {"return_tokens", true}};
  const auto answer = [&](bool shift) {
    std::string cfg = stories_config(model->string(), "", 96, 1);
    if (shift) cfg += "context_shift = true\n";
    test::daemon_process d(cfg);
    httplib::Client c("127.0.0.1", d.port());
    c.set_read_timeout(120, 0);
    auto r = c.Post("/v1/completions", req.dump(), "application/json");
    REQUIRE(r);
    INFO(r->body);
    REQUIRE(r->status == 200);
    return json::parse(r->body);
  };
  const json off = answer(false);
  CHECK(off["choices"][0]["finish_reason"] == "length");
  CHECK(off["usage"]["completion_tokens"] == 96 - 5);  // the prompt's 5 tokens and the answer fill the 96 cells
  const json on = answer(true);
  CHECK(on["choices"][0]["finish_reason"] == "length");
  CHECK(on["usage"]["completion_tokens"] == 200);  // max_tokens, past the 96 cells
  // Before the first shift the answer is the one without: greedy tokens, bit for bit.
  const auto tokens_on = on["choices"][0]["tokens"].get<std::vector<int>>();
  const auto tokens_off = off["choices"][0]["tokens"].get<std::vector<int>>();
  REQUIRE(tokens_on.size() == 200);
  REQUIRE(tokens_off.size() == 91);
  CHECK(std::equal(tokens_off.begin(), tokens_off.end(), tokens_on.begin()));
  CHECK(std::vector<int>(tokens_on.begin(), tokens_on.begin() + 32) == reference_tokens);
}

TEST_CASE("troupe serve takes llama-server's flags: -c, -np, -ctk, -ctv, -fa, --cache-ram over the configuration file", "[http][daemon][pool]") {
  const auto model = test::model_path("stories260K.gguf");
  if (!model) return;
  test::daemon_process d(stories_config(model->string(), "", 4096, 4),
                         {"-c", "1024", "-np", "2", "-ctk", "f16", "-ctv", "f16", "-fa", "off", "--cache-ram", "0"});
  httplib::Client c("127.0.0.1", d.port());
  c.set_read_timeout(60, 0);
  auto r = c.Post("/v1/chat/completions", greedy_chat().dump(), "application/json");
  REQUIRE(r);
  REQUIRE(r->status == 200);
  // The unfused attention (-fa off) gives the reference tokens as the fused one does.
  CHECK(json::parse(r->body)["choices"][0]["tokens"].get<std::vector<int>>() == reference_tokens);
  auto slots = c.Get("/slots");
  REQUIRE(slots);
  const json s = json::parse(slots->body);
  REQUIRE(s.size() == 2);
  CHECK(s[0]["n_ctx"] == 1024);
  auto models = c.Get("/v1/models");
  REQUIRE(models);
  const json meta = json::parse(models->body)["data"][0]["meta"];
  CHECK(meta["n_ctx"] == 1024);
  CHECK(meta["parallel"] == 2);
  CHECK(meta["cache_type_k"] == "f16");
  CHECK(meta["flash_attn"] == "off");
  CHECK(meta["prompt_cache_mib"] == 0);
  CHECK(meta["context_shift"] == false);
}

TEST_CASE("daemon: a chat_template_file renders the chat, chat_template_kwargs reach it, reasoning is split off plain and streamed, and reasoning_budget ends it", "[http][daemon][reasoning]") {
  const auto model = test::model_path("stories260K.gguf");
  if (!model) return;
  // A template that opens a reasoning block in its generation prompt unless enable_thinking is false, as
  // DeepSeek R1's and Qwen 3's do.
  const auto dir = std::filesystem::temp_directory_path() / ("troupe-template-" + std::to_string(getpid()));
  std::filesystem::create_directories(dir);
  const auto file = dir / "think.jinja";
  std::ofstream(file) << "{{ bos_token }}{% for m in messages %}{{ m.content }}{% endfor %}"
                         "{% if add_generation_prompt and enable_thinking is not false %}<think>\n{% endif %}"
                         "{# a finished block: <think> ... </think> #}";
  const std::string config = "[server]\nport = 0\n[runtime]\nthreads = 2\n[[model]]\nname = \"stories\"\npath = \"" +
                             model->string() + "\"\nchat_template_file = \"" + file.string() + "\"\nthreads = 2\nn_ctx = 1024\n";
  test::daemon_process d(config);
  httplib::Client c("127.0.0.1", d.port());
  c.set_read_timeout(60, 0);
  const auto ask = [&](json body) {
    auto r = c.Post("/v1/chat/completions", body.dump(), "application/json");
    REQUIRE(r);
    INFO(r->body);
    REQUIRE(r->status == 200);
    return json::parse(r->body);
  };
  json body = greedy_chat(24);
  // Thinking off by the template's switch: the prompt is the plain chat, whose answer is the reference.
  body["chat_template_kwargs"] = {{"enable_thinking", false}};
  const json off = ask(body);
  CHECK(off["choices"][0]["tokens"].get<std::vector<int>>() == std::vector<int>(reference_tokens.begin(), reference_tokens.begin() + 24));
  CHECK_FALSE(off["choices"][0]["message"].contains("reasoning_content"));
  body.erase("chat_template_kwargs");
  body["reasoning_budget"] = 0;  // the same switch
  CHECK(ask(body)["choices"][0]["tokens"] == off["choices"][0]["tokens"]);
  body.erase("reasoning_budget");
  // Thinking on: the prompt ends inside the block; the model never closes it, so all of it is reasoning...
  body["reasoning_format"] = "none";
  const json inline_ = ask(body);
  const std::string raw = inline_["choices"][0]["message"]["content"];
  CHECK_FALSE(inline_["choices"][0]["message"].contains("reasoning_content"));
  body.erase("reasoning_format");
  const json split = ask(body);
  CHECK(split["choices"][0]["message"]["reasoning_content"] == raw.substr(raw.find_first_not_of(" \n"), raw.find_last_not_of(" \n") + 1 - raw.find_first_not_of(" \n")));
  CHECK(split["choices"][0]["message"]["content"] == "");
  CHECK(split["choices"][0]["tokens"] == inline_["choices"][0]["tokens"]);
  // ...unless the budget ends it: after 6 tokens "</think>" is forced, and the answer goes on as content.
  body["reasoning_budget"] = 6;
  body["max_tokens"] = 30;
  const json budget = ask(body);
  const auto tokens = budget["choices"][0]["tokens"].get<std::vector<int>>();
  const auto free_tokens = split["choices"][0]["tokens"].get<std::vector<int>>();
  REQUIRE(tokens.size() > 6);
  CHECK(std::equal(tokens.begin(), tokens.begin() + 6, free_tokens.begin()));
  const std::string reasoning = budget["choices"][0]["message"]["reasoning_content"];
  const std::string content = budget["choices"][0]["message"]["content"];
  CHECK(raw.substr(raw.find_first_not_of(" \n")).rfind(reasoning, 0) == 0);  // the first 6 tokens' text
  CHECK_FALSE(content.empty());
  CHECK(content.find("</think>") == std::string::npos);
  // Streamed: reasoning_content deltas, then content deltas, the same texts.
  body["stream"] = true;
  auto r = c.Post("/v1/chat/completions", body.dump(), "application/json");
  REQUIRE(r);
  REQUIRE(r->status == 200);
  std::string streamed_reasoning, streamed_content;
  bool content_began = false, reasoning_after_content = false;
  for (const std::string& e : sse_events(r->body)) {
    if (e == "[DONE]") break;
    const json delta = json::parse(e)["choices"][0]["delta"];
    if (delta.contains("reasoning_content")) {
      streamed_reasoning += delta["reasoning_content"].get<std::string>();
      reasoning_after_content = reasoning_after_content || content_began;
    }
    if (delta.contains("content") && delta["content"].is_string()) {
      streamed_content += delta["content"].get<std::string>();
      content_began = content_began || !delta["content"].get<std::string>().empty();
    }
  }
  CHECK(streamed_reasoning == reasoning);
  CHECK(streamed_content == content);
  CHECK_FALSE(reasoning_after_content);

  // Anthropic's Messages API: the reasoning is a thinking block (thinking.budget_tokens the budget), streamed
  // as a thinking block's deltas before the text block's.
  json m = {{"model", "stories"},
            {"max_tokens", 30},
            {"temperature", 0},
            {"messages", {{{"role", "user"}, {"content", "Once upon a time"}}}},
            {"thinking", {{"type", "enabled"}, {"budget_tokens", 6}}}};
  auto mr = c.Post("/v1/messages", m.dump(), "application/json");
  REQUIRE(mr);
  REQUIRE(mr->status == 200);
  const json mj = json::parse(mr->body);
  REQUIRE(mj["content"].size() == 2);
  CHECK(mj["content"][0]["type"] == "thinking");
  CHECK(mj["content"][0]["thinking"] == reasoning);
  CHECK(mj["content"][1] == json({{"type", "text"}, {"text", content}}));
  CHECK(mj["stop_reason"] == "max_tokens");
  m["stream"] = true;
  auto ms = c.Post("/v1/messages", m.dump(), "application/json");
  REQUIRE(ms);
  REQUIRE(ms->status == 200);
  std::vector<std::string> kinds;
  std::string thinking, text;
  for (const std::string& e : sse_events(ms->body)) {
    const json ev = json::parse(e);
    if (ev["type"] == "content_block_start") kinds.push_back(ev["content_block"]["type"]);
    if (ev["type"] == "content_block_delta" && ev["delta"]["type"] == "thinking_delta") thinking += ev["delta"]["thinking"].get<std::string>();
    if (ev["type"] == "content_block_delta" && ev["delta"]["type"] == "text_delta") text += ev["delta"]["text"].get<std::string>();
  }
  CHECK(kinds == std::vector<std::string>{"thinking", "text"});
  CHECK(thinking == reasoning);
  CHECK(text == content);
  std::filesystem::remove_all(dir);
}

TEST_CASE("daemon: SmolLM2's answers through its own Jinja template are the tokens of the built-in ChatML prompt, plain and with tools", "[http][daemon][chat_prompt]") {
  const auto path = test::smollm2_path();
  if (!path) return;
  // The prompt as troupe wrote it before templates were run (the ChatML family) and its greedy answer.
  auto m = llm::model::load(*path);
  const llm::vocab v(m->meta());
  const llm::chat_template family(m->meta());
  llm::llm_context ctx(*m, {.n_ctx = 1024, .n_threads = 2});
  llm::generator gen(ctx, v);
  const std::vector<llm::chat_message> chat = {{"system", "You are terse."}, {"user", "Name three colours."}};
  const llm::generate_result want = gen.generate(v.tokenize(family.apply(chat, true), true, true), llm::generate_params::greedy(24));
  REQUIRE_FALSE(want.tokens.empty());

  test::daemon_process d("[server]\nport = 0\n[runtime]\nthreads = 2\n[[model]]\nname = \"smollm2\"\npath = \"" + path->string() +
                         "\"\nthreads = 2\nn_ctx = 1024\nn_seq_max = 1\n");
  httplib::Client c("127.0.0.1", d.port());
  c.set_read_timeout(120, 0);
  json body = {{"model", "smollm2"},
               {"messages", {{{"role", "system"}, {"content", "You are terse."}}, {{"role", "user"}, {"content", "Name three colours."}}}},
               {"temperature", 0},
               {"max_tokens", 24},
               {"return_tokens", true}};
  auto r = c.Post("/v1/chat/completions", body.dump(), "application/json");
  REQUIRE(r);
  REQUIRE(r->status == 200);
  const json j = json::parse(r->body);
  CHECK(j["choices"][0]["tokens"].get<std::vector<int>>() == std::vector<int>(want.tokens.begin(), want.tokens.end()));
  CHECK(j["choices"][0]["message"]["content"] == want.text);
  CHECK(j["usage"]["prompt_tokens"] == want.n_prompt);
  auto models = c.Get("/v1/models");
  REQUIRE(models);
  const json meta = json::parse(models->body)["data"][0]["meta"];
  CHECK(meta["chat_template"] == "jinja");
  CHECK(meta["tool_call_format"] == "hermes");
  CHECK(meta["reasoning"].is_null());

  // With tools (SmolLM2's template has none, so the Hermes instructions go into the system message as
  // before): the prompt is the one the daemon built before templates were run.
  const std::string tools_json = R"([{"type": "function", "function": {"name": "get_weather", "description": "Weather of a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}])";
  const std::vector<llm::tool_function> fns = {{"get_weather", "Weather of a city",
                                                // in the key order the test's body sends (nlohmann::json sorts keys)
                                                R"({"properties":{"city":{"type":"string"}},"required":["city"],"type":"object"})"}};
  std::vector<llm::chat_message> with_tools = chat;
  with_tools[0].content += "\n\n" + llm::tools_prompt(llm::tool_syntax::hermes, fns);
  gen.reset();
  const llm::generate_result want_tools =
      gen.generate(v.tokenize(family.apply(with_tools, true), true, true), llm::generate_params::greedy(24));
  body["tools"] = json::parse(tools_json);
  body["tool_choice"] = "none";  // no grammar: the same free answer
  auto rt = c.Post("/v1/chat/completions", body.dump(), "application/json");
  REQUIRE(rt);
  REQUIRE(rt->status == 200);
  const json jt = json::parse(rt->body);
  CHECK(jt["usage"]["prompt_tokens"] == json::parse(r->body)["usage"]["prompt_tokens"]);  // tool_choice none: no tools in the prompt
  body["tool_choice"] = "auto";
  auto ra = c.Post("/v1/chat/completions", body.dump(), "application/json");
  REQUIRE(ra);
  REQUIRE(ra->status == 200);
  const json ja = json::parse(ra->body);
  CHECK(ja["usage"]["prompt_tokens"] == want_tools.n_prompt);
  // The lazy grammar changes nothing until a call opens.
  if (want_tools.text.find("<tool_call>") == std::string::npos) {
    CHECK(ja["choices"][0]["tokens"].get<std::vector<int>>() == std::vector<int>(want_tools.tokens.begin(), want_tools.tokens.end()));
  }
}

TEST_CASE("daemon: llama-server's /tokenize, /detokenize, /apply-template and /props, and each model's state in /v1/models", "[http][daemon][utility]") {
  const auto model = test::model_path("stories260K.gguf");
  if (!model) return;
  test::daemon_process d(stories_config(model->string()));
  httplib::Client c("127.0.0.1", d.port());
  c.set_read_timeout(60, 0);
  const auto post = [&](const std::string& path, const json& body, int status = 200) {
    auto r = c.Post(path, body.dump(), "application/json");
    REQUIRE(r);
    INFO(r->body);
    REQUIRE(r->status == status);
    return json::parse(r->body);
  };
  // "Once upon a time" with BOS is the reference prompt of 5 tokens; its answer detokenizes to the reference text.
  const json with_bos = post("/tokenize", {{"content", "Once upon a time"}, {"add_special", true}});
  REQUIRE(with_bos["tokens"].size() == 5);
  CHECK(with_bos["tokens"][0] == 1);
  const json plain = post("/tokenize", {{"content", "Once upon a time"}});
  CHECK(plain["tokens"] == json(std::vector<json>(with_bos["tokens"].begin() + 1, with_bos["tokens"].end())));
  const json pieces = post("/tokenize", {{"content", "Once upon a time"}, {"with_pieces", true}, {"model", "stories"}});
  std::string joined;
  for (const json& t : pieces["tokens"]) {
    CHECK(t["id"].is_number_integer());
    joined += t["piece"].get<std::string>();
  }
  CHECK(joined == " Once upon a time");
  CHECK(post("/detokenize", {{"tokens", reference_tokens}})["content"] == reference_text);
  CHECK(post("/detokenize", {{"tokens", {100000}}}, 400)["error"]["param"] == "tokens");
  CHECK(post("/tokenize", {{"content", 5}}, 400)["error"]["param"] == "content");
  CHECK(post("/tokenize", {{"content", "x"}, {"model", "nope"}}, 404)["error"]["code"] == "model_not_found");
  // The chat template's prompt (stories has the raw family: the contents joined by newlines).
  CHECK(post("/apply-template", {{"messages", {{{"role", "user"}, {"content", "Once upon"}}, {{"role", "assistant"}, {"content", "a time"}}}}})["prompt"] ==
        "Once upon\na time");
  auto props = c.Get("/props");
  REQUIRE(props);
  REQUIRE(props->status == 200);
  const json pj = json::parse(props->body);
  CHECK(pj["total_slots"] == 4);
  CHECK(pj["default_generation_settings"]["n_ctx"] == 4096);
  CHECK(pj["chat_template_family"] == "raw");
  CHECK(pj["model_path"] == model->string());
  auto models = c.Get("/v1/models");
  REQUIRE(models);
  CHECK(json::parse(models->body)["data"][0]["meta"]["state"] == "loaded");
}
