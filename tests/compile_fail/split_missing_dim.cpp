// expect: plan::trans<Split<Hidden>, 4> on attention_grad: the op has no dim Hidden
// attention_grad's variables are Batch, Head, Seq and HeadDim: there is no Hidden to split.
#include <loom/ops/attention.hpp>
#include <loom/plan/combinators.hpp>

using namespace loom;

const auto rule = plan::on<ops::AttentionGrad>(plan::trans<Split<Dim::Hidden>, 4>{});

int main() {}
