// What the daemon's integration tests share: a configuration serving stories260K (../shared/models) as
// "stories", its greedy reference answer, and reading one value of /metrics.
#pragma once

#include <httplib.h>
#include <nlohmann/json.hpp>

#include <cstdint>
#include <string>
#include <vector>

namespace troupe::test {

// Reference facts (../shared/models/README.md): "Once upon a time" with BOS, 32 greedy tokens.
inline const std::vector<int> reference_tokens = {432, 383, 286, 261, 376, 298, 315, 421, 395, 317, 426, 338, 401, 396, 267, 337,
                                           410, 408, 419, 292, 411, 322, 265, 282, 295, 433, 426, 385, 328, 432, 358, 394};
inline const std::string reference_text =
    ", there was a little girl named Lily. She loved to play outside in the park. One day, she saw";

inline std::string stories_config(const std::string& model, const std::string& extra_server = "", uint32_t n_ctx = 4096,
                           uint32_t parallel = 4, uint32_t n_ctx_seq = 0) {
  return "[server]\nport = 0\nshutdown_grace_s = 5\n" + extra_server +
         "\n[runtime]\nthreads = 2\n"
         "[[model]]\nname = \"stories\"\npath = \"" + model + "\"\nchat_template = \"raw\"\nthreads = 2\nn_ctx = " +
         std::to_string(n_ctx) + "\nn_seq_max = " + std::to_string(parallel) + "\nn_ctx_seq = " + std::to_string(n_ctx_seq) + "\n";
}

inline nlohmann::json greedy_chat(int max_tokens = 32) {
  return nlohmann::json{{"model", "stories"},
              {"messages", nlohmann::json::array({{{"role", "user"}, {"content", "Once upon a time"}}})},
              {"temperature", 0},
              {"max_tokens", max_tokens},
              {"return_tokens", true}};
}

// A value of the daemon's /metrics ("name{labels}" exactly as printed), or -1.
inline double metric(httplib::Client& c, const std::string& name) {
  auto r = c.Get("/metrics");
  if (!r || r->status != 200) return -1;
  const size_t at = r->body.find("\n" + name + " ");
  if (at == std::string::npos) return -1;
  return std::stod(r->body.substr(at + name.size() + 2));
}

}  // namespace troupe::test
