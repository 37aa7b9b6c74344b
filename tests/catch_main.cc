// One Catch2 main for every test binary (compiled once).
#define CATCH_CONFIG_MAIN
#include <catch2/catch.hpp>
