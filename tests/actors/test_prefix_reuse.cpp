// Prefix reuse across a model's sessions (llm/prefix_index.h through the decoder actor): a prompt whose start
// another session holds, or a conversation kept in the pool after its session moved on, is not decoded again,
// and every answer is the one computed from scratch, bit for bit (tokens and log-probabilities) on the CPU.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <string>
#include <thread>
#include <vector>

#include "actors/engine.h"
#include "llm/generator.h"
#include "tests/test_models.h"

using namespace troupe;
using namespace troupe::actors;

namespace {

constexpr int n_top = 5;

llm::generate_params greedy_with_logprobs(int32_t n) {
  llm::generate_params p = llm::generate_params::greedy(n);
  p.logprobs = n_top;
  return p;
}

// The answer of a context that never saw anything else: the synchronous generator on a fresh context.
llm::generate_result scratch(const llm::model& m, const std::string& prompt, int32_t n) {
  llm::vocab v(m.meta());
  llm::llm_context c(m, {.n_ctx = 512, .n_threads = 2});
  llm::generator gen(c, v);
  return gen.generate(v.tokenize(prompt, true), greedy_with_logprobs(n));
}

void check_same(const generate_reply& r, const llm::generate_result& want) {
  CHECK(r.tokens == want.tokens);
  CHECK(r.text == want.text);
  CHECK(r.logprobs == want.logprobs);  // the floats, exactly
  CHECK(r.n_prompt == want.n_prompt);
}

// The same tokens, and log-probabilities within `tol`: for a pool full of kept conversations, where a
// sequence reaches the last cell and its next tokens take free cells below the ones it holds. Attention on
// the CPU sums V's rows in cell order, so the same terms are then added in another order (the last bits).
// Where the cells stay in position order (any offset, any gaps), the bits are the same (the cases above).
void check_close(const generate_reply& r, const llm::generate_result& want, float tol) {
  CHECK(r.tokens == want.tokens);
  CHECK(r.text == want.text);
  REQUIRE(r.logprobs.size() == want.logprobs.size());
  float worst = 0;
  for (size_t i = 0; i < r.logprobs.size(); ++i) {
    CHECK(r.logprobs[i].token == want.logprobs[i].token);
    worst = std::max(worst, std::fabs(r.logprobs[i].logprob - want.logprobs[i].logprob));
    REQUIRE(r.logprobs[i].top.size() == want.logprobs[i].top.size());
    for (size_t j = 0; j < r.logprobs[i].top.size(); ++j) {
      CHECK(r.logprobs[i].top[j].token == want.logprobs[i].top[j].token);
      worst = std::max(worst, std::fabs(r.logprobs[i].top[j].logprob - want.logprobs[i].top[j].logprob));
    }
  }
  INFO("largest log-probability difference " << worst);
  CHECK(worst <= tol);
}

decoder_stats stats_of(engine& eng) {
  for (const decoder_stats& s : eng.decoding_stats()) {
    if (s.model == "m") return s;
  }
  FAIL("no decoder stats for model m");
  return {};
}

const std::string story = "Once upon a time, there was a little girl named Lily. She loved to play outside";

}  // namespace

TEST_CASE("a prompt that another session holds is not decoded again, and the answer is the one from scratch", "[actors][prefix]") {
  const auto path = test::model_path("stories260K.gguf");
  if (!path) return;
  auto m = llm::model::load(*path);
  engine eng({.n_threads = 2});
  eng.load_model("m", path->string(), {.n_ctx = 512, .n_seq_max = 2, .n_threads = 2});
  session a = eng.open_session("m");
  session b = eng.open_session("m");

  const generate_reply first = a.generate(story, greedy_with_logprobs(24));
  check_same(first, scratch(*m, story, 24));
  // Session b's prompt starts with everything session a holds (its prompt and answer but the last token).
  const std::string longer = story + first.text + " The sun was";
  const generate_reply second = b.generate(longer, greedy_with_logprobs(16));
  check_same(second, scratch(*m, longer, 16));
  const int32_t held = first.n_prompt + 24 - 1;
  INFO("n_prompt " << second.n_prompt << ", decoded " << second.n_prompt_decoded);
  CHECK(second.n_prompt - second.n_prompt_decoded >= held - 2);  // a BPE merge may differ at the seam
  CHECK(second.n_prompt_decoded <= second.n_prompt - held + 2);
  CHECK(stats_of(eng).reused_tokens == static_cast<uint64_t>(second.n_prompt - second.n_prompt_decoded));

  // The same prompt again on session a, which holds another conversation's start: its last token only.
  const generate_reply again = a.generate(longer, greedy_with_logprobs(16));
  check_same(again, scratch(*m, longer, 16));
  CHECK(again.n_prompt_decoded == 1);
}

