// expect: before{forward(micro, 2), backward(micro, round 2)} names backward round 2
#include <loom/plan/combinators.hpp>

using namespace loom;
using namespace loom::schedule::var;

constexpr schedule::before backward_of_round_two{forward(micro, 2),
                                                 schedule::block_pattern{schedule::pass_kind::backward, 2, micro}};
constexpr auto space = plan::compose(plan::devices<2>, plan::stages<2>,
                                     plan::order<plan::ordered_by<3, backward_of_round_two>>);

int main() {}
