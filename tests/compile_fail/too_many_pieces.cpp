// expect: plan::trans<Split<Batch>, 4, Split<Head>, 2>: 8 pieces but devices<4>
// Without colocation each piece needs a device of its own.
#include <loom/plan/combinators.hpp>

using namespace loom;

constexpr auto space =
    plan::compose(plan::devices<4>, plan::on_all(plan::trans<Split<Dim::Batch>, 4, Split<Dim::Head>, 2>{}));

int main() {}
