// expect: plan::zero<open<OneOf<0, 4>>>: ZeRO stage 4 is not one of 0, 1, 2 and 3
#include <loom/plan/combinators.hpp>

using namespace loom;

constexpr auto space = plan::compose(plan::devices<2>, plan::zero<plan::open<OneOf<0, 4>>>);

int main() {}
