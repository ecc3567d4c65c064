// expect: plan::stages<2, 3>: 2 stages of 3 devices make 6, but the plan has devices<4>
#include <loom/plan/combinators.hpp>

using namespace loom;

constexpr auto space = plan::compose(plan::devices<4>, plan::stages<2, 3>);

int main() {}
