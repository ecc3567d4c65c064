// expect: plan::stages<0>: 0 stages
#include <loom/plan/combinators.hpp>

using namespace loom;

constexpr auto space = plan::compose(plan::devices<2>, plan::stages<0>);

int main() {}
