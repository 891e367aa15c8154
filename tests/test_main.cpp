// The Catch2 main shared by every troupe test binary. A test case that asserts nothing fails (Catch's
// NoAssertions warning, always on): a case whose checks were all skipped by mistake cannot pass. A case that
// skips on purpose says so through tests/support/skip.h, and ctest reports it as Skipped.
#define CATCH_CONFIG_RUNNER
#include <catch2/catch.hpp>

int main(int argc, char* argv[]) {
  Catch::Session session;
  if (const int rc = session.applyCommandLine(argc, argv); rc != 0) return rc;
  Catch::ConfigData& cfg = session.configData();
  cfg.warnings = static_cast<Catch::WarnAbout::What>(cfg.warnings | Catch::WarnAbout::NoAssertions);
  return session.run();
}
