// expect: pass_one_value_per_runtime_degree
// A runtime degree is a constructor argument: trans<Split<Dim::Batch>, runtime>{n}.
#include <loom/plan/combinators.hpp>

using namespace loom;

const auto rule = plan::on_all(plan::trans<Split<Dim::Batch>, plan::runtime>{});

int main() {}
