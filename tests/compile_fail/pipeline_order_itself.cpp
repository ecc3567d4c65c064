// expect: before{forward(micro + 1), forward(micro + 1)}: orders every block before itself, which no schedule can do
#include <loom/plan/combinators.hpp>

using namespace loom;
using namespace loom::schedule::var;

constexpr auto space = plan::compose(plan::devices<2>, plan::stages<2>,
                                     plan::order<plan::ordered_by<1, schedule::before{forward(micro + 1), forward(micro + 1)}>>);

int main() {}
