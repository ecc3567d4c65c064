// expect: the first layer 3 comes after the last 1
#include <loom/plan/combinators.hpp>

using namespace loom;

const auto rule = plan::on_layers<"blocks", 3, 1>(plan::recompute);

int main() {}
