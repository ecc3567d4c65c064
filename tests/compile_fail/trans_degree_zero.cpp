// expect: plan::trans<Split<Batch>, 0>: the degree of Split<Batch> is 0
// A degree below 1 is refused where the trans is written.
#include <loom/plan/combinators.hpp>

using namespace loom;

const auto rule = plan::on_all(plan::trans<Split<Dim::Batch>, 0>{});

int main() {}
