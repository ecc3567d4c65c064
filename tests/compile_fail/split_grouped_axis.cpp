// expect: Hidden is the grouped axis (h d) of this op, not one of its variables
// split_heads reads Hidden as the group (h d); cutting it is splitting Head.
#include <loom/ops/heads.hpp>
#include <loom/plan/combinators.hpp>

using namespace loom;

const auto rule = plan::on<ops::SplitHeads>(plan::trans<Split<Dim::Hidden>, 2>{});

int main() {}
