// Placement, range mapping and loading: a synthetic GGUF whose tensors of three contexts interleave (one
// tensor shared), and the real stories260K model with and without mmap.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <numeric>

#include "backends/cpu/cpu_backend.h"
#include "loader/gguf_writer.h"
#include "loader/model_loader.h"
#include "runtime/huge_pages.h"
#include "tests/support/copy_device.h"
#include "tests/test_models.h"

using namespace troupe;

namespace {

using testing::copy_device;

std::vector<float> iota_floats(size_t n, float start) {
  std::vector<float> v(n);
  std::iota(v.begin(), v.end(), start);
  return v;
}

// Tensors in file order: h0 A0 h1 B0 A1 shared h2, with h* on the host, A* on device A, B0 on device B, and
// "shared" used by the host and by A.
std::filesystem::path write_interleaved(std::vector<std::vector<float>>& data) {
  gguf_writer w;
  w.add("general.architecture", std::string("test"));
  w.add("test.block_count", uint32_t{0});
  const char* names[] = {"h0", "a0", "h1", "b0", "a1", "shared", "h2"};
  const int64_t sizes[] = {64, 40, 8, 100, 24, 16, 32};
  for (int i = 0; i < 7; ++i) {
    data.push_back(iota_floats(static_cast<size_t>(sizes[i]), static_cast<float>(i * 1000)));
    w.add_tensor(names[i], type::f32, {sizes[i]}, std::as_bytes(std::span(data.back())));
  }
  const auto path = std::filesystem::temp_directory_path() / "troupe_interleaved.gguf";
  w.write_file(path);
  return path;
}

}  // namespace

TEST_CASE("placement by layer, by override, output with the last layer", "[loader][placement]") {
  copy_device a("A"), b("B");
  buffer_type_i* host = &cpu::cpu_device().buffer_type();
  std::vector<gguf_tensor_info> ts;
  for (const char* n : {"token_embd.weight", "blk.0.attn_q.weight", "blk.1.attn_q.weight", "blk.2.attn_q.weight",
                        "blk.3.attn_q.weight", "blk.3.ffn_up_exps.weight", "output_norm.weight", "output.weight"}) {
    gguf_tensor_info t;
    t.name = n;
    ts.push_back(t);
  }
  placement_params p;
  p.host = host;
  p.devices = {{&a.buffer_type(), 2}, {&b.buffer_type(), 1}};
  p.overrides = {{"_exps", host}};
  placement plan = plan_placement(ts, 4, p);
  CHECK(plan.primary("token_embd.weight") == host);
  CHECK(plan.primary("blk.0.attn_q.weight") == host);
  CHECK(plan.primary("blk.1.attn_q.weight") == &a.buffer_type());
  CHECK(plan.primary("blk.2.attn_q.weight") == &a.buffer_type());
  CHECK(plan.primary("blk.3.attn_q.weight") == &b.buffer_type());
  CHECK(plan.primary("blk.3.ffn_up_exps.weight") == host);  // override wins over the layer
  CHECK(plan.primary("output.weight") == host);             // 3 offloaded layers of 4: output stays

  p.devices = {{&a.buffer_type(), 2}, {&b.buffer_type(), 3}};  // 5 > 4: the output layer too
  plan = plan_placement(ts, 4, p);
  CHECK(plan.primary("blk.0.attn_q.weight") == &a.buffer_type());
  CHECK(plan.primary("blk.2.attn_q.weight") == &b.buffer_type());
  CHECK(plan.primary("output.weight") == &b.buffer_type());
  CHECK(plan.output_buft() == &b.buffer_type());

  p.overrides = {{"(unclosed", host}};
  CHECK_THROWS_WITH(plan_placement(ts, 4, p), Catch::Contains("bad tensor override pattern '(unclosed'"));
  CHECK(layer_of("blk.17.attn_k.weight") == 17);
  CHECK(layer_of("blk.x.attn_k.weight") == -1);
  CHECK(layer_of("output.weight") == -1);
}

