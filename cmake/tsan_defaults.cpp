// ThreadSanitizer's defaults for every troupe program built with -DTROUPE_SANITIZE=thread (troupe_target adds
// this file to each executable): a report ends the program with an error, so a test that races fails, and the
// suppressions below, each with its reason. TSAN_OPTIONS in the environment still overrides the options.
// Only code we do not build may be suppressed here; a race in troupe's own code is fixed, not hidden.

extern "C" __attribute__((visibility("default"), used)) const char* __tsan_default_options() {
  return "halt_on_error=1:second_deadlock_stack=1";
}

extern "C" __attribute__((visibility("default"), used)) const char* __tsan_default_suppressions() {
  return "";
}
