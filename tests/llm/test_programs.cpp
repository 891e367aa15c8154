// The programs users run, on bad input: a clear message and exit code 1, never a crash. And the q8_0 KV
// cache on a model whose heads allow it.
#include <catch2/catch.hpp>

#include <array>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <sys/wait.h>
#include <unistd.h>

#include <nlohmann/json.hpp>

#include "backends/registry.h"
#include "loader/gguf_writer.h"
#include "llm/generator.h"
#include "llm/llm_context.h"
#include "tests/llm/synthetic_model.h"
#include "tests/test_models.h"

using namespace troupe;

namespace {

struct run_result {
  int exit_code;
  std::string output;  // stdout and stderr
};

run_result run(const std::string& cmd) {
  std::string out;
  FILE* p = popen((cmd + " 2>&1 < /dev/null").c_str(), "r");
  REQUIRE(p != nullptr);
  std::array<char, 4096> buf{};
  size_t n;
  while ((n = fread(buf.data(), 1, buf.size(), p)) > 0) out.append(buf.data(), n);
  const int status = pclose(p);
  return {WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status), out};
}

const std::string chat = TROUPE_CHAT_BIN;
const std::string troupe_bin = TROUPE_BIN;

}  // namespace

TEST_CASE("troupe-chat and troupe refuse bad input with a message and exit code 1", "[programs]") {
  auto r = run(chat + " -m /nonexistent/model.gguf -p hi --no-chat");
  CHECK(r.exit_code == 1);
  CHECK_THAT(r.output, Catch::Contains("does not exist"));

  // An architecture troupe has no graph for.
  const auto mamba = std::filesystem::temp_directory_path() / "troupe_mamba.gguf";
  {
    gguf_writer w;
    w.add("general.architecture", std::string("mamba"));
    std::vector<float> x(64, 0.0f);
    w.add_tensor("token_embd.weight", type::f32, {8, 8}, std::as_bytes(std::span(x)));
    w.write_file(mamba);
  }
  r = run(chat + " -m " + mamba.string() + " -p hi --no-chat");
  CHECK(r.exit_code == 1);
  CHECK_THAT(r.output, Catch::Contains("architecture 'mamba' is not supported"));

  // A tensor type troupe cannot compute with.
  const auto iq = std::filesystem::temp_directory_path() / "troupe_iq.gguf";
  {
    gguf_writer w;
    w.add("general.architecture", std::string("llama"));
    std::vector<std::byte> blob(256 * 8);
    w.add_tensor("blk.0.ffn_up.weight", type::f64, {256}, blob);
    w.write_file(iq);
  }
  r = run(troupe_bin + " bench -m " + iq.string() + " -p 8 -n 8 -r 1");
  CHECK(r.exit_code == 1);
  CHECK_THAT(r.output, Catch::Contains("blk.0.ffn_up.weight") && Catch::Contains("f64"));

  // Not a GGUF file at all.
  r = run(troupe_bin + " inspect " + std::string(TROUPE_CHAT_BIN));
  CHECK(r.exit_code == 1);
  CHECK_THAT(r.output, Catch::Contains("gguf") && Catch::Contains("magic"));
  std::filesystem::remove(mamba);
  std::filesystem::remove(iq);
}

TEST_CASE("a prompt longer than the context is refused clearly", "[programs]") {
  const auto path = test::model_path("stories260K.gguf");
  if (!path) return;
  std::string prompt;
  for (int i = 0; i < 100; ++i) prompt += "Once upon a time ";
  const auto r = run(chat + " -m " + path->string() + " -c 64 --no-chat -p '" + prompt + "'");
  CHECK(r.exit_code == 1);
  CHECK_THAT(r.output, Catch::Contains("the context holds 64"));
}