TEST_CASE("two sessions diverging inside a shared prefix never see each other's tokens", "[actors][prefix]") {
  const auto path = test::model_path("stories260K.gguf");
  if (!path) return;
  auto m = llm::model::load(*path);
  engine eng({.n_threads = 2});
  eng.load_model("m", path->string(), {.n_ctx = 512, .n_seq_max = 2, .n_threads = 2});
  session a = eng.open_session("m");
  session b = eng.open_session("m");
  const std::string common = story + " in the park with her friends. One day,";
  const generate_reply r0 = a.generate(common, greedy_with_logprobs(8));
  check_same(r0, scratch(*m, common, 8));
  // b shares a's cells up to the divergence, then both go on writing their own: each answer is its own.
  const std::vector<std::string> endings = {" she found a red ball", " a big dog ran", " the sky was dark"};
  for (size_t i = 0; i < endings.size(); ++i) {
    session& s = i % 2 == 0 ? b : a;
    const std::string p = common + endings[i];
    const generate_reply r = s.generate(p, greedy_with_logprobs(12));
    INFO("ending " << i);
    check_same(r, scratch(*m, p, 12));
    CHECK(r.n_prompt - r.n_prompt_decoded >= 10);  // the common part came from the other session or itself
  }
  // And a's first conversation was kept in the pool when a moved on: it comes back without decoding.
  const generate_reply back = b.generate(common, greedy_with_logprobs(8));
  check_same(back, scratch(*m, common, 8));
  CHECK(back.n_prompt_decoded == 1);
}

TEST_CASE("a conversation its session moved on from is kept in the pool, and its next turn decodes only what is new", "[actors][prefix]") {
  const auto path = test::model_path("stories260K.gguf");
  if (!path) return;
  auto m = llm::model::load(*path);
  engine eng({.n_threads = 2});
  // One session: every new conversation takes the sequence of the one before.
  eng.load_model("m", path->string(), {.n_ctx = 512, .n_seq_max = 1, .n_threads = 2});
  session s = eng.open_session("m");
  const std::string x = story;
  const std::string y = "The little dog wanted to play with the ball, but the cat said no and";
  const generate_reply x1 = s.generate(x, greedy_with_logprobs(16));
  const generate_reply y1 = s.generate(y, greedy_with_logprobs(16));
  check_same(y1, scratch(*m, y, 16));
  CHECK(stats_of(eng).kept_conversations >= 1);
  CHECK(stats_of(eng).kept_now >= 1);
  // Conversation x, turn 2: what it held comes back from the kept sequence.
  const std::string x2 = x + x1.text + " Then";
  const generate_reply r = s.generate(x2, greedy_with_logprobs(16));
  check_same(r, scratch(*m, x2, 16));
  CHECK(r.n_prompt - r.n_prompt_decoded >= x1.n_prompt + 16 - 3);
}

TEST_CASE("kept conversations make room when cells run short, and no live sequence loses a token", "[actors][prefix]") {
  const auto path = test::model_path("stories260K.gguf");
  if (!path) return;
  auto m = llm::model::load(*path);
  engine eng({.n_threads = 2});
  // 256 cells: every conversation below takes 60-90; after a few, the pool must drop kept ones to go on.
  eng.load_model("m", path->string(), {.n_ctx = 256, .n_seq_max = 2, .n_threads = 2});
  session a = eng.open_session("m");
  session b = eng.open_session("m");
  const std::vector<std::string> topics = {"a little girl", "a big red dog", "a small blue bird", "an old man",
                                           "a happy cat", "a tall tree", "a funny frog", "a brave boy"};
  for (size_t i = 0; i < topics.size(); ++i) {
    const std::string p = "Once upon a time, there was " + topics[i] + " who lived in a house near the forest. Every day";
    session& s = i % 2 == 0 ? a : b;
    const generate_reply r = s.generate(p, greedy_with_logprobs(40));
    INFO("conversation " << i);
    check_close(r, scratch(*m, p, 40), 1e-3f);
    CHECK(r.finish == "length");
  }
  const decoder_stats st = stats_of(eng);
  CHECK(st.kept_conversations >= 6);
  CHECK(st.kept_evictions >= 1);
  CHECK(st.kept_tokens_now <= 256);
}


