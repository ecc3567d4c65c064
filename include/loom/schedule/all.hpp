#pragma once
// Pipeline schedules (op-order): blocks and shapes, order constraints, the list scheduler,
// the templates (GPipe, 1F1B, interleaved 1F1B, 3F1B, interlaced; a plan names them with
// plan::order<...>, plan/pipeline_parts.hpp), validation, device programs,
// simulation and export. One concept per header:
//
//   block.hpp             block{pass, stage, micro, round}, schedule_error
//   shape.hpp             pipeline_shape, data dependencies
//   schedule.hpp          schedule{shape, device_order, name}
//   transfers.hpp         the messages between devices (FIFO channels)
//   constraints.hpp       before{pattern, pattern}: op-order families with offsets
//   from_constraints.hpp  the list scheduler; schedule_spec
//   checks.hpp            the checks of a template, at compile time and at run time
//   templates.hpp         gpipe, one_f_one_b, interleaved_one_f_one_b, three_f_one_b, interlaced
//   validate.hpp          validate(schedule, validation_options)
//   program.hpp           device_programs(schedule): compute / send / receive steps
//   in_flight.hpp         activations held per stage and device
//   costs.hpp             cost_model
//   simulate.hpp          simulate(schedule, cost_model, simulate_options): timeline, bubble,
//                         peaks; or the makespan alone, as the plan searcher times orders
//   chrome_trace.hpp      chrome_trace_json(simulation)
//   svg_timeline.hpp      svg_timeline(simulation)
#include <loom/schedule/block.hpp>
#include <loom/schedule/checks.hpp>
#include <loom/schedule/chrome_trace.hpp>
#include <loom/schedule/constraints.hpp>
#include <loom/schedule/costs.hpp>
#include <loom/schedule/cycle.hpp>
#include <loom/schedule/from_constraints.hpp>
#include <loom/schedule/in_flight.hpp>
#include <loom/schedule/program.hpp>
#include <loom/schedule/schedule.hpp>
#include <loom/schedule/shape.hpp>
#include <loom/schedule/simulate.hpp>
#include <loom/schedule/svg_timeline.hpp>
#include <loom/schedule/templates.hpp>
#include <loom/schedule/transfers.hpp>
#include <loom/schedule/validate.hpp>