TEST_CASE("q8_0 KV cache: refused for heads that split blocks, usable otherwise", "[llm][kv]") {
  const auto syn = std::filesystem::temp_directory_path() / "troupe_syn_kv.gguf";
  testing::write_synthetic_model("llama", syn);  // head size 16
  auto small = llm::model::load(syn);
  CHECK_THROWS_WITH(llm::llm_context(*small, {.n_ctx = 32, .type_k = type::q8_0, .type_v = type::q8_0}),
                    Catch::Contains("head size that is a multiple of 32"));
  std::filesystem::remove(syn);

  const auto path = test::smollm2_path();  // head size 64
  if (!path) return;
  auto m = llm::model::load(*path);
  llm::vocab v(m->meta());
  auto answer = [&](type kv) {
    llm::llm_context ctx(*m, {.n_ctx = 128, .type_k = kv, .type_v = kv, .n_threads = 2});
    llm::generator gen(ctx, v);
    llm::generate_params p;
    p.max_tokens = 8;
    p.temperature = 0.0f;
    return gen.generate(v.tokenize("The capital of France is", true), p).text;
  };
  const std::string f16 = answer(type::f16);
  const std::string q8 = answer(type::q8_0);
  INFO("f16: " << f16 << " | q8_0: " << q8);
  CHECK(f16.find("Paris") != std::string::npos);
  CHECK(q8.find("Paris") != std::string::npos);
}

TEST_CASE("decode steps through the fused attention (a KV head's query heads together) give the unfused graph's logits, bit for bit", "[llm][kv][attention]") {
  const auto path = test::smollm2_path();  // 9 query heads over 3 KV heads
  if (!path) return;
  auto m = llm::model::load(*path);
  llm::vocab v(m->meta());
  const auto prompt = v.tokenize("Question: which city is the capital of France, and which river runs through it? Answer:", true);
  for (type kv : {type::f16, type::f32}) {
    // The prompt, then 40 steps of one token each (the unfused run's greedy tokens fed to both), across
    // several blocks of 16 cells.
    std::vector<std::vector<float>> logits[2];
    std::vector<int32_t> fed;
    for (int fa = 0; fa < 2; ++fa) {
      llm::llm_context ctx(*m, {.n_ctx = 128, .type_k = kv, .type_v = kv, .flash_attn = fa == 1, .n_threads = 2});
      llm::batch b;
      for (size_t i = 0; i < prompt.size(); ++i) b.add(prompt[i], static_cast<int32_t>(i), 0, i + 1 == prompt.size());
      ctx.decode(b);
      for (int step = 0; step < 40; ++step) {
        const auto last = ctx.logits(0);
        logits[fa].emplace_back(last.begin(), last.end());
        if (fa == 0) fed.push_back(static_cast<int32_t>(std::max_element(last.begin(), last.end()) - last.begin()));
        b.clear();
        b.add(fed[static_cast<size_t>(step)], static_cast<int32_t>(prompt.size()) + step, 0, true);
        ctx.decode(b);
      }
    }
    INFO(type_name(kv));
    const bool same = logits[0] == logits[1];  // (a bool: Catch would print both vectors otherwise)
    CHECK(same);
  }
}

TEST_CASE("decode steps over quantized KV caches through the fused attention stay as close to an f32 cache's logits as the unfused graph's", "[llm][kv][attention]") {
  // The fused op reads the cache in its type; its values are the unfused graph's within rounding, and a
  // quantized cache turns a rounding difference into another code for the next rows, so the two runs' logits
  // part after some steps (by up to ~1 here). What must hold is that neither drifts from the truth more: the
  // distance to an f32 cache's logits over 40 steps (measured: q8_0 0.272 fused, 0.291 unfused; q4_0 1.488,
  // 1.581; q5_1 0.663, 0.722).
  const auto path = test::smollm2_path();
  if (!path) return;
  auto m = llm::model::load(*path);
  llm::vocab v(m->meta());
  const auto prompt = v.tokenize("Question: which city is the capital of France, and which river runs through it? Answer:", true);
  REQUIRE(prompt.size() > 16);
  std::vector<int32_t> fed;     // the f32 run's greedy tokens, fed to every run
  const auto run = [&](type kv, bool fa) {
    std::vector<std::vector<float>> out;
    llm::llm_context ctx(*m, {.n_ctx = 128, .type_k = kv, .type_v = kv, .flash_attn = fa, .n_threads = 2});
    llm::batch b;
    for (size_t i = 0; i < prompt.size(); ++i) b.add(prompt[i], static_cast<int32_t>(i), 0, i + 1 == prompt.size());
    ctx.decode(b);
    for (size_t step = 0; step < 40; ++step) {
      const auto last = ctx.logits(0);
      out.emplace_back(last.begin(), last.end());
      if (fed.size() <= step) fed.push_back(static_cast<int32_t>(std::max_element(last.begin(), last.end()) - last.begin()));
      b.clear();
      b.add(fed[step], static_cast<int32_t>(prompt.size() + step), 0, true);
      ctx.decode(b);
    }
    return out;
  };
  const auto truth = run(type::f32, false);
  const auto rms_to_truth = [&](const std::vector<std::vector<float>>& got) {
    double sum = 0;
    size_t n = 0;
    for (size_t s = 1; s < truth.size(); ++s) {
      for (size_t i = 0; i < truth[s].size(); ++i, ++n) sum += std::pow(static_cast<double>(got[s][i]) - truth[s][i], 2);
    }
    return std::sqrt(sum / static_cast<double>(n));
  };
  for (type kv : {type::q8_0, type::q4_0, type::q5_1}) {
    const double unfused = rms_to_truth(run(kv, false)), fused = rms_to_truth(run(kv, true));
    INFO(type_name(kv) << ": fused " << fused << ", unfused " << unfused);
    CHECK(fused <= 1.25 * unfused);
  }
}

