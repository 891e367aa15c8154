// Staged loading (load_job): several buffer types uploaded from several threads at once give the same
// weights as model_loader::load; cancellation and misuse are errors, not crashes.
#include <catch2/catch.hpp>

#include <filesystem>
#include <numeric>
#include <string>
#include <thread>

#include <unistd.h>

#include "backends/cpu/cpu_backend.h"
#include "loader/gguf_writer.h"
#include "loader/model_loader.h"
#include "tests/support/copy_device.h"

using namespace troupe;

namespace {

using testing::copy_device;

struct fixture {
  std::vector<std::vector<float>> data;
  // A file of this process's own: ctest runs this file's cases as processes side by side, and one case's
  // fixture removing a shared file under another's load made the other fail on a busy machine.
  std::filesystem::path path = std::filesystem::temp_directory_path() / ("troupe_load_job_" + std::to_string(::getpid()) + ".gguf");
  std::vector<std::string> names = {"h0", "a0", "b0", "a1", "b1", "h1"};
  fixture() {
    gguf_writer w;
    w.add("general.architecture", std::string("test"));
    w.add("test.block_count", uint32_t{0});
    for (size_t i = 0; i < names.size(); ++i) {
      data.emplace_back(1000 + 100 * i);
      std::iota(data.back().begin(), data.back().end(), static_cast<float>(i * 10000));
      w.add_tensor(names[i], type::f32, {static_cast<int64_t>(data.back().size())}, std::as_bytes(std::span(data.back())));
    }
    w.write_file(path);
  }
  ~fixture() { std::filesystem::remove(path); }
};

}  // namespace

TEST_CASE("load_job: two devices uploaded from two threads equal a plain load", "[loader][load_job]") {
  fixture f;
  copy_device a("A"), b("B");
  buffer_type_i* host = &cpu::cpu_device().buffer_type();
  model_loader loader(f.path);
  placement plan = loader.plan({.host = host, .overrides = {{"^a", &a.buffer_type()}, {"^b", &b.buffer_type()}}});

  for (bool use_mmap : {true, false}) {
    INFO("mmap " << use_mmap);
    load_job job = loader.begin(plan, {.use_mmap = use_mmap, .staging_size = 512});
    REQUIRE(job.targets().size() == 3);
    CHECK_FALSE(job.targets().back()->is_host() == false);  // host last
    CHECK(job.bytes(&a.buffer_type()) == (1100 + 1300) * 4);
    CHECK(job.total_bytes() == (1000 + 1100 + 1200 + 1300 + 1400 + 1500) * 4);
    CHECK_THROWS_AS(job.finish(), error);  // nothing uploaded yet
    std::thread ta([&] { job.upload(&a.buffer_type()); });
    std::thread tb([&] { job.upload(&b.buffer_type()); });
    ta.join();
    tb.join();
    CHECK(job.uploaded(&a.buffer_type()));
    CHECK_FALSE(job.uploaded(host));
    CHECK_THROWS_AS(job.upload(&a.buffer_type()), error);  // twice
    job.upload(host);
    CHECK(job.done_bytes() == job.total_bytes());
    model_weights w = job.finish();
    for (size_t i = 0; i < f.names.size(); ++i) {
      tensor* t = w.get(f.names[i]);
      std::vector<float> got(static_cast<size_t>(nelements(*t)));
      tensor_get(*t, got.data(), 0, got.size() * 4);
      CHECK(got == f.data[i]);
    }
    CHECK(w.bytes_by_buft() == loader.load(plan, {.use_mmap = use_mmap}).bytes_by_buft());
  }
}

TEST_CASE("load_job: cancel stops running and later uploads, and a foreign buffer type is refused", "[loader][load_job]") {
  fixture f;
  copy_device a("A"), other("X");
  model_loader loader(f.path);
  placement plan = loader.plan({.host = &cpu::cpu_device().buffer_type(), .overrides = {{"^a", &a.buffer_type()}}});
  load_job job = loader.begin(plan, {.use_mmap = false});
  CHECK_THROWS_AS(job.upload(&other.buffer_type()), error);
  int calls = 0;
  CHECK_THROWS_AS(job.upload(&a.buffer_type(), [&](uint64_t, uint64_t) { return ++calls < 1; }), load_cancelled);
  CHECK(job.cancelled());
  CHECK_THROWS_AS(job.upload(&cpu::cpu_device().buffer_type()), load_cancelled);
  CHECK_THROWS_AS(job.finish(), load_cancelled);

  load_job job2 = loader.begin(plan, {});
  job2.cancel();
  CHECK_THROWS_AS(job2.upload(&a.buffer_type()), load_cancelled);
}
