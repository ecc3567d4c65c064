#pragma once
// The plan searcher: hardware, prices of a plan's programs, folding, the search of a plan's
// open parameters. One concept per header:
//
//   hardware.hpp          device_profile, topology, cluster; DGX presets; JSON profiles
//   communication.hpp     alpha-beta costs per collective, ring and hierarchical; overlap factors
//   folding.hpp           layers from scopes or from structure, classes of identical layers
//   program_price.hpp     the price of a plan's programs: every instruction, every transfer,
//                         a two-stream timeline of all devices, each device's memory
//   folded_price.hpp      the same price from small instances of a model family (repeated
//                         layers, replicas and micro-batches priced once)
//   plan_search.hpp       search_plan: fills the open parameters of a user's plan, priced by
//                         its programs, pruned by lower bounds
//   order_search.hpp      temporal-order search: per-device block orders under constraints
//                         and a memory cap, minimising the makespan
#include <loom/search/communication.hpp>
#include <loom/search/folded_price.hpp>
#include <loom/search/folding.hpp>
#include <loom/search/hardware.hpp>
#include <loom/search/order_search.hpp>
#include <loom/search/plan_search.hpp>
#include <loom/search/program_price.hpp>