TEST_CASE("quantized KV caches through the fused attention: a prompt's logits are the same bits in one batch, in two micro-batches and token by token", "[llm][kv][attention]") {
  // The fused op takes prompts as well as decode steps, V converted a block of cells at a time with each value's
  // FMA chain continued over the blocks: a row's attention does not depend on the rows beside it, so a prompt
  // cache's or a batch's answers are the ones a sequence gets alone.
  const auto path = test::smollm2_path();
  if (!path) return;
  auto m = llm::model::load(*path);
  llm::vocab v(m->meta());
  const auto prompt = v.tokenize("The river that runs through Paris is the Seine. It flows north-west from Burgundy to the English "
                                 "Channel at Le Havre. Question: which city is the capital of France, and which river runs "
                                 "through it? Answer:", true);
  REQUIRE(prompt.size() > 40);  // two blocks of 32 cells of V and more
  for (type kv : {type::q8_0, type::q4_0, type::bf16}) {
    // Every row's logits of the prompt, decoded in micro-batches of `step` tokens.
    const auto run = [&](size_t step) {
      llm::llm_context ctx(*m, {.n_ctx = 128, .n_batch = 128, .n_ubatch = 128, .type_k = kv, .type_v = kv, .flash_attn = true, .n_threads = 2});
      std::vector<std::vector<float>> out;
      for (size_t i0 = 0; i0 < prompt.size(); i0 += step) {
        llm::batch b;
        const size_t i1 = std::min(prompt.size(), i0 + step);
        for (size_t i = i0; i < i1; ++i) b.add(prompt[i], static_cast<int32_t>(i), 0, true);
        ctx.decode(b);
        for (size_t i = i0; i < i1; ++i) {
          const auto row = ctx.logits(i - i0);
          out.emplace_back(row.begin(), row.end());
        }
      }
      return out;
    };
    const auto whole = run(prompt.size());
    INFO(type_name(kv));
    const bool halves = run(prompt.size() / 2 + 1) == whole, tokens = run(1) == whole;
    CHECK(halves);
    CHECK(tokens);
  }
}

TEST_CASE("troupe-chat and troupe bench with --trace FILE write a Chrome trace with a track per device", "[programs][trace]") {
  const auto path = test::model_path("stories260K.gguf");
  if (!path) return;
  const std::string file = std::filesystem::temp_directory_path() / ("troupe-trace-" + std::to_string(::getpid()) + ".json");
  const auto read_file = [&] {
    std::ifstream in(file);
    std::ostringstream s;
    s << in.rdbuf();
    return s.str();
  };
  auto r = run(chat + " -m " + path->string() + " --device CPU,CPU1 --no-chat -n 4 -p 'Once upon a time there was a girl' --trace " + file);
  INFO(r.output);
  CHECK(r.exit_code == 0);
  std::string json = read_file();
  CHECK_THAT(json, Catch::StartsWith("{\"displayTimeUnit\":\"ms\",\"traceEvents\":["));
  CHECK_THAT(json, Catch::Contains("\"name\":\"CPU1\"") && Catch::Contains("\"name\":\"split\"") && Catch::Contains("\"ubatch\":"));
  r = run(troupe_bin + " bench -m " + path->string() + " --device CPU,CPU1 -t 1 -p 64 -n 4 -ub 16 -r 1 --trace " + file);
  CHECK(r.exit_code == 0);
  json = read_file();
  CHECK_THAT(json, Catch::Contains("\"name\":\"CPU1\"") && Catch::Contains("\"name\":\"transfers\""));
  std::filesystem::remove(file);
  // A file that cannot be written is reported, and the program's own result stands.
  r = run(chat + " -m " + path->string() + " --no-chat -n 2 -p 'Once' --trace /nonexistent-dir/t.json");
  CHECK(r.exit_code == 0);
  CHECK_THAT(r.output, Catch::Contains("trace: cannot write /nonexistent-dir/t.json"));
}

