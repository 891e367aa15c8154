// actors/fan_in.h: the reply counter the actors wait on several answers with.
#include <catch2/catch.hpp>

#include "actors/fan_in.h"

using troupe::actors::fan_in;

TEST_CASE("fan_in runs its continuation once, after the last of n arrivals", "[actors][fan_in]") {
  int runs = 0;
  fan_in join(3, [&] { ++runs; });
  const fan_in copy = join;  // copies share the count (each reply handler holds one)
  join();
  copy();
  CHECK(runs == 0);
  join();
  CHECK(runs == 1);
  copy();  // more arrivals than expected change nothing
  CHECK(runs == 1);

  int now = 0;
  fan_in none(0, [&] { ++now; });  // nothing to wait for: at once
  CHECK(now == 1);
  none();
  CHECK(now == 1);

  int later = 0;
  fan_in grow(1, [&] { ++later; });  // one for the sender, one more per request it sends
  grow.expect();
  grow.expect();
  grow();
  grow();
  CHECK(later == 0);
  grow();
  CHECK(later == 1);
  fan_in empty_done(1, nullptr);  // no continuation: nothing runs, nothing throws
  CHECK_NOTHROW(empty_done());
}
