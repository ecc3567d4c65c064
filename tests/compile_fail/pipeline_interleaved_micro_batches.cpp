// expect: plan::order<Interleaved<2>>: 6 micro-batches (plan::micro_batches<6>) is not a multiple of the 4 stages
#include <loom/plan/combinators.hpp>

using namespace loom;

constexpr auto space = plan::compose(plan::devices<4>, plan::stages<4>, plan::micro_batches<6>, plan::order<plan::Interleaved<2>>);

int main() {}
