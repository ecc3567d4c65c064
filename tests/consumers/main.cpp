// The program every consumer test (find_package, add_subdirectory, fetch_content) builds
// and runs. It only has to include loom through the consumer's target and call into it;
// exit code 0 means the target carried everything needed.
#include <loom/core/error.hpp>

#include <iostream>

int main() {
    try {
        throw loom::shape_error("consumer: loom is usable from this project");
    } catch (const loom::error& e) {
        std::cout << e.what() << '\n';
        return 0;
    }
    return 1;
}
