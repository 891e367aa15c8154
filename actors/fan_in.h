// Waiting in an actor for several answers: `done` runs once, when the last of them has arrived. Copies
// share one count (capture it in every reply handler); an actor runs its handlers one at a time, so the
// count needs no lock.
//
//   fan_in join(allocators.size(), [rp]() mutable { rp.deliver(true); });   // n == 0: done runs now
//   for (const allocator_actor& a : allocators) {
//     self->request(a, caf::infinite, release_atom_v, owner).then([join](uint64_t) { join(); },
//                                                                 [join](const caf::error&) { join(); });
//   }
//
// When the number is not known up front, start with one for the sender itself, expect() one more per
// request, and call it once after the last request went out.
#pragma once

#include <cstddef>
#include <functional>
#include <memory>
#include <utility>

namespace troupe::actors {

class fan_in {
 public:
  fan_in(size_t n, std::function<void()> done) : state_(std::make_shared<state>(state{n, std::move(done)})) {
    if (n == 0) fire();
  }

  // One more answer to wait for (before the last one has arrived).
  void expect() const { ++state_->left; }
  // One answer arrived; the last runs `done`.
  void operator()() const {
    if (state_->left > 0 && --state_->left == 0) fire();
  }

 private:
  struct state {
    size_t left;
    std::function<void()> done;
  };
  void fire() const {
    if (auto d = std::exchange(state_->done, nullptr)) d();
  }
  std::shared_ptr<state> state_;
};

}  // namespace troupe::actors
