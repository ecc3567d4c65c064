// expect: device 4 is outside devices<4> (0..3)
#include <loom/plan/combinators.hpp>

using namespace loom;

constexpr auto space =
    plan::compose(plan::devices<4>, plan::on_all(plan::trans<Split<Dim::Head>, 4>{}, plan::assign<0, 1, 2, 4>));

int main() {}
