// expect: plan::micro_batches<0>: 0 micro-batches
#include <loom/plan/combinators.hpp>

using namespace loom;

constexpr auto space = plan::compose(plan::devices<2>, plan::stages<2>, plan::micro_batches<0>);

int main() {}
