// expect: plan::order<OneFOneB>: the plan already says plan::order<GPipe>
#include <loom/plan/combinators.hpp>

using namespace loom;

constexpr auto space = plan::compose(plan::devices<2>, plan::stages<2>, plan::order<plan::GPipe>, plan::order<plan::OneFOneB>);

int main() {}
