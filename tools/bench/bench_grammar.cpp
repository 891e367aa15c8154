// Grammar engine benchmarks: the cost of one step's vocabulary mask (grammar_matcher::allowed_tokens),
// the work constrained sampling adds to every generated token.
//
//   ./build/tools/bench/bench_grammar [--benchmark_filter=...]
//
// - mask/smollm2/<state>: SmolLM2's 49,152-token vocabulary (models/, from scripts/fetch-model) under the
//   json_object grammar, in four states of an answer: at the start ("{" and blanks only), after '{' (a key
//   or '}'), inside a string value (nearly every piece may follow: the worst case) and inside a number.
// - mask/262k/<state>: the same on a 262,144-token byte-level vocabulary, SmolLM2's pieces plus pairs of
//   them (the size of Gemma 3's), written as a GGUF vocabulary in memory.
// The "allowed" counter is the number of tokens the mask allows.
#include <benchmark/benchmark.h>

#include <filesystem>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "loader/gguf.h"
#include "loader/gguf_writer.h"
#include "llm/grammar.h"
#include "llm/vocab.h"

using namespace troupe;
using namespace troupe::llm;

namespace {

const std::filesystem::path smollm2 = std::filesystem::path(TROUPE_FETCHED_MODEL_DIR) / "SmolLM2-135M-Instruct.Q4_1.gguf";

const vocab* smollm2_vocab() {
  static const std::unique_ptr<vocab> v = [] {
    std::error_code ec;
    return std::filesystem::is_regular_file(smollm2, ec) ? std::make_unique<vocab>(read_gguf(smollm2)) : nullptr;
  }();
  return v.get();
}

const vocab* big_vocab() {
  static const std::unique_ptr<vocab> v = []() -> std::unique_ptr<vocab> {
    std::error_code ec;
    if (!std::filesystem::is_regular_file(smollm2, ec)) return nullptr;
    const gguf_file f = read_gguf(smollm2);
    const std::vector<std::string> base = f.get<std::vector<std::string>>("tokenizer.ggml.tokens").value();
    std::vector<std::string> tokens(base.begin(), base.end());
    std::set<std::string> seen(tokens.begin(), tokens.end());
    const size_t n = base.size();
    std::mt19937 rng(42);
    while (tokens.size() < 262144) {
      std::string t = base[rng() % n] + base[rng() % n];
      if (seen.insert(t).second) tokens.push_back(std::move(t));
    }
    std::vector<int32_t> types(tokens.size(), 1);
    types[0] = 3;
    gguf_writer w;
    w.add("tokenizer.ggml.model", "gpt2");
    w.add("tokenizer.ggml.pre", "gpt2");
    w.add("tokenizer.ggml.tokens", tokens);
    w.add("tokenizer.ggml.token_type", types);
    w.add("tokenizer.ggml.merges", std::vector<std::string>{});
    w.add("tokenizer.ggml.eos_token_id", uint32_t{0});
    return std::make_unique<vocab>(parse_gguf(w.write(), "262k"));
  }();
  return v.get();
}

void mask(benchmark::State& state, const vocab* (*get)(), const char* prefix) {
  const vocab* v = get();
  if (v == nullptr) {
    state.SkipWithError("models/SmolLM2-135M-Instruct.Q4_1.gguf is missing: run scripts/fetch-model");
    return;
  }
  grammar_matcher m(grammar::parse(json_object_gbnf()));
  if (!m.accept(prefix)) {
    state.SkipWithError("the prefix does not match the grammar");
    return;
  }
  std::vector<uint8_t> allowed;
  size_t n = 0;
  for (auto _ : state) {
    n = m.allowed_tokens(*v, allowed);
    benchmark::DoNotOptimize(allowed.data());
  }
  state.counters["allowed"] = static_cast<double>(n);
  state.counters["vocab"] = static_cast<double>(v->n_tokens());
}

}  // namespace

BENCHMARK_CAPTURE(mask, smollm2/start, smollm2_vocab, "")->Unit(benchmark::kMicrosecond);
BENCHMARK_CAPTURE(mask, smollm2/after_brace, smollm2_vocab, "{")->Unit(benchmark::kMicrosecond);
BENCHMARK_CAPTURE(mask, smollm2/in_string, smollm2_vocab, "{\"name\": \"The qu")->Unit(benchmark::kMicrosecond);
BENCHMARK_CAPTURE(mask, smollm2/in_number, smollm2_vocab, "{\"n\": 12")->Unit(benchmark::kMicrosecond);
BENCHMARK_CAPTURE(mask, 262k/start, big_vocab, "")->Unit(benchmark::kMicrosecond);
BENCHMARK_CAPTURE(mask, 262k/after_brace, big_vocab, "{")->Unit(benchmark::kMicrosecond);
BENCHMARK_CAPTURE(mask, 262k/in_string, big_vocab, "{\"name\": \"The qu")->Unit(benchmark::kMicrosecond);
BENCHMARK_CAPTURE(mask, 262k/in_number, big_vocab, "{\"n\": 12")->Unit(benchmark::kMicrosecond);

BENCHMARK_MAIN();
