// expect: plan::Interleaved<V>: V is the number of model chunks per device group
#include <loom/plan/combinators.hpp>

using namespace loom;

constexpr auto space = plan::compose(plan::devices<2>, plan::stages<2>, plan::order<plan::Interleaved<0>>);

int main() {}
