// The Catch2 main shared by every troupe test binary.
#define CATCH_CONFIG_MAIN
#include <catch2/catch.hpp>
