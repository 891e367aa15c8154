// AddressSanitizer's defaults for every troupe program built with -DTROUPE_SANITIZE=ON / address (troupe_target
// adds this file to each executable). ASAN_OPTIONS in the environment still overrides them.

extern "C" __attribute__((visibility("default"), used)) const char* __asan_default_options() {
  // allocator_may_return_null: a failed allocation returns null (or throws bad_alloc), as it does without the
  // sanitizer, so the code that handles it runs (an RPC client asking the peer for 4 EiB gets an error,
  // tests/net); ASan's default ends the program instead.
  return "allocator_may_return_null=1";
}
