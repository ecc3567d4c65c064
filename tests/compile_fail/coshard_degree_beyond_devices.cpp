// expect: plan::trans<Split<Head>, 4>: the degree 4 of Split<Head> does not divide devices<2>
// Coshard's degrees count devices: the 4 heads' pieces need 4 devices; coshard<2> cuts each
// device's piece in 2 on top of them (to put 2 pieces on each device, colocate<2>).
#include <loom/ops/attention.hpp>
#include <loom/plan/combinators.hpp>

using namespace loom;

constexpr auto space = plan::compose(
    plan::devices<2>, plan::on<ops::Attention>(plan::trans<Split<Dim::Head>, 4>{}, plan::coshard<2>, plan::recompute));

int main() {}
