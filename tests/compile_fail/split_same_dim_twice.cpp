// expect: Split<Head> appears twice (the same dim split twice)
#include <loom/plan/combinators.hpp>

using namespace loom;

const auto rule = plan::on_all(plan::trans<Split<Dim::Head>, 2, Split<Dim::Head>, 2>{});

int main() {}
