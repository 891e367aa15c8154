// Registers every backend compiled into this build with troupe::registry. Idempotent; call it once at
// start-up (tools, tests, embedders) before looking devices up.
//
//   troupe::register_builtin_backends();
//   for (troupe::device_i* dev : troupe::registry::instance().devices()) ...
#pragma once

namespace troupe {

void register_builtin_backends();

}  // namespace troupe
