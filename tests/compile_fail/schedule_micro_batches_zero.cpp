// expect: order<GPipe<2>>::make<0>: 0 micro-batches
#include <loom/plan/order.hpp>

using namespace loom::schedule;

int main() { return static_cast<int>(order<GPipe<2>>::make<0>().device_order.size()); }