TEST_CASE("with no kept conversation left, an idle session's cells make room for another's answer, and its next turn comes back from host memory, the answer the one from scratch", "[actors][prefix][prompt-cache]") {
  const auto path = test::model_path("stories260K.gguf");
  if (!path) return;
  auto m = llm::model::load(*path);
  engine eng({.n_threads = 2});
  // 256 cells for three sessions that each hold a conversation of about 100 positions: the third answer
  // needs cells that only an idle session's sequence can give (no session moved on, so nothing is kept).
  eng.load_model("m", path->string(), {.n_ctx = 256, .n_seq_max = 3, .n_threads = 2});
  session a = eng.open_session("m");
  session b = eng.open_session("m");
  session c = eng.open_session("m");
  const std::string pb = "Once upon a time, there was a big red dog who lived in a house near the forest. Every day";
  const std::string pc = "Once upon a time, there was a small blue bird who lived in a tree near the river. Every day";
  const std::string pa = "Once upon a time, there was an old man who lived in a house on a hill. He had a garden and";
  const generate_reply rb = b.generate(pb, greedy_with_logprobs(40));
  check_same(rb, scratch(*m, pb, 40));
  const generate_reply rc = c.generate(pc, greedy_with_logprobs(40));
  check_same(rc, scratch(*m, pc, 40));
  const generate_reply ra = a.generate(pa, greedy_with_logprobs(120));
  check_close(ra, scratch(*m, pa, 120), 1e-2f);  // 160 positions whose cells are not in position order
  CHECK(ra.finish == "length");
  decoder_stats st = stats_of(eng);
  CHECK(st.idle_evictions >= 1);
  CHECK(st.kv_cells_used <= 256);
  // b's next turn: its conversation and a new line. Whatever the pool evicted of it is written back from
  // host memory (or decoded again); the answer is the one from scratch.
  const std::string pb2 = pb + rb.text + " One day";
  const generate_reply rb2 = b.generate(pb2, greedy_with_logprobs(24));
  check_close(rb2, scratch(*m, pb2, 24), 1e-3f);
  const std::string pc2 = pc + rc.text + " One day";
  const generate_reply rc2 = c.generate(pc2, greedy_with_logprobs(24));
  check_close(rc2, scratch(*m, pc2, 24), 1e-3f);
  st = stats_of(eng);
  CHECK(st.restored_tokens > 0);
}

TEST_CASE("a conversation evicted from the KV cache comes back from the host-RAM prompt cache, bit for bit, its bytes on the memory record", "[actors][prefix][prompt-cache]") {
  const auto path = test::model_path("stories260K.gguf");
  if (!path) return;
  auto m = llm::model::load(*path);
  // 256 cells and one session: each conversation below takes about 100, so after two more the first one
  // has been evicted from the cache.
  const std::string x = "Once upon a time, there was a little girl named Lily. She loved to play outside in the park with her friends.";
  const std::vector<std::string> others = {"The little dog wanted to play with the ball, but the cat said no and ran away.",
                                           "One day, a big bird flew over the house and sang a happy song to the sun.",
                                           "Tom had a red car. He drove it to the shop to buy some milk and bread for mom."};
  for (const uint32_t mib : {64u, 0u}) {
    INFO("prompt_cache_mib " << mib);
    engine eng({.n_threads = 2});
    model_settings ms{.n_ctx = 256, .n_seq_max = 1, .n_threads = 2};
    ms.prompt_cache_mib = mib;
    eng.load_model("m", path->string(), ms);
    session s = eng.open_session("m");
    const generate_reply first = s.generate(x, greedy_with_logprobs(48));
    for (const std::string& o : others) s.generate(o, greedy_with_logprobs(48));
    decoder_stats st = stats_of(eng);
    CHECK(st.kept_evictions >= 1);
    const generate_reply back = s.generate(x, greedy_with_logprobs(48));
    check_same(back, scratch(*m, x, 48));
    CHECK(back.text == first.text);
    st = stats_of(eng);
    if (mib > 0) {
      CHECK(st.saved_conversations >= 1);
      CHECK(back.n_prompt_decoded == 1);  // every prompt position but the last written back from host memory
      CHECK(st.restored_tokens >= static_cast<uint64_t>(back.n_prompt - 2));
      CHECK(st.host_entries >= 1);
      CHECK(st.host_bytes > 0);
      CHECK(st.host_bytes <= 64u << 20);
      // On the memory record as its own buffer type, context memory.
      bool found = false;
      for (const buft_usage& u : eng.memory().entries) {
        if (u.buft == "Host (prompt cache)") {
          found = true;
          CHECK(u.context == st.host_bytes);
        }
      }
      CHECK(found);
    } else {
      CHECK(st.saved_conversations == 0);
      CHECK(back.n_prompt_decoded == back.n_prompt - 1);  // nothing saved: all computed again but the BOS it holds
    }
    const memory_breakdown end = eng.shutdown();
    CHECK(end.context == 0);
  }
}

