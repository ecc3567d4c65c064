// expect: order<Interleaved<4, 2>>::make<6>: 6 micro-batches is not a multiple of the 4 pipeline stages
#include <loom/plan/order.hpp>

using namespace loom::schedule;

int main() { return static_cast<int>(order<Interleaved<4, 2>>::make<6>().device_order.size()); }