TEST_CASE("range mapping and loading of three interleaved contexts with a shared tensor", "[loader][ranges]") {
  std::vector<std::vector<float>> data;
  const auto path = write_interleaved(data);
  copy_device a("A"), b("B");
  buffer_type_i* host = &cpu::cpu_device().buffer_type();

  model_loader loader(path);
  placement_params p;
  p.host = host;
  p.overrides = {{"^a", &a.buffer_type()}, {"^b", &b.buffer_type()}};
  placement plan = loader.plan(p);
  plan.add_use("shared", &a.buffer_type());

  const auto ranges = map_ranges(loader.tensors(), plan);
  auto names = [](const file_range& r) {
    std::string s;
    for (auto* t : r.tensors) s += (s.empty() ? "" : ",") + t->name;
    return s;
  };
  const auto& hr = ranges.at(host);
  REQUIRE(hr.size() == 3);  // h0 | h1 | shared,h2
  CHECK(names(hr[0]) == "h0");
  CHECK(names(hr[1]) == "h1");
  CHECK(names(hr[2]) == "shared,h2");
  const auto& ar = ranges.at(&a.buffer_type());
  REQUIRE(ar.size() == 2);  // a0 | a1,shared
  CHECK(names(ar[0]) == "a0");
  CHECK(names(ar[1]) == "a1,shared");
  const auto& br = ranges.at(&b.buffer_type());
  REQUIRE(br.size() == 1);
  CHECK(names(br[0]) == "b0");
  // No range covers a byte of another context's tensor.
  for (const auto& [buft, rs] : ranges) {
    for (const file_range& r : rs) {
      for (const gguf_tensor_info& t : loader.tensors()) {
        const auto& uses = plan.uses(t.name);
        if (std::find(uses.begin(), uses.end(), buft) != uses.end()) continue;
        const bool overlap = t.file_offset < r.end && r.begin < t.file_offset + t.n_bytes;
        CHECK_FALSE(overlap);
      }
    }
  }

  for (bool use_mmap : {true, false}) {
    INFO("mmap " << use_mmap);
    std::vector<uint64_t> progress;
    model_weights w = loader.load(plan, {.use_mmap = use_mmap, .progress = [&](uint64_t done, uint64_t total) {
                                           progress.push_back(done);
                                           CHECK(done <= total);
                                           return true;
                                         }});
    // Every tensor, in every context it is used in, holds the file's bytes.
    const char* names7[] = {"h0", "a0", "h1", "b0", "a1", "shared", "h2"};
    for (int i = 0; i < 7; ++i) {
      for (buffer_type_i* buft : plan.uses(names7[i])) {
        tensor* t = w.get(names7[i], buft);
        std::vector<float> got(static_cast<size_t>(nelements(*t)));
        tensor_get(*t, got.data(), 0, got.size() * 4);
        CHECK(got == data[static_cast<size_t>(i)]);
        CHECK(w.buffer_containing(t->data, nbytes(*t)) == t->buffer);
      }
    }
    CHECK(w.get("shared", host) != w.get("shared", &a.buffer_type()));
    CHECK(std::is_sorted(progress.begin(), progress.end()));
    CHECK(progress.size() == 8);  // 7 tensors, the shared one twice
    if (use_mmap) {
      // The host context is used in place: one buffer per range, each exactly its range.
      CHECK(w.mapped_bytes() == (64 + 8 + 16 + 32) * 4);
      CHECK(w.copied_bytes() == (40 + 100 + 24 + 16) * 4);
    } else {
      CHECK(w.mapped_bytes() == 0);
    }
    // Model memory is what the weight buffers hold (as llama.cpp counts it): their sizes, each tensor's
    // alignment padding included, at least the tensors' bytes.
    const auto bytes = w.bytes_by_buft();
    const auto held = [&](const buffer_type_i& bt) {
      size_t n = 0;
      for (const buffer_ptr& buf : w.buffers()) n += &buf->type() == &bt ? buf->size() : 0;
      return n;
    };
    CHECK(bytes.at(&a.buffer_type()) == held(a.buffer_type()));
    CHECK(bytes.at(&b.buffer_type()) == held(b.buffer_type()));
    CHECK(bytes.at(host) == held(*host));
    CHECK(bytes.at(&a.buffer_type()) >= (40 + 24 + 16) * 4);
    CHECK(bytes.at(&b.buffer_type()) >= 100 * 4);
    if (use_mmap) CHECK(bytes.at(host) == w.mapped_bytes());  // the mapped ranges, exactly
  }

  // Cancellation.
  CHECK_THROWS_AS(loader.load(plan, {.progress = [](uint64_t, uint64_t) { return false; }}), load_cancelled);
  std::filesystem::remove(path);
}

