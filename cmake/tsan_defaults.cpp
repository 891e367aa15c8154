// ThreadSanitizer's defaults for every troupe program built with -DTROUPE_SANITIZE=thread (troupe_target adds
// this file to each executable): a report ends the program with an error, so a test that races fails, and the
// suppressions below, each with its reason. TSAN_OPTIONS in the environment still overrides the options.
// Only code we do not build may be suppressed here; a race in troupe's own code is fixed, not hidden.

extern "C" __attribute__((visibility("default"), used)) const char* __tsan_default_options() {
  // allocator_may_return_null: a failed allocation returns null, as it does without the sanitizer, so the
  // code that handles it runs (an RPC client asking the peer for 4 EiB gets an error, tests/net); TSan's
  // default ends the program instead.
  return "halt_on_error=1:second_deadlock_stack=1:allocator_may_return_null=1";
}

extern "C" __attribute__((visibility("default"), used)) const char* __tsan_default_suppressions() {
  return "";
}
