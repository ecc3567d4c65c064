// expect: no value of OneOf<3, 5> divides devices<8>
#include <loom/plan/combinators.hpp>

using namespace loom;

constexpr auto space =
    plan::compose(plan::devices<8>, plan::on_all(plan::trans<Split<Dim::Batch>, plan::open<OneOf<3, 5>>>{}));

int main() {}
