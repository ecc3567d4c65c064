// expect: plan::trans<Split<Batch>, 4>: the degree 4 of Split<Batch> does not divide 2 devices of a stage
#include <loom/plan/combinators.hpp>

using namespace loom;

constexpr auto space = plan::compose(plan::devices<4>, plan::stages<2>, plan::on_all(plan::trans<Split<Dim::Batch>, 4>{}));

int main() {}
