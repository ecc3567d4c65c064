#pragma once
// Typed plan combinators: a parallelization plan written as C++ values whose types carry
// it, checked while it compiles and lowered to the run-time plan_spec (plan/rules.hpp), the
// one plan value that partition::apply_plan turns into ordered per-device programs.
//
//   using namespace loom;
//   constexpr auto plan = plan::compose(
//       plan::devices<4>,
//       plan::extent<Dim::Head, 12>,
//       plan::on_all(plan::trans<Split<Dim::Batch>, 2>{}),
//       plan::on<ops::Attention>(plan::trans<Split<Dim::Batch>, 2, Split<Dim::Head>, 2>{}),
//       plan::on_layers<"blocks", 0, 3>(plan::recompute));
//   resolved_plan resolved = plan.resolve(model.ir());
//
// The vocabulary, one header each:
//   plan/degree.hpp       degrees: a number, open<Range[, "name"]>, runtime, all_devices
//   plan/trans.hpp        op-trans: trans<Split<Dim::D> | Split<Var<"v">> | Replicate, degree, ...>
//   plan/assign.hpp       op-assign: assign<devices...>, colocate<C>; recompute
//   plan/selectors.hpp    on<Ops...>, on_name<"glob">, on_scope<"glob">, on_layers<"repeat", a, b>, on_all
//   plan/constraints.hpp  devices<N>, extent<D, E>, forbid<Split<D>>, colocation_requires_recompute, zero<S>
//   plan/pipeline_parts.hpp  stages<N[, per stage]>, stage_boundaries<...>, micro_batches<M>, order<Policy>
//   plan/compose.hpp      compose(...), .spec(), .resolve(graph), .choose(name, v), well_formed<...>
//   plan/checks.hpp       the checks, shared by compile time and run time
#include <loom/plan/assign.hpp>
#include <loom/plan/checks.hpp>
#include <loom/plan/compose.hpp>
#include <loom/plan/constraints.hpp>
#include <loom/plan/degree.hpp>
#include <loom/plan/pipeline_parts.hpp>
#include <loom/plan/selectors.hpp>
#include <loom/plan/trans.hpp>
