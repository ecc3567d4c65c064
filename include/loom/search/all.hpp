#pragma once
// The plan searcher: hardware, cost model, folding, branch-and-bound. One concept per
// header:
//
//   hardware.hpp          device_profile, topology, cluster; DGX presets; JSON profiles
//   communication.hpp     alpha-beta costs per collective, ring and hierarchical; overlap factors
//   memory.hpp            model states by dtype and ZeRO stage, Megatron's bytes per parameter,
//                         activations under recompute
//   folding.hpp           layers from scopes or from structure, classes of identical layers
//   model_profile.hpp     per-layer work, parameters, saved activations of a training graph
//   plan_space.hpp        configuration (TP, PP, DP, micro-batches, ZeRO, schedule, ...) and
//                         search_space
//   evaluate.hpp          cost_context, evaluate(configuration): step time and memory
//   branch_and_bound.hpp  branch_and_bound, enumerate_all, search_result::explain
//   to_plan.hpp           a searched configuration as the one plan value
//   order_search.hpp      temporal-order search: per-device block orders under constraints
//                         and a memory cap, minimising the makespan
//   program_price.hpp     the price of a plan's programs: every instruction, every transfer,
//                         a two-stream timeline of all devices, each device's memory
//   plan_search.hpp       search_plan: fills the open parameters of a user's plan, priced by
//                         its programs
#include <loom/search/to_plan.hpp>
#include <loom/search/branch_and_bound.hpp>
#include <loom/search/communication.hpp>
#include <loom/search/evaluate.hpp>
#include <loom/search/folded_price.hpp>
#include <loom/search/folding.hpp>
#include <loom/search/hardware.hpp>
#include <loom/search/memory.hpp>
#include <loom/search/model_profile.hpp>
#include <loom/search/order_search.hpp>
#include <loom/search/plan_search.hpp>
#include <loom/search/plan_space.hpp>
#include <loom/search/program_price.hpp>
