// expect: register a custom transformation for cross_entropy
// cross_entropy freezes the vocabulary v ("... v^, ... -> "): the softmax needs every logit.
#include <loom/ops/cross_entropy.hpp>
#include <loom/plan/combinators.hpp>

using namespace loom;

const auto rule = plan::on<ops::CrossEntropy>(plan::trans<Split<Var<"v">>, 4>{});

int main() {}
