// expect: before{forward(micro + 1), forward(micro + 1)}: orders every block before itself, which no schedule can do
#include <loom/plan/order.hpp>

using namespace loom::schedule;
using namespace loom::schedule::var;

int main() {
    return static_cast<int>(
        order<FromConstraints<2, 1, before{forward(micro + 1), forward(micro + 1)}>>::make(4).device_order.size());
}