TEST_CASE("a tensor of a type troupe cannot compute with is refused by name before anything is read", "[loader]") {
  gguf_writer w;
  w.add("general.architecture", std::string("test"));
  std::vector<std::byte> blob(256 * 8);
  w.add_tensor("blk.0.ffn_up.weight", type::f64, {256}, blob);
  const auto path = std::filesystem::temp_directory_path() / "troupe_f64.gguf";
  w.write_file(path);
  model_loader loader(path);
  placement_params p;
  p.host = &cpu::cpu_device().buffer_type();
  CHECK_THROWS_WITH(loader.load(loader.plan(p)), Catch::Contains("blk.0.ffn_up.weight") && Catch::Contains("f64"));
  std::filesystem::remove(path);
}

TEST_CASE("stories260K loads in place with mmap and by copy without it", "[loader][model]") {
  const auto path = test::model_path("stories260K.gguf");
  if (!path) return;
  model_loader loader(*path);
  CHECK(loader.arch() == "llama");
  CHECK(loader.n_layer() == 5);
  placement_params p;
  p.host = &cpu::cpu_device().buffer_type();
  const placement plan = loader.plan(p);
  model_weights mapped = loader.load(plan);
  model_weights copied = loader.load(plan, {.use_mmap = false, .staging_size = 4096});
  CHECK(mapped.copied_bytes() == 0);
  CHECK(copied.mapped_bytes() == 0);
  uint64_t total = 0;
  for (const auto& t : loader.tensors()) total += t.n_bytes;
  CHECK(mapped.mapped_bytes() == total);
  CHECK(copied.copied_bytes() == total);
  CHECK(mapped.bytes_by_buft().at(p.host) == total);
  for (const auto& t : loader.tensors()) {
    tensor* a = mapped.get(t.name);
    tensor* b = copied.get(t.name);
    REQUIRE(nbytes(*a) == t.n_bytes);
    CHECK(std::memcmp(a->data, b->data, t.n_bytes) == 0);
  }
  memory_ledger ledger;
  mapped.account(ledger);
  CHECK(ledger.usage("CPU").model == total);
  mapped.account(ledger, -1);
  CHECK(ledger.usage("CPU").self() == 0);
  tensor* embd = mapped.get("token_embd.weight");
  CHECK(embd->ne[0] == 64);
  CHECK(embd->ne[1] == 512);
}

TEST_CASE("host weights are copied into huge pages where the kernel offers them and used in place otherwise", "[loader][model]") {
  const auto path = test::model_path("stories260K.gguf");
  if (!path) return;
  model_loader loader(*path);
  placement_params p;
  p.host = &cpu::cpu_device().buffer_type();
  const placement plan = loader.plan(p);
  uint64_t total = 0;
  for (const auto& t : loader.tensors()) total += t.n_bytes;
  model_weights mapped = loader.load(plan, {.huge_pages = false});
  // The threshold lowered so that this 1 MiB model qualifies.
  model_weights paged = loader.load(plan, {.huge_pages = true, .huge_pages_min = 0});
  CHECK(mapped.mapped_bytes() == total);
  if (transparent_huge_pages()) {
    CHECK(paged.copied_bytes() == total);
    CHECK(paged.mapped_bytes() == 0);
  } else {
    WARN("this kernel offers no transparent huge pages: weights stay in the mapping");
    CHECK(paged.mapped_bytes() == total);
  }
  // Below the threshold (16 MiB by default) the weights stay in the mapping.
  CHECK(loader.load(plan).mapped_bytes() == total);
  for (const auto& t : loader.tensors()) {
    REQUIRE(nbytes(*paged.get(t.name)) == t.n_bytes);
    CHECK(std::memcmp(mapped.get(t.name)->data, paged.get(t.name)->data, t.n_bytes) == 0);
  }
  memory_ledger ledger;
  paged.account(ledger);
  CHECK(ledger.usage("CPU").model == total);
}

