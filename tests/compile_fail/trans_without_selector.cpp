// expect: plan::compose: argument 2 is a trans, assign, colocate or recompute without a selector
#include <loom/plan/combinators.hpp>

using namespace loom;

constexpr auto space = plan::compose(plan::devices<2>, plan::trans<Split<Dim::Batch>, 2>{});

int main() {}
