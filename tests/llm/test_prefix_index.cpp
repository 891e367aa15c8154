// The bookkeeping of prefix reuse across sequences (llm/prefix_index.h): which sequence a step takes its
// prompt's start from, what is kept in the pool, what is evicted. The decodes themselves are in
// tests/actors/test_prefix_reuse.cpp.
#include <catch2/catch.hpp>

#include <numeric>
#include <vector>

#include "llm/prefix_index.h"
#include "tests/support/kv_round_trip.h"
#include "tests/test_models.h"

using namespace troupe;
using namespace troupe::llm;

namespace {

std::vector<token_id> range(token_id from, token_id n) {
  std::vector<token_id> v(static_cast<size_t>(n));
  std::iota(v.begin(), v.end(), from);
  return v;
}

std::vector<token_id> cat(std::vector<token_id> a, const std::vector<token_id>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

}  // namespace

TEST_CASE("prefix index: a step takes the decoded positions another sequence holds, never the last token", "[prefix]") {
  prefix_index ix(2, 8, 4);
  auto p0 = ix.plan_step(0, 0, range(1, 10));
  CHECK(p0.donor == -1);
  CHECK(p0.keep_into == -1);
  // Not decoded yet: nothing to share.
  auto early = ix.plan_step(1, 0, range(1, 12));
  CHECK(early.donor == -1);
  ix.step_done(1, true);
  ix.step_done(0, true);
  // Sequence 1 now holds 1..12 itself; sequence 0 holds 1..10. A prompt 1..10 + 50 on sequence 0 keeps its own.
  auto own = ix.plan_step(0, 10, std::vector<token_id>{50});
  CHECK(own.donor == -1);
  CHECK(own.keep == 10);
  ix.step_done(0, true);
  // Sequence 0 starting over with 1..12, 99: sequence 1's 12 positions, then 99 decoded.
  auto took = ix.plan_step(0, 0, cat(range(1, 12), {99}));
  CHECK(took.donor == 1);
  CHECK(took.n == 12);
  CHECK(took.keep == 12);
  CHECK(took.tokens == std::vector<token_id>{99});
  CHECK(took.reused == 12);
  CHECK(ix.tokens_of(0) == cat(range(1, 12), {99}));
  ix.step_done(0, true);
  // The same whole prompt that another sequence holds: everything but its last token.
  auto same = ix.plan_step(1, 0, cat(range(1, 12), {99}));
  CHECK(same.donor == 0);
  CHECK(same.n == 12);
  CHECK(same.tokens == std::vector<token_id>{99});
  CHECK(ix.stats().reused_tokens == 24);
}

TEST_CASE("prefix index: positions a session drops are kept in the pool, once, and come back", "[prefix]") {
  prefix_index ix(1, 4, 4);
  ix.plan_step(0, 0, range(1, 20));
  ix.step_done(0, true);
  // A new conversation on the only session: its 20 positions go to kept sequence 1 first.
  auto p = ix.plan_step(0, 0, range(100, 10));
  CHECK(p.keep_into == 1);
  CHECK(p.kept == 20);
  ix.unpin(1);
  ix.step_done(0, true);
  CHECK(ix.tokens_of(1) == range(1, 20));
  // The first conversation again, longer: its 20 positions come from the kept sequence, and the second
  // conversation (10 positions) is kept in its turn.
  auto back = ix.plan_step(0, 0, cat(range(1, 20), range(200, 5)));
  CHECK(back.keep_into == 2);
  CHECK(back.kept == 10);
  CHECK(back.donor == 1);
  CHECK(back.n == 20);
  CHECK(back.tokens == range(200, 5));
  ix.unpin(2);
  ix.unpin(1);
  ix.step_done(0, true);
  // Moving on again: the first conversation's longer version takes the place of its shorter one (it
  // continues it), and nothing is kept twice.
  auto next = ix.plan_step(0, 0, range(300, 6));
  CHECK(next.keep_into == 1);
  CHECK(next.kept == 25);
  CHECK(ix.tokens_of(1) == cat(range(1, 20), range(200, 5)));
  ix.unpin(1);
  ix.step_done(0, true);
  const auto s = ix.stats();
  CHECK(s.kept_now == 2);
  CHECK(s.kept_tokens_now == 35);
  CHECK(s.kept_conversations == 3);
  // Fewer positions than min_kept are not worth keeping.
  ix.plan_step(0, 0, range(400, 3));
  ix.step_done(0, true);
  auto small = ix.plan_step(0, 0, range(500, 3));
  CHECK(small.keep_into == -1);
}

TEST_CASE("prefix index: eviction takes the least recently used kept conversation, never a pinned or live one", "[prefix]") {
  prefix_index ix(1, 4, 2);
  for (token_id c = 0; c < 3; ++c) {  // three conversations, each kept when the next one starts
    auto p = ix.plan_step(0, 0, range(100 * (c + 1), 8));
    if (p.keep_into >= 0) ix.unpin(p.keep_into);
    ix.step_done(0, true);
  }
  auto last = ix.plan_step(0, 0, range(900, 8));
  if (last.keep_into >= 0) ix.unpin(last.keep_into);
  ix.step_done(0, true);
  CHECK(ix.stats().kept_now == 3);  // conversations 100.., 200.., 300.. in sequences 1..3
  // Conversation 100 is used again (the donor, pinned until its share ran); keeping 900.. (what the step
  // drops) then takes the least recently used other place, 200..'s.
  auto use = ix.plan_step(0, 0, cat(range(100, 8), {7}));
  CHECK(use.donor == 1);
  CHECK(use.keep_into == 2);
  CHECK(ix.tokens_of(2) == range(900, 8));
  CHECK(ix.stats().evictions == 1);
  const int32_t pinned = use.donor;
  ix.unpin(use.keep_into);
  ix.step_done(0, true);
  CHECK(ix.evict_one() == 3);   // 300.., the least recently used
  CHECK(ix.evict_one() == 2);   // 900..
  CHECK(ix.evict_one() == -1);  // sequence 1 is pinned; sequence 0 is live
  ix.unpin(pinned);
  CHECK(ix.evict_one() == 1);
  CHECK(ix.stats().kept_now == 0);
  CHECK(ix.tokens_of(0) == cat(range(100, 8), {7}));
}

TEST_CASE("prefix index: an idle session's sequence is evicted once no kept conversation is left, and its next step starts over from position 0, restored from host memory", "[prefix]") {
  prefix_index ix(2, 4, 2, 1 << 20);
  ix.plan_step(0, 0, range(1, 10));
  ix.step_done(0, true);
  ix.plan_step(1, 0, range(100, 10));
  ix.step_done(1, true);
  CHECK(ix.evict_one() == -1);  // both live and answering
  ix.set_idle(0, true);         // sequence 0's session ended its answer
  std::vector<token_id> saved;
  CHECK(ix.evict_one(&saved) == 0);
  CHECK(saved == range(1, 10));
  CHECK(ix.stats().idle_evictions == 1);
  CHECK(ix.evict_one() == -1);  // once only; sequence 1 is not idle
  CHECK(ix.tokens_of(0) == range(1, 10));  // still known: the session believes it holds them
  ix.store(saved, std::vector<uint8_t>(10 * 4, 7));
  // The session's next turn keeps its 10 positions and adds 2: planned as the whole prompt, the 10 written
  // back from host memory (reused -0: nothing beyond its own keep), the rest decoded.
  ix.set_idle(0, false);
  auto next = ix.plan_step(0, 10, std::vector<token_id>{50, 51});
  REQUIRE(next.restore != nullptr);
  CHECK(next.n == 10);
  CHECK(next.keep == 10);
  CHECK(next.tokens == std::vector<token_id>{50, 51});
  CHECK(next.reused == 0);
  ix.step_done(0, true);
  // Evicted again, eviction and saving in one step (the pipeline's evictor): the 12 positions come back.
  ix.set_idle(0, true);
  int32_t saved_n = 0;
  CHECK(ix.evict_saving([&](int32_t seq, int32_t n) {
    CHECK(seq == 0);
    saved_n = n;
    return std::vector<uint8_t>(static_cast<size_t>(n) * 4, 9);
  }) == 0);
  CHECK(saved_n == 12);
  ix.set_idle(0, false);
  auto again = ix.plan_step(0, 12, std::vector<token_id>{52});
  REQUIRE(again.restore != nullptr);
  CHECK(again.n == 12);
  CHECK(again.tokens == std::vector<token_id>{52});
  // Evicted with nothing saved: the whole prompt decoded from position 0, and reused says how many
  // positions before the step's keep that costs.
  prefix_index bare(1, 2, 2);  // no host memory
  bare.plan_step(0, 0, range(1, 6));
  bare.step_done(0, true);
  bare.set_idle(0, true);
  CHECK(bare.evict_one() == 0);
  auto whole = bare.plan_step(0, 6, std::vector<token_id>{60});
  CHECK(whole.keep == 0);
  CHECK(whole.tokens == cat(range(1, 6), {60}));
  CHECK(whole.reused == -6);
}

TEST_CASE("prefix index: host memory holds at most its limit, dropping the least recently used conversation", "[prefix][prompt-cache]") {
  prefix_index ix(1, 2, 2, 100);  // 100 bytes of host memory
  ix.store(range(100, 10), std::vector<uint8_t>(40, 1));
  ix.store(range(200, 10), std::vector<uint8_t>(40, 2));
  CHECK(ix.stats().host_bytes == 80);
  // 100.. used again (a step planned from it): 200.. is now the least recently used.
  auto p = ix.plan_step(0, 0, cat(range(100, 10), {7}));
  REQUIRE(p.restore != nullptr);
  ix.step_done(0, true);
  ix.store(range(300, 10), std::vector<uint8_t>(40, 3));
  CHECK(ix.stats().host_bytes == 80);  // back within the limit
  CHECK(ix.stats().host_entries == 2);
  CHECK(ix.plan_step(0, 0, cat(range(200, 10), {7})).restore == nullptr);  // dropped
  ix.step_done(0, true);
  CHECK(ix.plan_step(0, 0, cat(range(300, 10), {7})).restore != nullptr);
  ix.step_done(0, true);
  // A conversation larger than the limit is not kept at all; a longer turn of one replaces it.
  ix.store(range(400, 30), std::vector<uint8_t>(120, 4));
  CHECK(ix.stats().host_bytes == 80);
  ix.store(range(300, 12), std::vector<uint8_t>(48, 5));
  CHECK(ix.stats().host_entries == 2);
  CHECK(ix.stats().host_bytes == 88);
}

TEST_CASE("prefix index: after a failed decode only the positions decoded before stay shareable", "[prefix]") {
  prefix_index ix(2, 4, 2);
  ix.plan_step(0, 0, range(1, 8));
  ix.step_done(0, true);
  ix.plan_step(0, 8, range(9, 8));  // positions 8..15
  ix.step_done(0, false);
  CHECK(ix.tokens_of(0) == range(1, 8));
  auto p = ix.plan_step(1, 0, range(1, 16));
  CHECK(p.donor == 0);
  CHECK(p.n == 8);
  // A session that believes it holds more than the index knows is never a donor until it forgets.
  auto lost = ix.plan_step(0, 12, std::vector<token_id>{99});
  CHECK(lost.donor == -1);
  CHECK(ix.tokens_of(0).empty());
  CHECK(ix.forget(0) == std::pair<int32_t, int32_t>{-1, 0});
}

TEST_CASE("kv cache: a sequence saved to host bytes and written back gives the logits of the original, bit for bit on the CPU", "[prefix][prompt-cache]") {
  const auto path = test::model_path("stories260K.gguf");
  if (!path) return;
  auto m = llm::model::load(*path);
  test::check_kv_round_trip(*m, 0.0f);
}
