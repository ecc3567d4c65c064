// expect: plan::stage_boundaries<1, 2>: 2 boundaries for 2 stage ranges (plan::stages<2>)
#include <loom/plan/combinators.hpp>

using namespace loom;

constexpr auto space = plan::compose(plan::devices<2>, plan::stages<2>, plan::stage_boundaries<1, 2>);

int main() {}
