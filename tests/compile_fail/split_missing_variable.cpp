// expect: 2> on linear: the op has no variable
// linear is "... k, n k -> ... n": there is no variable x to split.
#include <loom/ops/linear.hpp>
#include <loom/plan/combinators.hpp>

using namespace loom;

const auto rule = plan::on<ops::Linear>(plan::trans<Split<Var<"x">>, 2>{});

int main() {}
