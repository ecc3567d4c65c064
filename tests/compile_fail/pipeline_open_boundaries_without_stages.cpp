// expect: boundaries without plan::stages<N>
#include <loom/plan/combinators.hpp>

using namespace loom;

constexpr auto space = plan::compose(plan::devices<2>, plan::open_stage_boundaries<"cut">);

int main() {}
