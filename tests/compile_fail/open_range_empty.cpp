// expect: the range Pow2<8, 2> of the open degree is empty
#include <loom/plan/combinators.hpp>

using namespace loom;

const auto rule = plan::on_all(plan::trans<Split<Dim::Batch>, plan::open<Pow2<8, 2>>>{});

int main() {}