TEST_CASE("the prompt cache's bytes on the memory record stay within prompt_cache_mib as conversations are evicted into it, the oldest dropped", "[actors][prefix][prompt-cache]") {
  const auto path = test::smollm2_path();
  if (!path) return;
  engine eng({.n_threads = 2});
  // SmolLM2 keeps 23,040 bytes per position (f16): a conversation of about 30 positions is ~0.7 MiB, so
  // 1 MiB of host memory holds one of them. 64 cells and one session: each new conversation evicts the last.
  model_settings ms{.n_ctx = 64, .n_seq_max = 1, .n_threads = 2};
  ms.prompt_cache_mib = 1;
  eng.load_model("m", path->string(), ms);
  session s = eng.open_session("m");
  const std::vector<std::string> prompts = {"The river runs past the old mill and the quiet village.",
                                            "A small bird sings in the garden every spring morning.",
                                            "The market opens early and the bakers bring fresh bread.",
                                            "Snow falls on the mountain road and the travellers rest."};
  uint64_t most = 0;
  for (const std::string& p : prompts) {
    s.generate(p, llm::generate_params::greedy(12));
    const decoder_stats st = stats_of(eng);
    uint64_t recorded = 0;
    for (const buft_usage& u : eng.memory().entries) {
      if (u.buft == "Host (prompt cache)") recorded = u.context;
    }
    INFO("after \"" << p << "\": " << st.host_entries << " saved, " << st.host_bytes << " bytes, " << recorded << " on record");
    CHECK(st.host_bytes <= (1u << 20));
    CHECK(recorded == st.host_bytes);
    most = std::max(most, st.saved_conversations);
  }
  const decoder_stats st = stats_of(eng);
  CHECK(most >= 2);              // conversations went to host memory
  CHECK(st.host_entries == 1);   // and only the latest of them stayed
  CHECK(st.host_bytes > 0);
  const memory_breakdown end = eng.shutdown();
  CHECK(end.context == 0);
}

TEST_CASE("with n_batch below the split threshold a long prompt is still decoded in parts, the answer the one from scratch", "[actors][prefix]") {
  const auto path = test::model_path("stories260K.gguf");
  if (!path) return;
  auto m = llm::model::load(*path);
  engine eng({.n_threads = 2});
  eng.load_model("m", path->string(), {.n_ctx = 512, .n_batch = 16, .n_ubatch = 16, .n_seq_max = 2, .n_threads = 2});
  session s = eng.open_session("m");
  const std::string p = story + " in the park with her friends every day after school.";
  const generate_reply r = s.generate(p, greedy_with_logprobs(16));  // ~60 prompt tokens in parts of 16
  check_same(r, scratch(*m, p, 16));
  CHECK(stats_of(eng).n_batches >= 4);
}

TEST_CASE("clients arriving together behind one new long prefix: it is decoded once, the others share it, every answer the one from scratch", "[actors][prefix]") {
  const auto path = test::model_path("stories260K.gguf");
  if (!path) return;
  auto m = llm::model::load(*path);
  engine eng({.n_threads = 2});
  eng.load_model("m", path->string(), {.n_ctx = 1024, .n_seq_max = 3, .n_threads = 2});
  std::string common = "Once upon a time, there was a little girl named Lily.";
  for (int i = 0; i < 6; ++i) common += " She loved to play outside in the park with her friends and her dog.";
  const std::vector<std::string> questions = {" One day, she saw", " Then her mom said", " The dog ran to"};
  std::vector<session> sessions;
  for (size_t i = 0; i < questions.size(); ++i) sessions.push_back(eng.open_session("m"));
  std::vector<generate_reply> replies(questions.size());
  std::vector<std::thread> clients;
  for (size_t i = 0; i < questions.size(); ++i) {
    clients.emplace_back([&, i] { replies[i] = sessions[i].generate(common + questions[i], greedy_with_logprobs(12)); });
  }
  for (std::thread& t : clients) t.join();
  int32_t decoded = 0, prompt = 0;
  for (size_t i = 0; i < questions.size(); ++i) {
    INFO("client " << i);
    check_same(replies[i], scratch(*m, common + questions[i], 12));
    decoded += replies[i].n_prompt_decoded;
    prompt += replies[i].n_prompt;
  }
  const int32_t n_common = replies[0].n_prompt - 8;  // the common part, give or take the question's tokens
  INFO("prompt tokens " << prompt << ", decoded " << decoded);
  // Whichever request came first decoded the common part; the others shared it.
  CHECK(decoded < prompt - n_common);
  CHECK(stats_of(eng).reused_tokens >= static_cast<uint64_t>(n_common));
}
