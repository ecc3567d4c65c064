// expect: plan::stages<4>: 4 stages do not divide devices<6>
#include <loom/plan/combinators.hpp>

using namespace loom;

constexpr auto space = plan::compose(plan::devices<6>, plan::stages<4>);

int main() {}
