// expect: the plan requires colocated ops to recompute (plan::colocation_requires_recompute)
// Coshard: colocated pieces run one after another, and only recompute keeps one piece's
// activations alive at a time.
#include <loom/ops/attention.hpp>
#include <loom/plan/combinators.hpp>

using namespace loom;

constexpr auto space = plan::compose(plan::devices<2>, plan::colocation_requires_recompute,
                                     plan::on<ops::Attention>(plan::trans<Split<Dim::Head>, 4>{}, plan::colocate<2>));

int main() {}
