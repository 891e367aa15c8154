// The runtime configuration from TOML: every key, the defaults, errors that name the unknown or mistyped
// key, and an engine started from a configuration with a model to load.
#include <catch2/catch.hpp>

#include <filesystem>
#include <fstream>

#include "actors/engine.h"
#include "actors/engine_config.h"
#include "tests/test_models.h"

using namespace troupe;
using namespace troupe::actors;

TEST_CASE("runtime config: every key, defaults, and errors naming the key", "[actors][config]") {
  const engine_config c = parse_engine_config(R"(
[runtime]
devices = ["CPU", "CPU1"]
cpu_instances = 1
cpu_instance_memory = 1048576
threads = 2
caf_threads = 3
caf_policy = "stealing"
max_restarts = 5
flush_delay_us = 500

[[model]]
name = "stories"
path = "stories260K.gguf"
n_ctx = 512
n_batch = 256
n_ubatch = 128
n_seq_max = 3
threads = 1
use_mmap = false
huge_pages = false
devices = [{ device = "CPU1", layers = 2 }]
)");
  CHECK(c.devices == std::vector<std::string>{"CPU", "CPU1"});
  CHECK(c.cpu_instances == 1);
  CHECK(c.cpu_instance_memory == 1048576);
  CHECK(c.n_threads == 2);
  CHECK(c.caf_threads == 3);
  CHECK(c.caf_policy == "stealing");
  CHECK(c.max_restarts == 5);
  CHECK(c.flush_delay_us == 500);
  REQUIRE(c.models.size() == 1);
  const model_settings& m = c.models[0];
  CHECK(m.name == "stories");
  CHECK(m.n_ctx == 512);
  CHECK(m.n_batch == 256);
  CHECK(m.n_ubatch == 128);
  CHECK(m.n_seq_max == 3);
  CHECK(m.n_threads == 1);
  CHECK_FALSE(m.use_mmap);
  CHECK_FALSE(m.huge_pages);
  REQUIRE(m.devices.size() == 1);
  CHECK(m.devices[0].device == "CPU1");
  CHECK(m.devices[0].layers == 2);
  const model_settings r = m.resolved();
  CHECK(r.n_seq_max == 3);

  const engine_config d = parse_engine_config("");
  CHECK(d.devices.empty());
  CHECK(d.caf_policy == "sharing");
  CHECK(d.max_restarts == 3);

  auto error_of = [](const std::string& text) {
    try {
      parse_engine_config(text, "t.toml");
    } catch (const troupe::error& e) {
      return std::string(e.what());
    }
    return std::string("(no error)");
  };
  CHECK(error_of("[runtime]\nthread = 2\n") == "t.toml:2: unknown key 'thread' in [runtime]");
  CHECK(error_of("[runtim]\n").find("unknown key 'runtim'") != std::string::npos);
  CHECK(error_of("[[model]]\nname = \"a\"\npath = \"b\"\nctx = 5\n").find("unknown key 'ctx' in [[model]]") != std::string::npos);
  CHECK(error_of("[runtime]\nthreads = \"two\"\n").find("runtime.threads must be an integer from 0 to 2147483647") != std::string::npos);
  CHECK(error_of("[runtime]\nthreads = -1\n").find("runtime.threads") != std::string::npos);
  CHECK(error_of("[runtime]\ncaf_policy = \"fast\"\n").find("caf_policy") != std::string::npos);
  CHECK(error_of("[[model]]\nname = \"a\"\n").find("needs a name and a path") != std::string::npos);
  CHECK(error_of("[[model]]\nname = \"a\"\npath = \"b\"\ndevices = [{ device = \"CPU1\", layer = 2 }]\n")
            .find("unknown key 'layer' in model.devices") != std::string::npos);
  CHECK(error_of("[runtime\n").rfind("t.toml:1: ", 0) == 0);
  CHECK_THROWS_AS(load_engine_config("/nonexistent/troupe.toml"), troupe::error);
}

TEST_CASE("an engine from a TOML file loads its configured models", "[actors][config]") {
  const auto path = test::model_path("stories260K.gguf");
  if (!path) return;
  const auto file = std::filesystem::temp_directory_path() / "troupe_test_runtime.toml";
  {
    std::ofstream out(file);
    out << "[runtime]\nthreads = 1\n\n[[model]]\nname = \"stories\"\npath = \"" << path->string()
        << "\"\nn_ctx = 256\nn_seq_max = 2\nthreads = 1\n";
  }
  engine eng(load_engine_config(file));
  std::filesystem::remove(file);
  eng.load_configured_models();
  CHECK(eng.status().models == std::vector<std::string>{"stories"});
  session s = eng.open_session("stories");
  generation_params p;
  p.max_tokens = 8;
  CHECK(s.generate("Once", p).tokens.size() <= 8);
  s.close();
  CHECK(eng.shutdown().model == 0);
}