TEST_CASE("troupe-chat after /quit and at the end of its input, and troupe perplexity, print the memory breakdown with a row for every device that held layers", "[programs][memory]") {
  const auto path = test::model_path("stories260K.gguf");
  if (!path) return;
  // Vulkan0 (lavapipe under CI) holds half the layers when this build has one; else the CPU alone.
  const bool vulkan = run(troupe_bin + " devices").output.find("Vulkan0") != std::string::npos;
  if (!vulkan && test::in_ci()) FAIL("no Vulkan0 under CI");
  if (!vulkan) WARN("no Vulkan device: the CPU alone holds the layers (Host row only)");
  const std::string devices = vulkan ? " --device CPU,Vulkan0" : "";
  const std::string header = "troupe_memory_breakdown_print: | memory breakdown [MiB] ";
  const auto has_row = [](const std::string& out, const std::string& label) {
    return out.find("troupe_memory_breakdown_print: |   - " + label) != std::string::npos;
  };
  const auto lines_end_in_bar = [](const std::string& out) {
    std::istringstream in(out);
    int n = 0;
    for (std::string line; std::getline(in, line);) {
      if (line.rfind("troupe_memory_breakdown_print: ", 0) != 0) continue;
      if (line.size() < 2 || line.substr(line.size() - 2) != " |") return -1;
      ++n;
    }
    return n;
  };
  for (const std::string input : {"printf 'Once upon a time\\n/quit\\n'", "printf 'Once upon a time\\n'"}) {
    INFO(input);
    const auto r = run(input + " | " + chat + " -m " + path->string() + devices + " -c 256 -n 4 --temp 0 -t 1 2>&1");
    INFO(r.output);
    CHECK(r.exit_code == 0);
    CHECK(r.output.find(header) != std::string::npos);
    CHECK(has_row(r.output, "Host"));
    if (vulkan) CHECK(has_row(r.output, "Vulkan0 (llvmpipe") == (run(troupe_bin + " devices").output.find("llvmpipe") != std::string::npos));
    if (vulkan) CHECK(r.output.find("troupe_memory_breakdown_print: |   - Vulkan0 (") != std::string::npos);
    CHECK(lines_end_in_bar(r.output) >= 3);  // header, Host, and the rows between
  }
  const auto r = run(troupe_bin + " perplexity -m " + path->string() + devices + " -c 128 -t 1 -f " + std::string(TROUPE_TEST_DATA_DIR) + "/story.txt");
  INFO(r.output);
  CHECK(r.exit_code == 0);
  CHECK(r.output.find("perplexity: ") != std::string::npos);
  CHECK(r.output.find(header) != std::string::npos);
  CHECK(has_row(r.output, "Host"));
  if (vulkan) CHECK(r.output.find("troupe_memory_breakdown_print: |   - Vulkan0 (") != std::string::npos);
  CHECK(lines_end_in_bar(r.output) == (vulkan ? 3 : 2));
}

