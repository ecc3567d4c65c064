// expect: plan::colocate<3>: the 4 pieces of plan::trans<Split<Head>, 4> cannot be grouped 3 per device
#include <loom/plan/combinators.hpp>

using namespace loom;

const auto rule = plan::on_all(plan::trans<Split<Dim::Head>, 4>{}, plan::colocate<3>);

int main() {}
