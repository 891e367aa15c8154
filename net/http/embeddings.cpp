// POST /v1/embeddings: OpenAI's request (input: a string, strings, token ids or lists of them;
// encoding_format float or base64) answered with each input's normalized pooled embedding
// (llm/embedding.h). The request takes a session of the model like a completion (a free one, or a place in
// the queue); the model's decoder actor computes each input on its embeddings context.
#include <algorithm>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "net/http/detail/daemon_internals.h"
#include "net/http/openai.h"
#include "net/http/daemon.h"
#include "net/http/session_pool.h"
#include "runtime/log.h"

namespace troupe::http {
namespace {

std::string base64(const std::vector<float>& v) {
  static const char table[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  std::string bytes(v.size() * sizeof(float), '\0');
  std::memcpy(bytes.data(), v.data(), bytes.size());  // little-endian float32, as OpenAI's base64
  std::string out;
  out.reserve((bytes.size() + 2) / 3 * 4);
  for (size_t i = 0; i < bytes.size(); i += 3) {
    const auto b0 = static_cast<uint8_t>(bytes[i]);
    const auto b1 = i + 1 < bytes.size() ? static_cast<uint8_t>(bytes[i + 1]) : 0;
    const auto b2 = i + 2 < bytes.size() ? static_cast<uint8_t>(bytes[i + 2]) : 0;
    out += table[b0 >> 2];
    out += table[((b0 & 3) << 4) | (b1 >> 4)];
    out += i + 1 < bytes.size() ? table[((b1 & 15) << 2) | (b2 >> 6)] : '=';
    out += i + 2 < bytes.size() ? table[b2 & 63] : '=';
  }
  return out;
}

// The embedding on the leased session; once more on a fresh session when its actor is gone (the model was
// loaded again after a peer reconnected, say), as a completion's answer is retried.
std::vector<float> embed_on(engine& eng, lease& l, const std::vector<int32_t>& tokens, bool& retried) {
  for (;;) {
    try {
      return l.get().embed(tokens);
    } catch (const actors::request_error& e) {
      if (!retried && e.is(actors::errc::down)) {
        retried = true;
        try {
          l.replace(std::make_unique<session>(eng.open_session(l.model())));
          TROUPE_LOG(info, "http: embeddings: " << e.what() << "; retrying on a new session");
          continue;
        } catch (const std::exception&) {
          // the model itself is down: the first error says why
        }
      }
      if (e.is(actors::errc::down) || e.is(actors::errc::busy)) l.broken();
      throw;
    }
  }
}

}  // namespace

void daemon::embeddings(const front::request& req, front::response& res) {
  try {
    res.set_content(dump(embed(parse_embedding_request(req.body))), "application/json");
  } catch (const api_error& e) {
    detail::send_error(res, e);
  }
}

json daemon::embed(const embedding_request& r) {
  try {
    if (stopping_.load()) throw api_error(503, "unavailable_error", "the server is shutting down");
    const model_use use = use_model(r.model);  // held loaded until the answer is made
    model_slots& ms = use.slots();
    const std::shared_ptr<const actors::loaded_model>& lm = use.model();
    // Every input is checked before a session is taken: the ids exist and fit a session's context.
    const llm::vocab& v = *lm->vocab;
    std::vector<std::vector<int32_t>> inputs = r.token_ids;
    for (const std::string& t : r.texts) inputs.push_back(v.tokenize(t, /*add_special=*/true));
    if (r.messages.is_array()) {
      try {
        inputs.push_back(llm::chat_tokens(v, lm->chat->render(r.messages, nullptr, false)));
      } catch (const llm::chat_prompt_error& e) {
        throw bad_request(e.what(), "messages");
      }
    }
    const uint32_t n_ctx = lm->settings.embedding_cells();
    for (size_t i = 0; i < inputs.size(); ++i) {
      for (const int32_t id : inputs[i]) {
        if (id >= v.n_tokens()) {
          throw bad_request("'input' names token " + std::to_string(id) + ", outside the vocabulary (0.." +
                                std::to_string(v.n_tokens() - 1) + ")",
                            "input");
        }
      }
      if (inputs[i].size() > n_ctx) {
        throw api_error(400, "invalid_request_error",
                        "input " + std::to_string(i) + " has " + std::to_string(inputs[i].size()) +
                            " tokens; this model's embeddings take at most " + std::to_string(n_ctx),
                        "input", "context_length_exceeded");
      }
    }
    const detail::in_flight_count counted(metrics_);
    std::unique_ptr<lease> claim = acquire(eng_, ms, metrics_, cfg_.server, stopping_);
    // One input per message: the model's other sessions decode between two inputs of a long list.
    json data = json::array();
    int64_t n_tokens = 0;
    bool retried = false;
    for (size_t i = 0; i < inputs.size(); ++i) {
      const std::vector<float> e = embed_on(eng_, *claim, inputs[i], retried);
      n_tokens += static_cast<int64_t>(inputs[i].size());
      data.push_back({{"object", "embedding"}, {"index", i}, {"embedding", r.base64 ? json(base64(e)) : json(e)}});
    }
    claim.reset();  // the session is free before the client has the answer
    return {{"object", "list"}, {"data", data}, {"model", r.model}, {"usage", {{"prompt_tokens", n_tokens}, {"total_tokens", n_tokens}}}};
  } catch (const actors::request_error& e) {
    TROUPE_LOG(warn, "http: embeddings: " << e.what());
    throw detail::error_for(e);
  } catch (const api_error&) {
    throw;
  } catch (const std::exception& e) {
    throw api_error(500, "server_error", std::string("embeddings: ") + e.what());
  }
}

}  // namespace troupe::http
