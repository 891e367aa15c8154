#include "backends/registry.h"

#include "backends/cpu/cpu_backend.h"

namespace troupe {

void register_builtin_backends() {
  cpu::register_cpu_backend();
}

}  // namespace troupe