namespace {

// Resident bytes of this process's mappings of `file` (/proc/self/smaps: the Rss of each mapping whose path
// it is).
uint64_t resident_of_mapping(const std::filesystem::path& file) {
  std::ifstream in("/proc/self/smaps");
  const std::string name = std::filesystem::canonical(file).string();
  std::string line;
  bool in_map = false;
  uint64_t kb = 0;
  while (std::getline(in, line)) {
    const auto dash = line.find('-');
    const bool header = dash != std::string::npos && dash > 0 &&
                        line.find_first_not_of("0123456789abcdef") == dash && line.find(' ') > dash;
    if (header) {
      in_map = line.size() >= name.size() && line.compare(line.size() - name.size(), name.size(), name) == 0;
    } else if (in_map && line.rfind("Rss:", 0) == 0) {
      kb += std::stoull(line.substr(4));
    }
  }
  return kb * 1024;
}

}  // namespace

TEST_CASE("weights copied out of the mapping leave it as they are copied: the model is not resident twice", "[loader][memory]") {
  // SmolLM2 (104 MiB, its largest tensor 17 MiB), not stories260K (1.1 MiB): what one fault maps is the
  // kernel's choice (64 KiB of fault-around here, a whole large folio of the page cache on other kernels), and
  // on a file of 1 MiB that alone can be half of it (CI measured 716 KiB of stories260K's 1,144 resident).
  const auto path = test::smollm2_path();
  if (!path) return;
  copy_device dev("D");
  model_loader loader(*path);
  placement_params p;
  p.host = &cpu::cpu_device().buffer_type();
  p.overrides = {{".", &dev.buffer_type()}};  // every tensor copied to the device, read through the mapping
  const placement plan = loader.plan(p);
  uint64_t total = 0;
  for (const auto& t : loader.tensors()) total += t.n_bytes;
  uint64_t most = 0, calls = 0;
  model_weights w = loader.load(plan, {.use_mmap = true, .progress = [&](uint64_t, uint64_t) {
                                         most = std::max(most, resident_of_mapping(*path));
                                         ++calls;
                                         return true;
                                       }});
  CHECK(w.copied_bytes() == total);
  REQUIRE(calls >= loader.tensors().size());
  REQUIRE(most > 0);  // the mapping was found in smaps (pages at tensors' ends stay)
  // Before, every page read stayed mapped until the load ended: the whole file at the last tensor. Now a
  // tensor's pages leave once it is copied; what stays are pages shared by two tensors' ends and the kernel's
  // fault-around (64 KiB) beyond the tensor being copied.
  INFO("most resident " << most << " of " << total << " bytes of weights, " << loader.tensors().size() << " tensors");
  CHECK(most < total / 2);
  for (const auto& t : loader.tensors()) REQUIRE(nbytes(*w.get(t.name)) == t.n_bytes);
}

TEST_CASE("host buffers of a huge page or more are zero-filled 2 MiB-aligned pages of their own", "[loader][memory]") {
  host_pages pages = host_pages::allocate(3 << 20);
  REQUIRE(pages.data() != nullptr);
  CHECK(reinterpret_cast<uintptr_t>(pages.data()) % host_pages::huge_page == 0);
  CHECK(pages.size() == (4u << 20));
  const auto* bytes = static_cast<const unsigned char*>(pages.data());
  CHECK(std::all_of(bytes, bytes + pages.size(), [](unsigned char b) { return b == 0; }));
  host_pages moved = std::move(pages);
  CHECK(pages.data() == nullptr);
  CHECK(moved.size() == (4u << 20));

  buffer_ptr big = cpu::cpu_device().buffer_type().alloc_buffer((2u << 20) + 100);
  CHECK(reinterpret_cast<uintptr_t>(big->base()) % host_pages::huge_page == 0);
  CHECK(big->size() == (2u << 20) + 100);
  std::memset(big->base(), 0x5A, big->size());
  buffer_ptr small = cpu::cpu_device().buffer_type().alloc_buffer(4096);
  CHECK(reinterpret_cast<uintptr_t>(small->base()) % 64 == 0);
}
