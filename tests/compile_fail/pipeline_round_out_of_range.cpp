// expect: constraint #1: before{forward(micro + stages - stage - 1, 3), backward(micro)} names forward round 3, but the pipeline has 3 forward rounds (0..2)
// Table 7 counts rounds from 1 (f1, f2, f3); loom counts from 0, so the last round is 2.
#include <loom/plan/combinators.hpp>

using namespace loom;
using namespace loom::schedule::var;

constexpr schedule::before rounds_in_order{forward(micro + 1, 0), forward(micro, 1)};
constexpr schedule::before last_round_first{forward(micro + stages - stage - 1, 3), backward(micro)};
constexpr auto space = plan::compose(plan::devices<4>, plan::stages<4>,
                                     plan::order<plan::ordered_by<3, rounds_in_order, last_round_first>>);

int main() {}
