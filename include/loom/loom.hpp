#pragma once
// Entry header: includes the whole public API and nothing else.

// core
#include <loom/core/dim.hpp>
#include <loom/core/error.hpp>
#include <loom/core/fixed_string.hpp>
#include <loom/core/precision.hpp>
#include <loom/core/shape.hpp>
#include <loom/core/signature.hpp>
#include <loom/core/typed_signature.hpp>

// graph
#include <loom/graph/attributes.hpp>
#include <loom/graph/builder.hpp>
#include <loom/graph/graph.hpp>
#include <loom/graph/op.hpp>
#include <loom/graph/parameter_init.hpp>

// ops
#include <loom/ops/all.hpp>

// autograd
#include <loom/autograd/autograd.hpp>

// plans: combinators' run-time form, presets, custom transformations
#include <loom/plan/combinators.hpp>
#include <loom/plan/op_order.hpp>
#include <loom/plan/op_partition.hpp>
#include <loom/plan/pipeline_parts.hpp>
#include <loom/plan/presets.hpp>
#include <loom/plan/resolve.hpp>
#include <loom/plan/spaces.hpp>
#include <loom/plan/rules.hpp>
#include <loom/plan/transformation.hpp>

// partitioning: vTensors, applying plans, communication
#include <loom/partition/apply.hpp>
#include <loom/partition/deadlock.hpp>
#include <loom/partition/logical_graph.hpp>
#include <loom/partition/materialize.hpp>
#include <loom/partition/partitioned_graph.hpp>
#include <loom/partition/piece_layout.hpp>
#include <loom/partition/region_copy.hpp>
#include <loom/partition/transfer.hpp>
#include <loom/partition/vtensor.hpp>

// op-order: pipeline schedules, their checks, simulation and pictures
#include <loom/schedule/all.hpp>
// the plan searcher: hardware profiles, cost model, folding, branch-and-bound
#include <loom/search/all.hpp>

// runtime
#include <loom/runtime/comm/communicator.hpp>
#include <loom/runtime/comm/in_process.hpp>
#include <loom/runtime/compile.hpp>
#include <loom/runtime/explain.hpp>
#include <loom/runtime/explain_partition.hpp>
#include <loom/runtime/memory_planner.hpp>
#include <loom/runtime/program.hpp>
#include <loom/runtime/transfer_runner.hpp>
#include <loom/runtime/host/bound_storage.hpp>
#include <loom/runtime/host/executor.hpp>
#include <loom/runtime/host/fma_peak.hpp>
#include <loom/runtime/host/gemm.hpp>
#include <loom/runtime/host/kernel_table.hpp>
#include <loom/runtime/host/op_profile.hpp>
#include <loom/runtime/host/thread_pool.hpp>

// calibration: this machine measured as a profile the searcher plans for
#include <loom/calibrate/host.hpp>

// io
#include <loom/io/checkpoint_manifest.hpp>
#include <loom/io/crc32.hpp>
#include <loom/io/durable_file.hpp>
#include <loom/io/gpt2_weights.hpp>
#include <loom/io/llmc_tokens.hpp>
#include <loom/io/plan_file.hpp>
#include <loom/io/safetensors.hpp>

// train
#include <loom/train/adamw.hpp>
#include <loom/train/checkpoint.hpp>
#include <loom/train/corpus.hpp>
#include <loom/train/data_loader.hpp>
#include <loom/train/distributed_trainer.hpp>
#include <loom/train/gpt2_weights.hpp>
#include <loom/train/grad_clip.hpp>
#include <loom/train/init.hpp>
#include <loom/train/lr_schedule.hpp>
#include <loom/train/parameter_slot.hpp>
#include <loom/train/sgd.hpp>
#include <loom/train/token_file.hpp>
#include <loom/train/tokenizer.hpp>
#include <loom/train/trainer.hpp>

// models
#include <loom/models/evoformer.hpp>
#include <loom/models/gpt.hpp>
#include <loom/models/swin.hpp>
#include <loom/models/t5.hpp>
