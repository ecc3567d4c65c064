// expect: plan::zero<4>: ZeRO has stages 1, 2 and 3
#include <loom/plan/combinators.hpp>

using namespace loom;

constexpr auto space = plan::compose(plan::devices<2>, plan::zero<4>);

int main() {}
