// A bounded HTTP load test against a running daemon (loopback): `clients` threads, each with its own
// keep-alive connection, send completion requests until `requests` have been sent in all; every answer is
// checked (status 200, a JSON body with choices and usage, at least one token). Reports latency
// percentiles and throughput.
//
//   load_result r = run_load({.port = 8080, .model = "stories", .clients = 16, .requests = 200});
//   std::cout << format_load_result(r);     // requests, failures, p50 / p99 latency, tokens/s
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace troupe::http {

struct load_params {
  std::string host = "127.0.0.1";
  int port = 8080;
  std::string model;
  std::string api_key;
  int clients = 16;
  int requests = 200;
  int max_tokens = 32;
  bool chat = true;
  bool stream = false;
  float temperature = 0.8f;  // request i uses seed i
  std::string prompt = "Once upon a time";
  int timeout_s = 300;       // per request
};

struct load_result {
  int ok = 0;
  int failed = 0;
  std::vector<std::string> errors;  // the first few failures, with their request number
  double wall_seconds = 0;
  double p50 = 0, p90 = 0, p99 = 0, max = 0;  // request latency, seconds
  double ttft_p50 = 0;                        // streaming only: time to the first piece
  uint64_t completion_tokens = 0;
  uint64_t prompt_tokens = 0;
  double tokens_per_second = 0;               // completion tokens / wall time
  double requests_per_second = 0;
};

load_result run_load(const load_params& p);
std::string format_load_result(const load_params& p, const load_result& r);

}  // namespace troupe::http
