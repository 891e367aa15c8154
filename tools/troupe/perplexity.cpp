// troupe perplexity: perplexity of a model over a text file, with the memory breakdown at the end.
//
//   troupe perplexity -m MODEL -f TEXT [-c 512] [-t THREADS] [-ngl N] [--device A,B,...]
#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>

#include "llm/perplexity.h"
#include "tools/common/offload_options.h"
#include "tools/troupe/commands.h"

namespace troupe::cli {
namespace {

struct ppl_options {
  std::string model, file;
  uint32_t n_ctx = 512;
  int n_threads = 0;
  std::string cache_type_k = "f16", cache_type_v = "f16";
  llm::offload_request offload;
};

int run_perplexity(const ppl_options& o) {
  std::ifstream in(o.file, std::ios::binary);
  if (!in) {
    std::fprintf(stderr, "troupe perplexity: cannot read '%s'\n", o.file.c_str());
    return 1;
  }
  std::ostringstream text;
  text << in.rdbuf();
  const auto placement = llm::offload_devices(o.offload, o.model);
  auto m = llm::model::load(o.model, {.devices = placement, .overrides = llm::cpu_moe_overrides(o.offload)});
  llm::vocab v(m->meta());
  // Every token of a chunk has logits: the compute memory reserved for all of a micro-batch's rows.
  const auto type_k = llm::kv_cache_type_named(o.cache_type_k), type_v = llm::kv_cache_type_named(o.cache_type_v);
  if (!type_k || !type_v) {
    std::fprintf(stderr, "troupe perplexity: -ctk / -ctv must be one of %s\n", llm::kv_cache_type_names());
    return 1;
  }
  llm::llm_context ctx(*m, {.n_ctx = o.n_ctx, .n_batch = o.n_ctx, .type_k = *type_k, .type_v = *type_v,
                            .n_threads = o.n_threads, .n_outputs_reserved = llm::context_params{}.n_ubatch});
  const auto tokens = v.tokenize(text.str(), true);
  std::fprintf(stderr, "%s: %zu tokens, chunks of %u\n", o.file.c_str(), tokens.size(), ctx.params().n_ctx);
  const llm::perplexity_result r = llm::perplexity(ctx, v, tokens, o.n_ctx);
  std::printf("perplexity: %.4f over %llu tokens in %u chunks of %u (%.2f s, %.1f tokens/s)\n", r.ppl,
              static_cast<unsigned long long>(r.n_scored), r.n_chunks, r.chunk_size, r.seconds,
              static_cast<double>(r.n_chunks) * r.chunk_size / r.seconds);
  memory_ledger ledger;
  m->weights().account(ledger);
  ctx.account(ledger);
  // A row for every device that held layers and has memory of its own (host memory is the Host row).
  std::vector<device_memory_info> devices;
  for (const auto& [dev, layers] : placement) {
    if (dev == nullptr || dev->buffer_type().is_host()) continue;
    const device_memory mem = dev->memory();
    devices.push_back({std::string(dev->name()), dev->description(), mem.total, mem.free});
  }
  std::printf("%s", format_memory_table(ledger, devices).c_str());
  return 0;
}

}  // namespace

command_fn add_perplexity(CLI::App& app) {
  auto o = std::make_shared<ppl_options>();
  app.add_option("-m,--model", o->model, "GGUF model file")->required();
  app.add_option("-f,--file", o->file, "text file")->required();
  app.add_option("-c,--ctx-size", o->n_ctx, "tokens per chunk (half of each is scored)");
  app.add_option("-t,--threads", o->n_threads, "CPU threads (0: all)");
  app.add_option("--cache-type-k", o->cache_type_k, "(-ctk) KV cache type of K (f16, f32, bf16, q8_0, q4_0, q4_1, q5_0, q5_1, iq4_nl)");
  app.add_option("--cache-type-v", o->cache_type_v, "(-ctv) KV cache type of V (the same names)");
  add_offload_options(app, o->offload);
  return [o] { return run_perplexity(*o); };
}

}  // namespace troupe::cli
