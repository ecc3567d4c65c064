// Catch2's main(), compiled once (object library loom_catch_main) and linked into every
// tests/test_*.cpp executable, so each test file only holds test cases.
#define CATCH_CONFIG_MAIN
#include <catch2/catch.hpp>
