// expect: constraint #1: before{forward(micro + stages - stage - 1, 3), backward(micro)} names forward round 3, but the pipeline has 3 forward rounds (0..2)
#include <loom/plan/order.hpp>

using namespace loom::schedule;
using namespace loom::schedule::var;

// Table 7 counts rounds from 1 (f1, f2, f3); loom counts from 0, so the last round is 2.
constexpr before rounds_in_order{forward(micro + 1, 0), forward(micro, 1)};
constexpr before last_round_first{forward(micro + stages - stage - 1, 3), backward(micro)};

int main() {
    return static_cast<int>(order<FromConstraints<4, 3, rounds_in_order, last_round_first>>::make(8).device_order.size());
}
