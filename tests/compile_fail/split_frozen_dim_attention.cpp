// expect: plan::trans<Split<Seq>, 2> on attention: Seq is frozen in this op
// attention binds s and t to Seq and freezes both (a softmax row needs every key).
#include <loom/ops/attention.hpp>
#include <loom/plan/combinators.hpp>

using namespace loom;

const auto rule = plan::on<ops::Attention>(plan::trans<Split<Dim::Seq>, 2>{});

int main() {}
