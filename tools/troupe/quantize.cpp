// troupe quantize: rewrite a model with its weight matrices in another type.
//
//   troupe quantize IN.gguf OUT.gguf TYPE [THREADS]
#include <cstdio>
#include <string>

#include "backends/cpu/cpu_backend.h"
#include "loader/quantize.h"
#include "tools/troupe/commands.h"

namespace troupe::cli {
namespace {

struct quantize_options {
  std::string in, out, type;
  int n_threads = 0;
};

int run_quantize(const quantize_options& o) {
  const auto recipe = quantize_recipe::parse(o.type);
  if (!recipe) {
    std::fprintf(stderr, "troupe quantize: unknown type '%s'\n", o.type.c_str());
    return 1;
  }
  const int threads = o.n_threads > 0 ? o.n_threads : cpu::hardware_threads();
  const quantize_report r = quantize_model(o.in, o.out, *recipe, threads);
  std::printf("%s -> %s: %zu tensors to %s, %zu kept, %zu with a fallback type; %.2f MiB -> %.2f MiB\n", o.in.c_str(),
              o.out.c_str(), r.n_quantized, o.type.c_str(), r.n_kept, r.fallbacks.size(),
              static_cast<double>(r.bytes_in) / (1 << 20), static_cast<double>(r.bytes_out) / (1 << 20));
  for (const auto& f : r.fallbacks) {
    std::printf("  %s: rows of %lld do not fit the blocks of the type wanted, used %s\n", f.tensor.c_str(),
                static_cast<long long>(f.row_length), std::string(type_name(f.used)).c_str());
  }
  return 0;
}

}  // namespace

command_fn add_quantize(CLI::App& app) {
  auto o = std::make_shared<quantize_options>();
  app.add_option("input", o->in, "source GGUF model")->required();
  app.add_option("output", o->out, "GGUF model to write")->required();
  app.add_option("type", o->type, "q4_0, q4_1, q5_0, q5_1, q8_0, q2_K, q3_K, q4_K, q5_K, q6_K, iq4_nl, iq4_xs, tq1_0, tq2_0 (ternary-trained models), mxfp4, f16, bf16, f32, or a mix: q4_K_M, q5_K_M")->required();
  app.add_option("threads", o->n_threads, "threads (default: all)");
  return [o] { return run_quantize(*o); };
}

}  // namespace troupe::cli
