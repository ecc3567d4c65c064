// expect: order<OneFOneB<0>>: 0 pipeline stages
#include <loom/plan/order.hpp>

using namespace loom::schedule;

int main() { return static_cast<int>(order<OneFOneB<0>>::make(4).device_order.size()); }
