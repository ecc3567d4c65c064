#pragma once
// Every op kind loom ships, as one type list. Backends build their kernel tables from it,
// and plan files look op kinds up in it by name.
#include <boost/mp11/algorithm.hpp>
#include <boost/mp11/list.hpp>

#include <loom/ops/add.hpp>
#include <loom/ops/fill.hpp>
#include <loom/ops/identity.hpp>
#include <loom/ops/linear.hpp>
#include <loom/ops/mul.hpp>
#include <loom/ops/reduce.hpp>
#include <loom/ops/scale.hpp>
// ops-includes: elementwise
// ops-includes: normalization
// ops-includes: attention and shapes
// ops-includes: embedding and loss

namespace loom::ops {

using core_ops = boost::mp11::mp_list<FillLike, Identity, Add, Mul, Scale, Sum, Mean, SumLeading, BroadcastScalar, Linear,
                                      LinearBias, LinearGradInput, LinearGradWeight>;
using elementwise_ops = boost::mp11::mp_list<>;
using normalization_ops = boost::mp11::mp_list<>;
using attention_ops = boost::mp11::mp_list<>;
using embedding_loss_ops = boost::mp11::mp_list<>;

using all_ops = boost::mp11::mp_append<core_ops, elementwise_ops, normalization_ops, attention_ops, embedding_loss_ops>;

}  // namespace loom::ops
