// The daemon when things go wrong, a real `troupe serve` process on 127.0.0.1: errors in the OpenAI shape, a
// full queue (503), clients that disconnect mid-answer (raw sockets, so the test drops the connection), a
// SIGTERM drain, bad configurations, and a session whose streamed answer was abandoned.
#include <catch2/catch.hpp>

#include <httplib.h>
#include <nlohmann/json.hpp>

#include <filesystem>
#include <fstream>
#include <string>

#include "tests/http/daemon_fixture.h"
#include "tests/http/daemon_process.h"
#include "tests/http/stories_daemon.h"
#include "tests/test_models.h"

using namespace troupe;
using namespace troupe::test;
using json = nlohmann::json;
using Catch::Matchers::Contains;

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
