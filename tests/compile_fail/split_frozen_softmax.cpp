// expect: register a custom transformation for softmax
// softmax freezes its row n ("... n^ -> ... n^"): normalizing needs every element of the row.
#include <loom/ops/softmax.hpp>
#include <loom/plan/combinators.hpp>

using namespace loom;

const auto rule = plan::on<ops::Softmax>(plan::trans<Split<Var<"n">>, 4>{});

int main() {}
