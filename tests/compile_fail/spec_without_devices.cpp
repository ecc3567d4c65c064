// expect: plan::compose(...).spec(): the plan has no plan::devices<N>
// Without devices<N> the device count is a run-time argument: spec(n).
#include <loom/plan/combinators.hpp>

using namespace loom;

constexpr auto space = plan::compose(plan::on_all(plan::trans<Split<Dim::Batch>, 2>{}));

int main() { (void)space.spec(); }
