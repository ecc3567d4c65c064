#pragma once
// Every op kind loom ships, as one type list. Backends build their kernel tables from it,
// and plan files look op kinds up in it by name.
#include <boost/mp11/algorithm.hpp>
#include <boost/mp11/list.hpp>

#include <loom/ops/add.hpp>
#include <loom/ops/assemble.hpp>
#include <loom/ops/fill.hpp>
#include <loom/ops/identity.hpp>
#include <loom/ops/linear.hpp>
#include <loom/ops/mul.hpp>
#include <loom/ops/reduce.hpp>
#include <loom/ops/scale.hpp>
#include <loom/ops/stop_gradient.hpp>
// ops-includes: elementwise
#include <loom/ops/dropout.hpp>
#include <loom/ops/gelu.hpp>
#include <loom/ops/relu.hpp>
#include <loom/ops/silu.hpp>
#include <loom/ops/softmax.hpp>
// ops-includes: normalization
#include <loom/ops/layer_norm.hpp>
#include <loom/ops/rms_norm.hpp>
// ops-includes: attention and shapes
#include <loom/ops/attention.hpp>
#include <loom/ops/heads.hpp>
#include <loom/ops/matmul.hpp>
#include <loom/ops/reshape.hpp>
#include <loom/ops/transpose.hpp>
// ops-includes: embedding and loss
#include <loom/ops/cross_entropy.hpp>
#include <loom/ops/embedding.hpp>
#include <loom/ops/vocab_parallel_cross_entropy.hpp>

namespace loom::ops {

using core_ops = boost::mp11::mp_list<FillLike, Identity, StopGradient, Add, Mul, Scale, Sum, Mean, SumLeading,
                                      BroadcastScalar, Linear, LinearBias, LinearGradInput, LinearGradWeight>;
using elementwise_ops = boost::mp11::mp_list<Gelu, GeluGrad, Relu, ReluGrad, Silu, SiluGrad, Softmax, SoftmaxGrad, Dropout,
                                              DropoutGrad>;
using normalization_ops = boost::mp11::mp_list<LayerNorm, LayerNormGrad, RmsNorm, RmsNormGrad>;
using attention_ops = boost::mp11::mp_list<Matmul, MatmulNT, MatmulTN, Reshape, Transpose, SplitHeads, MergeHeads,
                                           Attention, AttentionGrad>;
using embedding_loss_ops = boost::mp11::mp_list<Embedding, EmbeddingGrad, CrossEntropy, CrossEntropyGrad, ChunkLogsumexp,
                                                 ChunkLogsumexpGrad, RaggedChunkLogsumexp, RaggedChunkLogsumexpGrad,
                                                 PickTarget, PickTargetGrad, CrossEntropyFromChunks,
                                                 CrossEntropyFromChunksGrad>;

// What plans insert between the pieces of partitioned ops.
using partition_ops = boost::mp11::mp_list<Assemble, Transfer>;

using all_ops = boost::mp11::mp_append<core_ops, elementwise_ops, normalization_ops, attention_ops, embedding_loss_ops,
                                       partition_ops>;

}  // namespace loom::ops
