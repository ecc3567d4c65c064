// expect: is frozen in this op (splitting it would change the result)
// layer_norm freezes h ("... h^, h^, h^ -> ... h^"): mean and variance need the whole row.
#include <loom/ops/layer_norm.hpp>
#include <loom/plan/combinators.hpp>

using namespace loom;

const auto rule = plan::on<ops::LayerNorm>(plan::trans<Split<Var<"h">>, 2>{});

int main() {}