TEST_CASE("troupe inspect --cpu-moe / --n-cpu-moe --ranges: the CPU's file ranges are the experts', the device's never", "[programs][moe]") {
  register_builtin_backends();
  if (registry::instance().find("Vulkan0") == nullptr) return test::skip_unless_ci("no Vulkan0 (CI has lavapipe's)");
  const auto path = std::filesystem::temp_directory_path() / "troupe_inspect_moe.gguf";
  testing::write_synthetic_model("qwen3moe", path);
  const std::regex row(R"(^\s+(CPU|Vulkan0)\s+\d+\s+\d+\s+\d+\s+(\S+) \.\. (\S+)$)");
  const std::regex expert(R"(^blk\.(\d+)\.ffn_(gate|up|down)_exps\.weight$)");
  for (const std::string flag : {"--cpu-moe", "--n-cpu-moe 2"}) {
    INFO(flag);
    const run_result r = run(troupe_bin + " inspect " + path.string() + " --device Vulkan0=99 " + flag + " --ranges");
    INFO(r.output);
    REQUIRE(r.exit_code == 0);
    std::istringstream lines(r.output);
    std::string line;
    int cpu_expert_ranges = 0, device_ranges = 0;
    while (std::getline(lines, line)) {
      std::smatch m;
      if (!std::regex_match(line, m, row)) continue;
      const std::string first = m[2], last = m[3];
      std::smatch e1, e2;
      const bool experts = std::regex_match(first, e1, expert) && std::regex_match(last, e2, expert);
      if (m[1] == "CPU") {
        // A host range is one layer's experts (gate, up, down: consecutive in the file), or the token
        // embeddings, which stay on the CPU in every placement.
        if (first == "token_embd.weight") {
          CHECK(last == "token_embd.weight");
          continue;
        }
        CHECK(experts);
        if (experts) {
          CHECK(e1[1] == e2[1]);
          CHECK(e1[2] == "gate");
          CHECK(e2[2] == "down");
          if (flag != "--cpu-moe") CHECK(std::stoi(e1[1]) < 2);
        }
        ++cpu_expert_ranges;
      } else {
        // --cpu-moe: no expert on the device; --n-cpu-moe 2: the experts of layers 2.. only.
        for (const std::string& name : {first, last}) {
          std::smatch e;
          if (std::regex_match(name, e, expert)) {
            CHECK(flag != "--cpu-moe");
            CHECK(std::stoi(e[1]) >= 2);
          }
        }
        ++device_ranges;
      }
    }
    CHECK(cpu_expert_ranges == (flag == "--cpu-moe" ? 6 : 2));
    CHECK(device_ranges > 0);
  }
  std::filesystem::remove(path);
}

TEST_CASE("troupe bench -d runs each test after that many tokens in the cache, over a grid of -p, -n, -ctk and -fa, and says so in its JSON, with the CPU kernels that ran", "[programs][bench]") {
  const auto path = test::model_path("stories260K.gguf");
  if (!path) return;
  const run_result r = run(troupe_bin + " bench -m " + path->string() + " -p 16 -n 4 -d 0,64 -ctk f16,f32 -fa on,off -t 1 -r 1 -o json");
  INFO(r.output);
  REQUIRE(r.exit_code == 0);
  const nlohmann::json j = nlohmann::json::parse(r.output);
  REQUIRE(j.size() == 16);  // 2 cache types x 2 -fa x 2 depths x (pp, tg)
  std::set<std::string> seen;
  for (const nlohmann::json& t : j) {
    const int depth = t["n_depth"].get<int>();
    const std::string test = t["test"].get<std::string>();
    CHECK((depth == 0 || depth == 64));
    CHECK(test == (t["n_prompt"].get<int>() > 0 ? "pp16" : "tg4") + (depth > 0 ? " @ d64" : std::string()));
    CHECK(t["type_k"] == t["type_v"]);
    CHECK(t["avg_ts"].get<double>() > 0);
    CHECK(t["max_rss_bytes"].get<uint64_t>() > 0);
    // The CPU's kernel family for the model's matrices (all f32 in stories260K): tiles on a SIMD level.
    const std::string kernels = t["cpu_kernels"].get<std::string>();
    CHECK((kernels == "avx512: f32 tile" || kernels == "avx2: f32 tile" || kernels == "scalar: f32 rows" || kernels == "scalar: f32 dot" ||
           kernels.find(": f32 blas") != std::string::npos));
    seen.insert(t["type_k"].get<std::string>() + (t["flash_attn"].get<bool>() ? " fa" : " no-fa") + " " + test);
  }
  CHECK(seen.size() == 16);
  CHECK(seen.count("f32 no-fa tg4 @ d64") == 1);
  // A type that is not a KV cache type, and a -fa that is not a setting: the message names them.
  CHECK_THAT(run(troupe_bin + " bench -m " + path->string() + " -ctk q3_K -r 1").output, Catch::Contains("-ctk q3_K"));
  CHECK_THAT(run(troupe_bin + " bench -m " + path->string() + " -fa maybe -r 1").output, Catch::Contains("-fa maybe"));
  CHECK(run(troupe_bin + " bench -m " + path->string() + " -d -5 -r 1").exit_code == 1);
}
