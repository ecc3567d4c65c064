// expect: plan::stage_boundaries<3, 2>: layer 2 does not come after 3
#include <loom/plan/combinators.hpp>

using namespace loom;

constexpr auto space = plan::compose(plan::devices<3>, plan::stages<3>, plan::stage_boundaries<3, 2>);

int main() {}