TEST_CASE("model settings: one validation, one resolution of defaults, reached from TOML, the API and the wire",
          "[actors][config]") {
  const model_settings s{.name = "m", .path = "m.gguf", .n_ctx = 1000, .n_seq_max = 3};
  CHECK(s.n_ctx_seq == 0);
  CHECK(s.resolved().n_ctx_seq == 1000);  // n_ctx: the sessions draw from one pool
  model_settings explicit_seq = s;
  explicit_seq.n_ctx_seq = 800;
  CHECK(explicit_seq.resolved().n_ctx_seq == 800);
  model_settings one = s;
  one.n_ctx = 2;
  one.n_seq_max = 4;
  CHECK(one.resolved().n_ctx_seq == 2);  // the whole pool, however many sessions
  CHECK(one.embedding_cells() == 1);     // an equal share for embeddings, never 0

  auto field_of = [](model_settings m) {
    try {
      m.validate();
    } catch (const settings_error& e) {
      return e.field() + ": " + e.what();
    }
    return std::string("(valid)");
  };
  CHECK(field_of(s) == "(valid)");
  model_settings bad = s;
  bad.kv_type = "q4";
  CHECK(field_of(bad) == "kv_type: kv_type (cache_type_k) must be one of f32, f16, bf16, q8_0, q4_0, q4_1, q5_0, q5_1, iq4_nl, not \"q4\"");
  model_settings bad_v = s;
  bad_v.kv_type_v = "q3_K";
  CHECK(field_of(bad_v) == "kv_type_v: cache_type_v must be one of f32, f16, bf16, q8_0, q4_0, q4_1, q5_0, q5_1, iq4_nl, not \"q3_K\"");
  bad = s;
  bad.n_ctx_seq = 1001;
  CHECK(field_of(bad) == "n_ctx_seq: n_ctx_seq (1001) is larger than n_ctx (1000)");
  bad = s;
  bad.n_ubatch = 0;
  CHECK(field_of(bad) == ": n_ctx, n_batch, n_ubatch and n_seq_max must be positive");
  bad = s;
  bad.overrides = {{"(", "CPU"}};
  CHECK(field_of(bad).rfind("overrides: overrides: invalid regex '('", 0) == 0);
  bad = s;
  bad.chat_template = "jinja";
  CHECK(field_of(bad).rfind("chat_template: ", 0) == 0);
  bad = s;
  bad.path.clear();
  CHECK(field_of(bad) == ": a model needs a name and a path");

  // TOML: every field by its key (parallel included), the error placed at the key at fault.
  const engine_config c = parse_engine_config("[[model]]\nname = \"m\"\npath = \"m.gguf\"\nparallel = false\n"
                                                "n_ctx = 64\nn_ctx_seq = 32\n");
  REQUIRE(c.models.size() == 1);
  CHECK_FALSE(c.models[0].parallel);
  CHECK(c.models[0].resolved().n_ctx_seq == 32);
  try {
    parse_engine_config("[[model]]\nname = \"m\"\npath = \"m.gguf\"\nn_ctx = 64\nn_ctx_seq = 65\n", "t.toml");
    FAIL("n_ctx_seq above n_ctx was accepted");
  } catch (const troupe::error& e) {
    CHECK(std::string(e.what()) == "t.toml:5: model.n_ctx_seq (65) is larger than n_ctx (64)");
  }
}

TEST_CASE("model settings the embedding API gets are validated by the loader, naming the field", "[actors][config]") {
  const auto path = test::model_path("stories260K.gguf");
  if (!path) return;
  engine eng({.n_threads = 1});
  try {
    eng.load_model("m", path->string(), {.n_ctx = 256, .kv_type = "q4"});
    FAIL("a bad kv_type was accepted");
  } catch (const request_error& e) {
    CHECK(e.is(errc::bad_request));
    CHECK(std::string(e.what()).find("load m: kv_type (cache_type_k) must be one of") != std::string::npos);
  }
  // The default per-session context is the same as the daemon's: the whole pool, n_ctx.
  eng.load_model("m", path->string(), {.n_ctx = 256, .n_seq_max = 2, .n_threads = 1});
  CHECK(eng.env()->model("m")->settings.n_ctx_seq == 256);
  CHECK(eng.shutdown().model == 0);
}
