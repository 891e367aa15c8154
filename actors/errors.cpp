#include "actors/errors.h"

#include <caf/message.hpp>
#include <caf/make_message.hpp>
#include <caf/to_string.hpp>

#include "loader/model_loader.h"
#include "llm/sampler.h"

namespace troupe::actors {

std::string_view errc_name(errc e) {
  switch (e) {
    case errc::failed: return "failed";
    case errc::cancelled: return "cancelled";
    case errc::not_found: return "not_found";
    case errc::bad_request: return "bad_request";
    case errc::out_of_memory: return "out_of_memory";
    case errc::busy: return "busy";
    case errc::down: return "down";
    case errc::capacity: return "capacity";
    case errc::refused: return "refused";
    case errc::unavailable: return "unavailable";
  }
  return "unknown";
}

caf::error make_error(errc code, std::string message) {
  return caf::error(static_cast<uint8_t>(code), error_category, caf::make_message(std::move(message)));
}

caf::error error_from(const std::exception& e) {
  const std::string what = e.what();
  if (dynamic_cast<const load_cancelled*>(&e) != nullptr) return make_error(errc::cancelled, what);
  if (dynamic_cast<const capacity_error*>(&e) != nullptr) return make_error(errc::capacity, what);
  if (dynamic_cast<const out_of_memory_error*>(&e) != nullptr) return make_error(errc::out_of_memory, what);
  if (dynamic_cast<const unavailable_error*>(&e) != nullptr) return make_error(errc::unavailable, what);
  if (dynamic_cast<const llm::sampling_error*>(&e) != nullptr) return make_error(errc::bad_request, what);
  return make_error(errc::failed, what);
}

bool is(const caf::error& e, errc code) {
  return e.category() == error_category && e.code() == static_cast<uint8_t>(code);
}

std::string describe(const caf::error& e) {
  if (!e) return "no error";
  if (e.category() == error_category) {
    std::string s(errc_name(static_cast<errc>(e.code())));
    const caf::message& ctx = e.context();
    if (ctx.match_elements<std::string>()) s += ": " + ctx.get_as<std::string>(0);
    return s;
  }
  return caf::to_string(e);
}

}  // namespace troupe::actors
