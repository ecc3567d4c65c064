// expect: plan::extent<Head, 12> is not divisible by the degree 8 of Split<Head>
#include <loom/plan/combinators.hpp>

using namespace loom;

constexpr auto space = plan::compose(plan::extent<Dim::Head, 12>, plan::on_all(plan::trans<Split<Dim::Head>, 8>{}));

int main() {}
