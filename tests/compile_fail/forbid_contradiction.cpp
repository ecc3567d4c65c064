// expect: plan::forbid<Split<Seq>>: plan::trans<Split<Seq>, 2> in on_all splits Seq, which the plan forbids
#include <loom/plan/combinators.hpp>

using namespace loom;

constexpr auto space = plan::compose(plan::devices<2>, plan::forbid<Split<Dim::Seq>>,
                                     plan::on_all(plan::trans<Split<Dim::Seq>, 2>{}));

int main() {}
