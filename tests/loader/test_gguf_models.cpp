// The real test models (../shared/models): stories260K (GGUF v3, 48 f32 tensors, 512-token vocab) and
// llama-2-tiny-random (f16 weights, 32000-token vocab).
#include <catch2/catch.hpp>


#include "loader/gguf.h"
#include "loader/gguf_split.h"
#include "loader/gguf_writer.h"
#include "tests/loader/gguf_bytes.h"
#include "tests/test_models.h"

using namespace troupe;

TEST_CASE("gguf: stories260K header, metadata and tensors", "[gguf][models]") {
  const auto path = test::model_path("stories260K.gguf");
  if (!path) return;
  const gguf_file f = read_gguf(*path);

  CHECK(f.version() == 3);
  CHECK(f.alignment() == 32);
  CHECK(f.file_size() == 1185376);
  CHECK(f.data_offset() % 32 == 0);
  CHECK(f.source() == path->string());

  CHECK(f.get<std::string>("general.architecture").value() == "llama");
  CHECK(f.get_uint("llama.embedding_length").value() == 64);
  CHECK(f.get_uint("llama.block_count").value() == 5);
  CHECK(f.get_uint("llama.feed_forward_length").value() == 172);
  CHECK(f.get_uint("llama.attention.head_count").value() == 8);
  CHECK(f.get_uint("llama.attention.head_count_kv").value() == 4);
  CHECK(f.get_uint("llama.context_length").value() == 2048);
  CHECK(f.get_float("llama.attention.layer_norm_rms_epsilon").value() == Approx(1e-5));
  CHECK(f.get<std::string>("tokenizer.ggml.model").value() == "llama");
  CHECK(f.get_uint("tokenizer.ggml.bos_token_id").value() == 1);
  CHECK(f.get_uint("tokenizer.ggml.eos_token_id").value() == 2);

  const auto tokens = f.get<std::vector<std::string>>("tokenizer.ggml.tokens");
  REQUIRE(tokens);
  CHECK(tokens->size() == 512);
  CHECK(tokens->at(0) == "<unk>");
  CHECK(tokens->at(1) == "<s>");
  const auto scores = f.get<std::vector<float>>("tokenizer.ggml.scores");
  REQUIRE(scores);
  CHECK(scores->size() == 512);

  REQUIRE(f.tensors().size() == 48);
  for (const gguf_tensor_info& t : f.tensors()) {
    CHECK(t.type == type::f32);
    CHECK(t.supported());
    CHECK(t.file_offset == f.data_offset() + t.offset);
    CHECK(t.n_bytes == row_size(t.type, t.ne[0]) * static_cast<uint64_t>(t.ne[1] * t.ne[2] * t.ne[3]));
    CHECK(t.file_offset + t.n_bytes <= f.file_size());
    CHECK(t.file_index == 0);
  }
  const gguf_tensor_info& embd = f.tensor("token_embd.weight");  // [n_embd, n_vocab]
  CHECK(embd.n_dims == 2);
  CHECK(embd.ne[0] == 64);
  CHECK(embd.ne[1] == 512);
  CHECK(embd.n_bytes == 64 * 512 * 4);
  CHECK(f.find_tensor("blk.4.ffn_down.weight") != nullptr);
  CHECK(f.find_tensor("blk.5.ffn_down.weight") == nullptr);
  CHECK_THROWS_AS(f.tensor("nope"), gguf_error);

  // Only the header region was read, not the tensor data.
  CHECK(f.bytes_read() >= f.data_offset() - f.alignment());
  CHECK(f.bytes_read() < f.file_size() / 2);
}

TEST_CASE("gguf: parsing from memory and from the file agree", "[gguf][models]") {
  const auto path = test::model_path("stories260K.gguf");
  if (!path) return;
  const std::vector<std::byte> bytes = test::read_file_bytes(*path);
  const gguf_file from_file = read_gguf(*path);
  const gguf_file from_memory = parse_gguf(bytes, "stories");
  CHECK(from_memory.metadata() == from_file.metadata());
  CHECK(from_memory.tensors() == from_file.tensors());
  CHECK(from_memory.data_offset() == from_file.data_offset());
  CHECK(from_memory.bytes_read() <= from_memory.data_offset());
}

TEST_CASE("gguf: stories260K written back parses to the same model", "[gguf][models][writer]") {
  const auto path = test::model_path("stories260K.gguf");
  if (!path) return;
  const std::vector<std::byte> bytes = test::read_file_bytes(*path);
  const gguf_file f = parse_gguf(bytes);
  const std::vector<std::byte> written = gguf_writer::from(f, bytes).write();
  const gguf_file g = parse_gguf(written);
  CHECK(g.metadata() == f.metadata());
  REQUIRE(g.tensors().size() == f.tensors().size());
  for (size_t i = 0; i < f.tensors().size(); ++i) {
    const gguf_tensor_info& a = f.tensors()[i];
    const gguf_tensor_info& b = g.tensors()[i];
    CHECK(a.name == b.name);
    CHECK(a.ne == b.ne);
    CHECK(a.type == b.type);
    CHECK(std::equal(bytes.begin() + static_cast<std::ptrdiff_t>(a.file_offset),
                     bytes.begin() + static_cast<std::ptrdiff_t>(a.file_offset + a.n_bytes),
                     written.begin() + static_cast<std::ptrdiff_t>(b.file_offset)));
  }
  // llama.cpp lays files out the way gguf_writer does, so the file comes back byte for byte.
  CHECK(written == bytes);
}

TEST_CASE("gguf: llama-2-tiny-random has f16 weights and a 32000-token vocab", "[gguf][models]") {
  const auto path = test::model_path("llama-2-tiny-random.gguf");
  if (!path) return;
  const gguf_file f = read_gguf(*path);
  CHECK(f.file_size() == 1750560);
  CHECK(f.get<std::string>("general.architecture").value() == "llama");
  CHECK(f.get_uint("llama.embedding_length").value() == 8);
  CHECK(f.get_uint("llama.block_count").value() == 1);
  CHECK(f.get_uint("llama.context_length").value() == 4096);
  const auto& tokens = f.get<std::vector<std::string>>("tokenizer.ggml.tokens").value();
  CHECK(tokens.size() == 32000);
  const auto types = f.get<std::vector<int32_t>>("tokenizer.ggml.token_type");
  REQUIRE(types);
  CHECK(types->size() == 32000);

  size_t n_f16 = 0;
  for (const gguf_tensor_info& t : f.tensors()) {
    if (t.type == type::f16) ++n_f16;
    CHECK(t.file_offset + t.n_bytes <= f.file_size());
  }
  CHECK(n_f16 > 0);
  const gguf_tensor_info& embd = f.tensor("token_embd.weight");
  CHECK(embd.ne[0] == 8);
  CHECK(embd.ne[1] == 32000);
}

TEST_CASE("gguf: a single-file model opens as one split", "[gguf][models][split]") {
  const auto path = test::model_path("stories260K.gguf");
  if (!path) return;
  const gguf_split_files m = open_gguf_splits(*path);
  CHECK(m.n_files() == 1);
  CHECK(m.tensors().size() == 48);
  CHECK(m.tensor("output_norm.weight").file_index == 0);
  CHECK(m.metadata().get_uint("llama.block_count").value() == 5);
}
