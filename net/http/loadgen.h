// A bounded HTTP load test against a running daemon, or any OpenAI-compatible server (llama-server):
// `clients` threads, each with its own keep-alive connection; every answer is checked (status 200, a JSON
// body with choices and usage, at least one token). Workloads:
//   load           `requests` completions of short prompts (the prompt, then a few words of its own each):
//                  latency percentiles and throughput.
//   turns          `conversations` chats of `turns` turns each, every conversation with its own system text
//                  of about `system_words` words; turn t of every conversation, then turn t + 1 (so with
//                  more conversations than the server's sequences, a conversation comes back after others
//                  took its slot). Streamed: time to the first piece of turn 1 and of the later turns.
//   shared-prefix  `clients` chats at once behind one common system text of `system_words` words, each
//                  with its own question: time to the first piece.
//   long+short     one chat whose message is a text of `long_words` words (about 6,000 tokens by default)
//                  and `conversations` short chats, all sent at once: whether every one is admitted, the
//                  long one's time to the first piece and the short ones'.
// Both report the prompt tokens the server took from its cache (usage.prompt_tokens_details.cached_tokens)
// and, for turns, the tokens that no earlier request had.
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
  std::string workload = "load";  // "load", "turns", "shared-prefix" or "long+short"
  int conversations = 8;     // turns; long+short: the short chats
  int turns = 4;             // turns
  int system_words = 900;    // turns (each conversation's), shared-prefix (the common one)
  int long_words = 4900;     // long+short: the long message
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
  // turns and shared-prefix (streamed): time to the first piece
  double ttft_first_mean = 0;   // turns: turn 1 (the system text is new); long+short: the long chat
  double ttft_later_mean = 0;   // turns: turns 2.. ; shared-prefix: every request; long+short: the short ones
  double ttft_later_p50 = 0, ttft_later_p95 = 0;
  uint64_t prompt_tokens_cached = 0;  // the server's usage.prompt_tokens_details.cached_tokens, summed
  uint64_t prompt_tokens_new = 0;     // turns: tokens no earlier request had (turn 1's prompt, then each
                                      // turn's prompt minus the previous turn's prompt and answer)
};

load_result run_load(const load_params& p);
std::string format_load_result(const load_params& p, const load_result& r);

}  // namespace troupe::http
