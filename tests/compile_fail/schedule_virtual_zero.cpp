// expect: order<Interleaved<4, 0>>: 0 virtual stages per device
#include <loom/plan/order.hpp>

using namespace loom::schedule;

int main() { return static_cast<int>(order<Interleaved<4, 0>>::make(8).device_order.size()); }
