// A request from a test thread to an actor, waited for: the reply, or the error (a timeout included).
//
//   const auto info = test::ask<model_info>(sys, supervisor, load_atom_v, request);
//   if (!info) FAIL(describe(info.error()));
#pragma once

#include <caf/all.hpp>

#include <chrono>
#include <utility>

namespace troupe::test {

template <class T, class Handle, class... Ts>
caf::expected<T> ask_within(std::chrono::seconds limit, caf::actor_system& sys, const Handle& h, Ts&&... xs) {
  caf::scoped_actor self{sys};
  caf::expected<T> out{caf::error{}};
  self->request(h, limit, std::forward<Ts>(xs)...)
      .receive([&](T& v) { out = std::move(v); }, [&](caf::error& e) { out = std::move(e); });
  return out;
}

template <class T, class Handle, class... Ts>
caf::expected<T> ask(caf::actor_system& sys, const Handle& h, Ts&&... xs) {
  return ask_within<T>(std::chrono::seconds(60), sys, h, std::forward<Ts>(xs)...);
}

}  // namespace troupe::test
