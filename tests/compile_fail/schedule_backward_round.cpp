// expect: before{forward(micro, 2), backward(micro, round 2)} names backward round 2
#include <loom/plan/order.hpp>

using namespace loom::schedule;
using namespace loom::schedule::var;

constexpr before backward_of_round_two{forward(micro, 2), block_pattern{pass_kind::backward, 2, micro}};

int main() { return static_cast<int>(order<FromConstraints<2, 3, backward_of_round_two>>::make(4).device_order.size()); }
