// expect: plan::assign<0, 1, 2>: 3 devices for the 4 pieces of plan::trans<Split<Head>, 4>
#include <loom/plan/combinators.hpp>

using namespace loom;

const auto rule = plan::on_all(plan::trans<Split<Dim::Head>, 4>{}, plan::assign<0, 1, 2>);

int main() {}
