// The pipeline works end to end: loom's headers are found, errors form one hierarchy and
// keep the message they were thrown with.
#include <loom/core/error.hpp>

#include <catch2/catch.hpp>

#include <string>
#include <type_traits>

TEST_CASE("every loom error derives from loom::error and std::runtime_error") {
    STATIC_REQUIRE(std::is_base_of_v<loom::error, loom::shape_error>);
    STATIC_REQUIRE(std::is_base_of_v<loom::error, loom::plan_error>);
    STATIC_REQUIRE(std::is_base_of_v<loom::error, loom::data_error>);
    STATIC_REQUIRE(std::is_base_of_v<loom::error, loom::usage_error>);
    STATIC_REQUIRE(std::is_base_of_v<loom::error, loom::comm_error>);
    STATIC_REQUIRE(std::is_base_of_v<std::runtime_error, loom::error>);
}

TEST_CASE("a shape_error is caught as loom::error and carries its message") {
    const std::string message = "linear: inner extent 64 of 'x' does not match 128 of 'w'";
    try {
        throw loom::shape_error(message);
    } catch (const loom::error& e) {
        CHECK(std::string(e.what()) == message);
        CHECK(dynamic_cast<const loom::shape_error*>(&e) != nullptr);
        CHECK(dynamic_cast<const loom::plan_error*>(&e) == nullptr);
        return;
    }
    FAIL("loom::shape_error was not caught as loom::error");
}
