// The runtime configuration from TOML: every key, the defaults, errors that name the unknown or mistyped
// key, and an engine started from a configuration with a model to load.
#include <catch2/catch.hpp>

#include <filesystem>
#include <fstream>

#include "actors/runtime.h"
#include "actors/runtime_config.h"
#include "tests/test_models.h"

using namespace troupe;
using namespace troupe::actors;

TEST_CASE("runtime config: every key, defaults, and errors naming the key", "[actors][config]") {
  const runtime_config c = parse_runtime_config(R"(
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
  REQUIRE(m.devices.size() == 1);
  CHECK(m.devices[0].device == "CPU1");
  CHECK(m.devices[0].layers == 2);
  const model_settings r = m.resolved();
  CHECK(r.n_seq_max == 3);

  const runtime_config d = parse_runtime_config("");
  CHECK(d.devices.empty());
  CHECK(d.caf_policy == "sharing");
  CHECK(d.max_restarts == 3);

  auto error_of = [](const std::string& text) {
    try {
      parse_runtime_config(text, "t.toml");
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
  CHECK_THROWS_AS(load_runtime_config("/nonexistent/troupe.toml"), troupe::error);
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
  engine eng(load_runtime_config(file));
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
