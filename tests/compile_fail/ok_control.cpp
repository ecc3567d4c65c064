// The control of the compile-fail tests: this must compile (check.cmake -DEXPECT_SUCCESS=1),
// so a broken include path or flag cannot make every compile-fail test "pass". It also shows
// that plan::well_formed answers false for the mistakes above without a hard error.
#include <loom/ops/attention.hpp>
#include <loom/ops/cross_entropy.hpp>
#include <loom/ops/layer_norm.hpp>
#include <loom/ops/linear.hpp>
#include <loom/plan/combinators.hpp>

using namespace loom;

constexpr auto space = plan::compose(
    plan::devices<8>, plan::extent<Dim::Head, 12>, plan::forbid<Split<Dim::Seq>>,
    plan::on_all(plan::trans<Split<Dim::Batch>, plan::open<Pow2<1, 8>, "dp">>{}),
    plan::on<ops::Attention>(plan::trans<Split<Dim::Batch>, plan::open<Pow2<1, 8>, "dp">, Split<Dim::Head>, 2>{}),
    plan::on<ops::LinearBias>(plan::trans<Split<Var<"k">>, 4>{}),
    plan::on<ops::CrossEntropy>(plan::trans<Split<Dim::Vocab>, 4>{}),  // vocabulary-parallel loss
    plan::on_layers<"blocks", 0, 3>(plan::recompute));
static_assert(plan::well_formed<decltype(space)>);

static_assert(!plan::well_formed<plan::trans<Split<Dim::Batch>, 0>>);
static_assert(!plan::well_formed<decltype(plan::on<ops::Attention>(plan::trans<Split<Dim::Seq>, 2>{}))>);
static_assert(!plan::well_formed<decltype(plan::on<ops::LayerNorm>(plan::trans<Split<Var<"h">>, 2>{}))>);
static_assert(!plan::well_formed<plan::devices_t<8>, decltype(plan::on_all(plan::trans<Split<Dim::Batch>, 3>{}))>);

int main() { return space.open_parameters().size() == 1 ? 0 : 1; }
