// expect: the plan already says plan::stage_boundaries<2>
#include <loom/plan/combinators.hpp>

using namespace loom;

constexpr auto space =
    plan::compose(plan::devices<2>, plan::stages<2>, plan::stage_boundaries<2>, plan::open_stage_boundaries<"cut", 1>);

int main() {}
