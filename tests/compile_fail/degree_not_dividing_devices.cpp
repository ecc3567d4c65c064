// expect: the degree 3 of Split<Batch> does not divide devices<8>
#include <loom/plan/combinators.hpp>

using namespace loom;

constexpr auto space = plan::compose(plan::devices<8>, plan::on_all(plan::trans<Split<Dim::Batch>, 3>{}));

int main() {}
