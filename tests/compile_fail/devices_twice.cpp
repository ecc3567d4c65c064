// expect: plan::devices<4>: the plan already says plan::devices<8>
#include <loom/plan/combinators.hpp>

using namespace loom;

constexpr auto space =
    plan::compose(plan::devices<8>, plan::on_all(plan::trans<Split<Dim::Batch>, 2>{}), plan::devices<4>);

int main() {}
