// POST /v1/embeddings: OpenAI's request (input: a string, strings, token ids or lists of them;
// encoding_format float or base64) answered with each input's normalized pooled embedding
// (llm/embedding.h), computed on the model's own embeddings context.
#include <algorithm>
#include <climits>
#include <cstring>
#include <string>
#include <vector>

#include "net/http/detail/daemon_internals.h"
#include "net/http/openai.h"
#include "net/http/daemon.h"
#include "net/http/session_pool.h"
#include "llm/embedding.h"
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

// Brings the accountant's record of a model's embeddings context to what it holds now (ctx null: nothing).
void account_embeddings(engine& eng, model_slots& ms, const llm::llm_context* ctx) {
  memory_ledger now;
  if (ctx != nullptr) ctx->account(now);
  std::map<buffer_type_key, std::array<int64_t, 3>> delta;
  const auto add = [&](const memory_ledger& l, int sign) {
    for (const auto& [key, u] : l.entries()) {
      auto& d = delta[key];
      for (uint8_t k = 0; k < 3; ++k) d[k] += sign * static_cast<int64_t>(u[static_cast<memory_kind>(k)]);
    }
  };
  add(now, 1);
  add(ms.embed_reported, -1);
  try {
    eng.record_memory(delta, "embeddings:" + ms.config.name);
    ms.embed_reported = now;
  } catch (const std::exception& e) {
    TROUPE_LOG(warn, "embeddings: model '" << ms.config.name << "': memory not recorded: " << e.what());
  }
}

}  // namespace

void daemon::release_embeddings() {
  for (auto& ms : models_) {
    std::lock_guard l(ms->embed_m);
    if (!ms->embed_ctx) continue;
    ms->embed_ctx.reset();
    ms->embed_model.reset();
    account_embeddings(eng_, *ms, nullptr);
  }
}

void daemon::embeddings(const front::request& req, front::response& res) {
  try {
    if (stopping_.load()) throw api_error(503, "unavailable_error", "the server is shutting down");
    const embedding_request r = parse_embedding_request(req.body);
    const auto it = std::find_if(models_.begin(), models_.end(), [&](const auto& m) { return m->config.name == r.model; });
    if (it == models_.end()) {
      throw api_error(404, "invalid_request_error", "the model '" + r.model + "' does not exist", "model", "model_not_found");
    }
    model_slots& ms = **it;
    if (!ms.loaded.load()) throw api_error(503, "unavailable_error", "the model '" + r.model + "' is not loaded");
    std::shared_ptr<const actors::loaded_model> lm;
    {
      std::lock_guard l(ms.m);
      lm = ms.model;
    }
    const llm::vocab& v = *lm->vocab;
    std::vector<std::vector<int32_t>> inputs = r.token_ids;
    for (const std::string& t : r.texts) inputs.push_back(v.tokenize(t, /*add_special=*/true));
    for (size_t i = 0; i < inputs.size(); ++i) {
      for (const int32_t id : inputs[i]) {
        if (id >= v.n_tokens()) {
          throw bad_request("'input' names token " + std::to_string(id) + ", outside the vocabulary (0.." +
                                std::to_string(v.n_tokens() - 1) + ")",
                            "input");
        }
      }
    }
    json data = json::array();
    int64_t n_tokens = 0;
    {
      std::lock_guard l(ms.embed_m);
      if (!ms.embed_ctx || ms.embed_model != lm) {
        ms.embed_ctx.reset();
        account_embeddings(eng_, ms, nullptr);
        const uint32_t n_ctx = lm->settings.n_ctx_seq;
        ms.embed_ctx = std::make_unique<llm::llm_context>(
            *lm->model, llm::context_params{.n_ctx = n_ctx, .n_batch = n_ctx, .n_ubatch = std::min<uint32_t>(n_ctx, 512),
                                            .n_threads = lm->settings.n_threads, .embeddings = true});
        ms.embed_model = lm;
        account_embeddings(eng_, ms, ms.embed_ctx.get());
      }
      for (size_t i = 0; i < inputs.size(); ++i) {
        if (inputs[i].size() > ms.embed_ctx->params().n_ctx) {
          throw api_error(400, "invalid_request_error",
                          "input " + std::to_string(i) + " has " + std::to_string(inputs[i].size()) +
                              " tokens; this model's embeddings take at most " + std::to_string(ms.embed_ctx->params().n_ctx),
                          "input", "context_length_exceeded");
        }
        const std::vector<float> e = llm::embed(*ms.embed_ctx, inputs[i]);
        n_tokens += static_cast<int64_t>(inputs[i].size());
        data.push_back({{"object", "embedding"}, {"index", i}, {"embedding", r.base64 ? json(base64(e)) : json(e)}});
      }
      account_embeddings(eng_, ms, ms.embed_ctx.get());  // the compute buffers grow for a long input
    }
    const json out = {{"object", "list"},
                      {"data", data},
                      {"model", r.model},
                      {"usage", {{"prompt_tokens", n_tokens}, {"total_tokens", n_tokens}}}};
    res.set_content(dump(out), "application/json");
  } catch (const api_error& e) {
    detail::send_error(res, e);
  } catch (const std::exception& e) {
    detail::send_error(res, api_error(500, "server_error", std::string("embeddings: ") + e.what()));
  }
}

}  // namespace troupe::http
