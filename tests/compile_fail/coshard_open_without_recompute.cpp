// expect: the plan requires colocated ops to recompute (plan::colocation_requires_recompute)
// An open Coshard factor whose range leaves out 1 always colocates pieces, so the rule
// must recompute whichever value the searcher chooses.
#include <loom/ops/attention.hpp>
#include <loom/plan/combinators.hpp>

using namespace loom;

constexpr auto space = plan::compose(
    plan::devices<2>, plan::colocation_requires_recompute,
    plan::on<ops::Attention>(plan::trans<Split<Dim::Head>, 2>{}, plan::coshard<plan::open<OneOf<2, 4>, "cs">>));

int main() {}
