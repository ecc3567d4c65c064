#pragma once
// The searcher fills the open parameters of a user's plan: the user constructs the space
// (a plan with open<...> degrees, stage counts, devices per stage, micro-batches, orders,
// ZeRO stages, recompute choices, Coshard factors, and its constraints), loom searches it, pricing the programs each candidate really produces.
//
//   plan::plan_spec space = plan::compose(plan::stages<plan::open<"pp">>{},
//                                         plan::micro_batches<plan::open<"mb">>{}, ...);
//   search::plan_search_result r = search::search_plan(model, space, search::dgx_a100(1));
//   r.plan            the same plan, every open parameter chosen (r.plan.choices)
//   r.price           its predicted step time and the memory of every device
//   r.gap             proven optimality gap (0: the best of the space)
//   r.explain()       why this plan, the runner-up, and what separated them
//
// How:
//   1. Candidates: every legal value of every open parameter: its own range when the plan
//      gives one, else the divisors of the devices (degrees, stage counts), of the batch
//      (micro-batches), every alternative (orders), every ZeRO stage, and recompute or
//      keep (recompute choices).
//   2. Every assignment is resolved against the model (plan::resolve); the structural
//      refusals (a stage count that does not divide, layers that do not fill the chunks, a
//      forbidden split, ...) are counted by reason, which is what an empty space reports.
//      First its stage group is checked alone (plan::detail::check_stage_group: the rules'
//      degrees, colocations and recompute choices over the group), once per value of those
//      choices. A refusal holds for every assignment that agrees on the choices its check
//      read (plan::detail::choice_log), so the odometer skips the rest of the subtree they
//      root, counting it: at 16 devices most of nnScaler's tens of millions of assignments
//      are degrees that do not fill a group, refused in prefixes of a few choices.
//   3. A lower bound on the step time of each legal assignment, from the resolved plan
//      alone: the busiest device's share of the training work (FLOPs, bytes, instructions,
//      recomputation's replays) at the best rates its pieces' shapes allow; the partial sums
//      its cuts force it to reduce (the weights' gradients over the replicas, tensor-parallel
//      partial activations, each micro-batch's in turn) at the tightest placement; the
//      chains of dependent ops before and after each device's work; and the pipeline's order
//      simulated with those least block times (a stage's group of devices as one), its
//      bubbles and the gradients' reductions after the last backward; then the optimizer's
//      pass over the elements each device updates (after_programs_lower_bound). It never exceeds the programs' price (tests check it on
//      every leaf of several spaces, nnScaler's among them).
//   4. Best first by that bound, each assignment is applied (partition::apply_plan) and its
//      programs priced (search/program_price.hpp), several at once on as many threads
//      (plan_search_options::threads), taken in bound order so that the answer is
//      that of pricing one at a time; assignments that do not fit in the
//      device's memory are set aside, unpriced when their memory floor (the weights,
//      gradients and optimizer state each device keeps, and the activations its order holds
//      in flight: memory_lower_bound) already exceeds it. The search stops when the next bound is no better
//      than the runner-up's price (both are then exact), or at the time or count budget,
//      when the gap is that of the best price to the lowest bound not yet priced. Past the
//      time budget with a plan in hand, the prices still running are cancelled
//      (price_options::cancel), not waited for; without one, the price in its turn finishes. A time
//      budget that step 3 would not finish within (at its pace after 5% of the budget), or
//      plan_search_options::max_bounded, pauses the enumeration (the rest of the space is
//      counted, unbounded); a descent from the best assignments it bounded, one or two
//      parameters at a time, bounds more of the space until 60% of the budget (step 3b),
//      from the best of each order first (a descent that ends sooner leaves the rest of
//      that time to the enumeration, resumed), and the best-bounded of all are priced, the
//      best-bounded of each order first (their bounds are not equally tight). The
//      unbounded assignments' bound is then the whole training work spread over every
//      device (any_plan_lower_bound), so the gap is that of the best price to it: far from
//      a proof, but a true one. A price that has finished when the budget passes is still
//      taken.
// Deterministic without a time budget (a budget stops wherever the clock says).
// The enumeration is an odometer over the parameters in the order
// plan::open_parameters lists them, pricing follows the bounds (ties in enumeration
// order), and of plans that price the same the first priced is chosen. The runner-up is
// the best strictly slower plan.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <exception>
#include <functional>
#include <future>
#include <limits>
#include <map>
#include <optional>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include <loom/core/dim.hpp>
#include <loom/core/error.hpp>
#include <loom/core/linkage.hpp>
#include <loom/graph/graph.hpp>
#include <loom/partition/apply.hpp>
#include <loom/partition/logical_graph.hpp>
#include <loom/partition/piece_layout.hpp>
#include <loom/plan/resolve.hpp>
#include <loom/plan/rules.hpp>
#include <loom/plan/stage_ranges.hpp>
#include <loom/plan/transformation.hpp>
#include <loom/schedule/in_flight.hpp>
#include <loom/schedule/simulate.hpp>
#include <loom/search/folded_price.hpp>
#include <loom/search/hardware.hpp>
#include <loom/search/program_price.hpp>

namespace loom::search {

struct search_error : error {
    using error::error;
};

// One open parameter of a plan and the values the search tries.
struct open_parameter {
    enum class kind : std::uint8_t { recompute, degree, stages, micro_batches, order, zero, boundaries };
    std::string name;
    kind what = kind::degree;
    std::vector<std::int64_t> candidates;  // boundaries: none here, the cuts depend on the stages chosen
    std::vector<std::string> labels;  // orders: each alternative's name
    std::int64_t layers = 0;          // boundaries: the layers of the stages' repeat
    std::int64_t slack = -1;          // boundaries: each range within this many layers of even (-1: any)
    // boundaries: the cut that a whole assignment chooses, as the layers of each range
    // ("5 + 1 layers"); a cut's number alone means nothing without the stages chosen.
    std::function<std::string(const std::map<std::string, std::int64_t>&)> describe;
};

// Open stage boundaries with more cuts than this at one stage count (96 layers in 16
// stages within one layer of even: about 10^7) try the even cut only there, and the
// result says so (plan_search_statistics::even_cut_only): narrow the slack to search them.
inline constexpr std::int64_t max_boundary_cuts = 100000;

LOOM_INLINE std::vector<std::int64_t> divisors_of(std::int64_t n);

// The samples of the model's batch: the extent of Dim::Batch of its first input that has one.
inline std::int64_t batch_of(const graph& model) {
    for (tensor_id t : model.inputs)
        if (auto axis = model.tensor(t).dims.find(dim_id_of<Dim::Batch>)) return model.tensor(t).dims.extent(*axis);
    return 1;
}

// Every open parameter of `space` with its candidate values, for a model of `batch` samples
// and `layers` layers in the stages' repeat (needed when the stage boundaries are open).
LOOM_INLINE std::vector<open_parameter> open_parameter_candidates(const plan::plan_spec& space, std::int64_t batch,
                                                                  std::int64_t layers = 0);

// The ranges that open boundaries cut the layers into, given the stage count and order
// chosen in `candidate` (stages x interleaved chunks); 0 when they do not say (plan::resolve
// then says why).
LOOM_INLINE std::int64_t boundary_ranges(const plan::plan_spec& candidate);

// The candidates of open parameter p once the earlier parameters are chosen in `candidate`:
// its own, or for open boundaries every cut of the layers into the ranges that the chosen
// stage count and order make ({0} when they make none: plan::resolve then says why; the
// even cut alone when they make more than max_boundary_cuts).
LOOM_INLINE std::vector<std::int64_t> candidates_given(const open_parameter& p, const plan::plan_spec& candidate);

// The number of the even cut among open boundaries p's cuts into `ranges` ranges; throws
// plan_error where the layers make no such cut (more ranges than layers).
inline std::int64_t even_cut(const open_parameter& p, std::int64_t ranges) {
    return plan::stage_range_index(p.layers, ranges, p.slack, plan::even_stage_starts(p.layers, ranges));
}

// Every assignment of `params` in enumeration order (an odometer, the last parameter turning
// fastest): fn gets `space` with those choices.
LOOM_INLINE void for_each_assignment(const plan::plan_spec& space, const std::vector<open_parameter>& params,
                                     const std::function<void(const plan::plan_spec&)>& fn);

LOOM_INLINE std::string value_text(const open_parameter& p, std::int64_t v);

LOOM_INLINE std::string choices_text(const std::vector<open_parameter>& params, const std::map<std::string, std::int64_t>& choices);

// The work of training a model, as the least time the pricing could give each piece of it.
//
// One op of the training graph (the forward ops and the backward ops that differentiate
// them, without recomputation), with the ops whose outputs it reads: the dependencies that
// order every program of every plan, whatever its devices and micro-batches.
struct training_op {
    node_id source = no_id;  // the forward node of the model it trains
    bool backward = false;
    // On one device: at the roofline of the device's best efficiency and its memory
    // bandwidth, or at the op kind's calibrated rate without its per-call cost.
    double seconds = 0;
    // A GEMM (at least 16 FLOPs per element written; 0: not one): at the efficiency no
    // piece of it can exceed. The price scales the GEMM efficiency by a factor per
    // dimension of the shape it reads from FLOPs, elements read and written (gemm_shape);
    // a piece's contracted dimension is at most the whole op's k, the smaller of its other
    // two at most m = min(sqrt(written), FLOPs / read) of the whole op (each of its inputs
    // is cut at most as finely as its FLOPs), and the factors' product grows with m up to
    // sqrt(written).
    double gemm_seconds = 0;
    double gemm_k = 0;  // its contracted dimension
    // What one piece writes decides whether it prices as a GEMM (at least 16 FLOPs per
    // element written, as the price does): the op's FLOPs, and per output its elements and
    // the variables of the forward node `source` (bits by index in its signature) whose
    // splits slice that output. A split along another variable leaves every piece writing
    // the whole output (a contracted variable: partial sums; one the op lacks: copies), so
    // it cuts the piece's contracted dimension instead.
    double flops = 0;
    struct output_slicing {
        double elements = 0;
        std::uint64_t sliced_by = 0;
    };
    std::vector<output_slicing> writes;
    // Devices that share one machine, with a solo rate for this op's kind: at least this
    // many times its seconds spread over the machine (seconds / compute_shared_by) when it
    // runs alone (the solo rate's least seconds per unit against the rate's). 1 otherwise.
    double solo_factor = 1;
    // With a calibrated rate for its kind (empty points: none): the rate and the least units
    // of it that a piece doing 1/share of the op does, times share, and likewise the solo
    // rate's: its FLOPs (splits are even), or the bytes it writes, since what an instruction
    // reads is the program's choice (a fill reads nothing, where the op reads the tensor it
    // fills like). A curve measured at several sizes prices a small piece above its share of
    // a large one: a micro-batch of one sample at twice the cost per FLOP of sixteen on a host.
    op_rate rate, solo;
    double units = 0, solo_units = 0;
    std::vector<std::int32_t> reads;  // indices of earlier training ops

    // The least seconds of a piece that does 1/share of the op (share_of) and writes
    // `piece_written` elements (piece_elements_written; 0: unknown, as few as all of the
    // outputs over `share`), its instruction's overhead apart. A piece that may do fewer than
    // 16 FLOPs per element it writes (its contracted dimension below 8) may price as
    // element-wise. An op that its partition decomposes into others (`as_written` false)
    // runs as those, of other shapes.
    double piece_seconds(double share, double piece_written, bool as_written = true) const {
        if (as_written && !rate.points.empty()) return std::max(seconds / share, rate.least_seconds_from(units / share));
        if (gemm_seconds <= 0 || !as_written) return seconds / share;
        const bool surely_gemm = piece_written > 0 ? flops / share >= 16.0 * piece_written : 2.0 * gemm_k / share >= 16.0;
        return (surely_gemm ? gemm_seconds : std::min(gemm_seconds, seconds)) / share;
    }
    // The least seconds of that piece on a device that runs alone on a machine it shares
    // (price_options::solo_rates), times `shared_by` (the devices sharing it), as
    // device_compute counts them; `piece` is its piece_seconds.
    double alone_piece_seconds(double share, double piece, bool as_written, double shared_by) const {
        if (!as_written || solo.points.empty()) return piece * solo_factor;
        return std::max(seconds / share * solo_factor, solo.least_seconds_from(solo_units / share) * shared_by);
    }
    // The elements one piece of the op writes under partition p of its forward node, whose
    // splits' variables in that node's signature are `variables` (-1: none): each output
    // over the degrees of the splits that slice it. 0 without the outputs' slicing.
    double piece_elements_written(const plan::op_partition* p, const std::vector<int>& variables) const {
        if (writes.empty()) return 0;
        double out = 0;
        for (const output_slicing& w : writes) {
            double pieces = 1;
            if (p)
                for (std::size_t b = 0; b < p->splits.size(); ++b)
                    if (b < variables.size() && p->splits[b].cuts() && variables[b] >= 0 && variables[b] < 64 &&
                        (w.sliced_by >> variables[b] & 1u))
                        pieces *= static_cast<double>(p->splits[b].degree);
            out += w.elements / pieces;
        }
        return out;
    }
};

// The parts that partition p cuts an op's work into: the product of the degrees of the
// splits that cut (a replica, or a piece of a partial sum, does the whole op).
inline double share_of(const plan::op_partition* p) {
    double share = 1;
    if (p)
        for (const plan::split_axis& a : p->splits)
            if (a.cuts()) share *= static_cast<double>(a.degree);
    return share;
}

// Per forward node of the model: what recomputing it replays.
struct node_work {
    std::int32_t forward_op = -1;  // its forward op among training_work::ops
    // The forward nodes whose backward ops read this node's outputs: a recomputed node is
    // replayed for those in its own stage (partition/logical_graph.hpp).
    std::vector<node_id> backward_readers;
};

struct training_work {
    std::vector<node_work> nodes;  // per forward node of the model
    std::vector<training_op> ops;  // in the training graph's order (dependencies first)
};

LOOM_INLINE training_work training_work_of(const graph& model, const device_profile& dev, const price_options& o);

// The least step time of any plan of a model whose training work is `work`, over `devices`
// devices: all of that work at the least seconds a piece of each op can take, spread evenly
// (the pieces of an op do at least its whole work between them, and a plan's busiest device
// at least the average; a plan on fewer devices only loads them more); on devices that share
// one machine, the machine's share of it at the faster of each op's rates together and
// alone. It is below every assignment's step bound and price, so it stands for the
// assignments a budget leaves unbounded: a search stopped early still proves a gap.
LOOM_INLINE double any_plan_lower_bound(const training_work& work, int devices, const price_options& o);

// The least memory any plan of `model` over `devices` devices holds on its fullest device:
// every parameter's weights, gradients (at the weights' precision) and optimizer state,
// each element once over all the devices (ZeRO-3 over every one of them), the runtime's
// bytes beside. Each assignment's memory floor (memory_lower_bound) holds each device's
// share of the same state, so its fullest device holds at least this: where it exceeds the
// memory limit, nothing in any space of the model fits, which the search says at once
// instead of bounding its assignments until a budget ends.
LOOM_INLINE double any_plan_memory_floor(const graph& model, int devices, const price_options& o);

// A lower bound on the step time of a resolved plan: the busiest device's share of the
// training work. Each piece of an op does its share of the op's work (splits are even;
// replicas do it all, and pieces of a GEMM run at most at the efficiency of the largest
// shape a piece can have; a kind with a calibrated rate costs at least what its curve
// gives the piece's share, so that small pieces cost what small sizes measured) and runs at
// least one instruction per training op it holds.
//
// Given the model, two more terms:
// - Recomputation: a recomputed node whose outputs a backward op of its own stage reads is
//   replayed once per piece, at its forward work.
// - Dependencies: a device cannot start before the longest chain of training ops that
//   precedes the first op it runs, and the step cannot end before the chain that follows
//   its last op. So the step is at least, on every device, the shortest chain before any
//   of its ops, plus its compute, plus the shortest chain after any of its ops (each op of
//   a chain at its piece's share, one micro-batch): a pipeline's bubbles, whatever order.
//   Ops that a split decomposes into others count zero in chains and replays.
// Given the model and the cluster, each device's communication counts too: the step is at
// least its compute and its communication (overlap: the larger of them; one stream: their
// sum). An op cut along a variable that one of its inputs lacks leaves that input's
// gradient a partial sum over the pieces along the cut on distinct devices (the weights'
// gradients over the data-parallel replicas, a column-parallel linear's input gradient over
// the tensor-parallel group); one cut along a contracted variable leaves its output partial
// (a row-parallel linear). Each piece of such a tensor that a device holds (micro-batches
// are reduced in turn) is reduced by a collective of its own: at least a reduce-scatter over
// that group, and an all-gather too where every member needs the whole sum (a weight
// without ZeRO or under ZeRO-3; an activation or gradient that every member reads whole),
// each at its transmission time at the group's tightest placement on the cluster's nodes
// plus one message's latency, whatever the program does beyond it (more steps, shared
// NICs). A tensor several ops leave partial counts once, at its largest such reduction.
// Devices that share one machine's compute (price_options::compute_shared_by > 1) count
// no order: each device's compute at its fastest (the machine's rate, or its solo rate),
// and all devices' compute together at their rates together plus, given the model and the
// cluster, the busiest device's least communication, which the machine runs too.
// `parts`, when given, receives what folded bounds extrapolate on their own
// (search_plan(model_family, ...)): the busiest-device term and a pipeline's blocks.
struct bound_parts;
LOOM_INLINE double step_lower_bound(const plan::resolved_plan& rp, const training_work& work, const price_options& o,
                                    const graph* model = nullptr, const cluster* c = nullptr, bound_parts* parts = nullptr);

// A lower bound on the memory of each device under plan rp, without the runtime's fixed
// bytes: the parameters it stores, their gradients and their optimizer state. A device
// holding a piece of an op stores the region of each parameter that the piece reads (the
// parameter cut by the op's splits that slice it); ZeRO shards the optimizer state (stage
// 1), the gradients too (2) and the parameters too (3) over the devices that hold the same
// region.
//
// Given the model's training work, the activations too: a forward tensor that a backward op
// reads (an op's input or its own output, as its derivative needs) stays from its forward
// until that backward, unless its producer is recomputed. So at the end of each forward
// block of a device's order, every micro-batch whose forward it holds and whose backward
// has not begun (schedule/in_flight.hpp) keeps the pieces its backward ops on that device
// read: the operand cut by the op's splits that slice it, the micro-batch split among
// them. A device that runs two or more backward blocks of a stage sums the gradients of
// the stage's weights over them: from its first such block to its last it holds a partial
// sum of every region of them its pieces read (each micro-batch's gradient stays until the
// next one's is added to it), at the parameter's precision; not under ZeRO-2 and 3, whose
// programs reduce each micro-batch's gradient onto the shards as it is made. So the floor
// also looks after each backward block, and at the moments between a stage's first and
// last backward blocks adds their partial sums. The largest moment is the floor; the gathered
// parameters of ZeRO-3 and the transient tensors come on top.
struct memory_floor {
    std::vector<double> whole;        // per device: bytes that no sharding divides
    std::vector<double> sharded;      // per device: bytes of ZeRO's shards (1/copies of a region)
    std::vector<double> activations;  // per device: saved activations at their peak in flight (0 without the work)
    // Per device: saved activations and gradient partial sums at the most they hold
    // together (empty, or 0 where the device sums no gradient over micro-batches).
    std::vector<double> with_partial_sums;
    std::vector<double> updated;      // per device: parameter elements the optimizer updates at least (0 under ZeRO-3)
    double in_flight(std::size_t d) const {
        return std::max(d < activations.size() ? activations[d] : 0.0, d < with_partial_sums.size() ? with_partial_sums[d] : 0.0);
    }
    double total(std::size_t d) const { return whole[d] + sharded[d] + in_flight(d); }
    // The largest device's total without the partial sums.
    double peak_without_partial_sums() const {
        double m = 0;
        for (std::size_t d = 0; d < whole.size(); ++d)
            m = std::max(m, whole[d] + sharded[d] + (d < activations.size() ? activations[d] : 0.0));
        return m;
    }
    double peak() const {
        double m = 0;
        for (std::size_t d = 0; d < whole.size(); ++d) m = std::max(m, total(d));
        return m;
    }
};
LOOM_INLINE memory_floor memory_lower_bound(const plan::resolved_plan& rp, const graph& model, const price_options& o,
                                            const training_work* work = nullptr);

// A lower bound on the step after the programs (program_price's device_price::optimizer):
// the optimizer's pass over the elements each device updates (reading parameter, gradient
// and two moments, writing three) at the device's memory bandwidth, from the memory floor's
// `updated`. The slowest device's, or with devices sharing one machine all of theirs; the
// norm's read and the collectives after the programs count zero.
LOOM_INLINE double after_programs_lower_bound(const memory_floor& floor, const cluster& c, const price_options& o);

namespace detail {

// The least seconds each device spends communicating under plan rp (see step_lower_bound).
// `weights`, when given, receives each device's share of it that reduces the weights'
// gradients (summed over the micro-batches first, so reduced after the last backward).
LOOM_INLINE std::vector<double> communication_lower_bound(const plan::resolved_plan& rp, const graph& model, const cluster& c,
                                                          const price_options& o, std::vector<double>* weights = nullptr);

// Whether partition p rebuilds node n into other ops (a split whose transformation
// decomposes the op).
LOOM_INLINE bool decomposed(const node& n, const plan::op_partition& p);

// The splits of partition p that cut node n's operand (input or output `position`) into
// pieces: those that cut, along a variable of n, with a sliced effect on it.
LOOM_INLINE std::vector<std::size_t> slicing_splits(const node& n, const plan::op_partition& p, bool input,
                                                    std::size_t position);

// The pieces of p that stand for all of them: the first `period`, where every later block of
// that many lies on the same devices in the same order, the blocks being whole values of p's
// outermost splits, none of them among `kept` (splits whose coordinate the caller reads). A
// pipeline cuts every op into micro-batches first, all on the same devices: at 1024 devices an
// op has micro-batches x degrees pieces, and a bound reads each op's devices several times.
// Returns p.pieces() when no outer split repeats so.
LOOM_INLINE std::int64_t repeating_period(const plan::op_partition& p, const std::vector<std::size_t>& kept = {});

// Per device of [0, devices): how many distinct regions of an operand the pieces of p on it
// hold, the operand cut by the splits `slicing` (slicing_splits). Pieces that differ only
// along other splits, or as replicas, hold the same region; colocated pieces along a slicing
// split (Coshard's) hold as many regions as they are. `count` has `devices` entries, 0 on
// entry; `holders` receives the devices whose count it sets (in the order first met), so
// that a caller over many operands zeroes those alone: an operand's pieces sit on a few of
// an instance's devices, and this runs for every parameter reading of every bound.
LOOM_INLINE void regions_per_device(const plan::op_partition& p, const std::vector<std::size_t>& slicing,
                                    std::size_t devices, std::vector<std::int64_t>& count, std::vector<std::size_t>& holders);

// Per node of a resolved plan: the devices its pieces run on, each with its count of
// pieces, in device order; made on first use. The bounds add an op's work per piece, and an
// op cut into micro-batches has micro-batches x degrees pieces (a thousand and more at 1024
// devices) on a few devices: one pass over the pieces per node, not one per bound term and
// training op.
class piece_spread {
   public:
    using spread = std::vector<std::pair<int, std::int64_t>>;
    explicit piece_spread(const plan::resolved_plan& rp) : rp_(rp) {}
    // Node n's spread (n has a partition, rp.at(n) != nullptr).
    LOOM_INLINE const spread& of(node_id n);

   private:
    const plan::resolved_plan& rp_;
    std::vector<std::optional<spread>> spreads_;
    std::vector<std::int64_t> count_;
};

// The least seconds each device computes under plan rp: its forward ops, its backward ops,
// and given the model the replays of recomputed nodes (see step_lower_bound).
struct device_compute {
    std::vector<double> forward, backward, replays;
    // With solo rates (price_options::solo_rates), in the same units (times
    // compute_shared_by); empty without them. alone: each device's ops at their solo rates
    // (training_op::alone_piece_seconds); machine: at the lesser of that and their rates
    // together (the share of the machine they take at least).
    std::vector<double> alone, machine;
    double total(std::size_t d) const { return forward[d] + backward[d] + replays[d]; }
};
LOOM_INLINE device_compute compute_lower_bound(const plan::resolved_plan& rp, const training_work& work,
                                               const price_options& o, const graph* model, piece_spread* spread = nullptr);

// The blocks that schedule_lower_bound plays, in the order's form with each stage group as
// one device (pipeline_groups): per kind of block (a stage's forward round, or its
// backward), each device's least work for one micro-batch (0 where it runs none of it), and
// the chain to each output that another stage reads, in op order. Each number is linear in
// the layers of every stage and none depends on the micro-batch count, so a folded bound
// extrapolates them from its instances and plays the real plan's order with them
// (folded_bounds): the line through two instances' makespans bends below the real one where
// another stage becomes the slowest (an uneven cut's extra layers weigh more in an instance
// of 4 layers per stage than in the real 12).
struct pipeline_blocks {
    schedule::pipeline_shape shape;             // the order's, one device per stage group
    std::vector<std::vector<double>> work;     // [kind][device]; empty: no op of that kind
    std::vector<std::vector<double>> outputs;  // [kind]
};

// A block's kind in a pipeline of `shape`: (stage, forward round r) -> stage * (rounds + 1)
// + r; its backward -> stage * (rounds + 1) + rounds. block_kinds: how many there are.
inline std::size_t block_kinds(const schedule::pipeline_shape& shape) {
    return static_cast<std::size_t>(shape.stages * (shape.rounds + 1));
}
inline std::size_t block_kind(const schedule::pipeline_shape& shape, const schedule::block& b) {
    return static_cast<std::size_t>(b.stage * (shape.rounds + 1) + (schedule::is_forward(b) ? b.round : shape.rounds));
}

// The simulation of `order` (its shape that of b) with blocks b: each block as long as its
// least loaded device's work, its output ready at its shortest chain to an output (at its
// end where it has none). Nothing when the order cannot be played so.
LOOM_INLINE std::optional<schedule::simulation> play_blocks(const schedule::schedule& order, const pipeline_blocks& b);

// b's numbers on the line through a (at 0) and b (at 1), at position t; nothing when their
// shapes differ.
LOOM_INLINE std::optional<pipeline_blocks> extrapolate_blocks(const pipeline_blocks& a, const pipeline_blocks& b, double t);

}  // namespace detail

struct bound_parts {
    // Each device's compute and communication, without the order: linear in the
    // micro-batches and the layers on every device.
    double busiest = 0;
    std::optional<detail::pipeline_blocks> blocks;  // a pipeline's order, where it could be played
};

namespace detail {

// The least step that the dependencies between training ops allow each device's compute
// (see step_lower_bound).
// `weights`: each device's least seconds reducing its weights' gradients (empty: none).
// `blocks`, when given, receives the pipeline blocks it played (schedule_lower_bound).
LOOM_INLINE double dependency_lower_bound(const plan::resolved_plan& rp, const training_work& work, const price_options& o,
                                          const graph& model, const device_compute& compute,
                                          const std::vector<double>& weights = {}, piece_spread* spread = nullptr,
                                          std::optional<pipeline_blocks>* blocks = nullptr);

// The least makespan of a pipeline's order (rp.order) when each block takes the least time
// its ops can: the schedule simulated (schedule/simulate.hpp) with, for each stage and pass,
// the work of one micro-batch's ops that wait for the stages before (forward) or after
// (backward), on the stage's least loaded device, and the chain of those ops up to the
// first output another stage reads (when the block's output is ready). A stage on a group
// of devices (tensor or data parallelism inside it) is played as one device: each member
// runs the group's order, its blocks no shorter than the least loaded member's and its
// inputs from members of groups no earlier than theirs (pipeline_groups). `length`: each
// training op's chain length (one piece). 0 where the order cannot be bounded so: no order,
// a stage on devices of several groups (the interlaced pipeline's embedding and head), or
// an output that does not wait for the block's inputs.
// `weights` (per device, may be empty): the reductions of the weights' gradients, which
// wait for the last backward block of the device's stages to start.
// `blocks`, when given, receives the blocks it played (nothing where it gives 0).
LOOM_INLINE double schedule_lower_bound(const plan::resolved_plan& rp, const training_work& work,
                                        const std::vector<double>& length, const std::vector<double>& weights,
                                        piece_spread* spread = nullptr, std::optional<pipeline_blocks>* blocks = nullptr);

// Per device under plan rp (see memory_floor): the saved activations it holds at their peak
// in flight, and the most it holds at a moment when it also holds partial sums of weight
// gradients, with `partials` (per device and stage, may be empty) the bytes of the weights'
// gradients it sums over that stage's micro-batches, held from its first backward block of
// the stage until its last.
struct held_in_flight {
    std::vector<double> activations, with_partial_sums;
};
LOOM_INLINE held_in_flight activation_floor(const plan::resolved_plan& rp, const graph& model, const training_work& work,
                                            const price_options& o, const std::vector<std::vector<double>>& partials = {});

// The order of a pipeline whose stages run on groups of devices that each follow one order
// (plan::detail::spread_over_groups), with each group as one device; nothing when a stage
// runs on devices of several groups or a group's members follow different orders.
LOOM_INLINE std::optional<schedule::schedule> pipeline_groups(const schedule::schedule& s);

}  // namespace detail

struct plan_search_options {
    price_options price;
    double memory_limit = 0;         // bytes per device; 0: the cluster's device memory
    double time_budget_seconds = 0;  // 0: search until the best is proven
    std::int64_t max_priced = 0;     // price at most this many assignments; 0: no limit
    // Resolve and bound at most this many assignments in enumeration order (0: no limit);
    // the rest are counted unbounded and a descent continues from the best (see step 3b).
    std::int64_t max_bounded = 0;
    // Assignments priced at once, each on a thread of its own (0: one per hardware thread).
    // The answer and the statistics are those of pricing one at a time: results are taken
    // in bound order, and a price computed beyond the point where the search stops is
    // dropped, not counted. (Bounding stays on the calling thread: spreading one
    // assignment's folded instances over threads measured no faster.)
    int threads = 0;
};

struct plan_search_statistics {
    std::int64_t assignments = 0;  // leaves of the space
    std::int64_t refused = 0;      // by plan::resolve or partition::apply_plan
    std::int64_t priced = 0;
    std::int64_t over_memory = 0;
    std::int64_t over_memory_unpriced = 0;  // of those, set aside by their memory floor alone
    std::int64_t pruned = 0;       // never priced: their bound was no better than the runner-up
    std::int64_t unexplored = 0;   // never priced: the budget ran out
    std::int64_t unbounded = 0;    // never resolved nor bounded: the budget ran out while bounding
    std::int64_t skipped = 0;      // of the refused and unbounded: counted by the verdict on a prefix
                                   // of their choices, never visited one by one
    std::int64_t ties = 0;         // priced the same as the best (the first of them is chosen)
    std::int64_t even_cut_only = 0;  // assignments whose open boundaries had too many cuts: the even one was tried
    std::int64_t descended = 0;    // not counted unbounded: moved to by the descent after a budget cut the enumeration
    std::int64_t looked_at = 0;    // bounded by the descent, those it moved to among them (the rest stay counted unbounded)
    double seconds = 0;
    double bounding_seconds = 0;  // of those, resolving and bounding every assignment (the rest prices)
    std::map<std::string, std::int64_t> refusals;  // reason -> assignments refused for it
};

struct priced_assignment {
    std::map<std::string, std::int64_t> choices;
    double bound = 0;
    program_price price;
};

struct plan_search_result {
    plan::plan_spec plan;  // the space with every open parameter chosen
    std::vector<open_parameter> parameters;
    priced_assignment best;
    std::optional<priced_assignment> runner_up;
    double gap = 0;  // (best price - lowest unpriced bound) / best price; 0: proven best. Where
                     // the budget left assignments unbounded, their bound is the floor that
                     // any_plan_lower_bound gives (1 without one: a search over given functions)
    double memory_limit = 0;
    plan_search_statistics stats;

    const program_price& price() const { return best.price; }
    std::string explain() const;
};

namespace detail {

LOOM_INLINE std::string seconds_text(double s);

LOOM_INLINE std::string gib_text(double bytes);

LOOM_INLINE std::string price_text(const program_price& p);

// What separated two priced plans, a the faster: the component that grew most in b.
LOOM_INLINE std::string separation_text(const program_price& a, const program_price& b);

}  // namespace detail

// Fill the open parameters of `space` for `model` on cluster c.
LOOM_INLINE plan_search_result search_plan(const graph& model, const plan::plan_spec& space, const cluster& c,
                                           const plan_search_options& o = {});

// The same, folded (search/folded_price.hpp): every assignment is bounded and priced from
// small instances of the model, so that models of a hundred layers on a thousand devices
// can be searched. The bound is extrapolated over the layers per stage like the price.
LOOM_INLINE plan_search_result search_plan(const model_family& model, const plan::plan_spec& space, const cluster& c,
                                           const plan_search_options& o = {});

namespace detail {

// Open stage boundaries made explicit in plan p (a filled plan): the boundaries of its chosen
// cut, the open parameter and its choice removed, so that the plan reads as written by hand.
LOOM_INLINE void concrete_boundaries(plan::plan_spec& p, const std::vector<open_parameter>& params);

// An assignment's lower bounds: its step, and the memory of its fullest device (the
// runtime's fixed bytes included).
struct assignment_bounds {
    double step = 0;
    double memory = 0;
};

// The lower bounds of plan p (every open parameter chosen) on model family m, from small
// instances of the model as price_folded prices it: each instance's bounds, extrapolated
// over the layers per stage, the micro-batches and the stages (of 4 and 8 for a deep
// pipeline; the interlaced pipeline keeps its stages, whose ends' 1/S share a line through
// two instances would take below zero). Instances' graphs and training work are built once
// per (layers, batch) and kept for the assignments that share them.
//
// The plans it bounds are the assignments of one space: they differ in their choices only.
// Many of them share instances (a deep pipeline's instances have 4 and 8 stages whatever its
// own count, and 2 replicas whatever its data-parallel degree), so each instance plan's
// bounds are kept too, keyed by the instance's choices and the values folding gives it.
class folded_bounds {
public:
    folded_bounds(const model_family& m, const cluster& c, const price_options& o) : model_(m), cluster_(c), options_(o) {}
    assignment_bounds operator()(const plan::plan_spec& p);
    // The instance plans bounded so far, each once.
    std::size_t instances_bounded() const { return bounds_.size(); }

private:
    struct instance {
        graph g;
        training_work work;
    };
    // What one instance plan's bounds read: the instance graph (layers, batch), the plan's
    // devices and stage boundaries as folding sets them, and every choice.
    struct instance_key {
        std::int64_t layers = 0;
        std::int64_t batch = 0;
        int devices = 0;
        std::vector<std::int64_t> boundaries;
        std::map<std::string, std::int64_t> choices;
        auto operator<=>(const instance_key&) const = default;
    };
    struct instance_bounds {
        double step = 0;
        bound_parts parts;
        std::optional<memory_floor> memory;  // made for the instances of the fewer micro-batches only
        plan::zero_stage zero = plan::zero_stage::none;
    };
    const instance& instance_of(std::int64_t layers, std::int64_t batch);
    // The makespan of the real plan's order (its stages and micro-batches) with the blocks of
    // the instances of fewer micro-batches (one per entry of `layers`) extrapolated to its
    // layers per stage; 0 where they were not played.
    double real_order_bound(const plan::plan_spec& candidate, const fold_shape& s, const std::vector<std::int64_t>& layers,
                            const std::vector<const std::optional<pipeline_blocks>*>& blocks);
    const model_family& model_;
    const cluster& cluster_;
    price_options options_;
    std::map<std::pair<std::int64_t, std::int64_t>, instance> instances_;
    std::map<instance_key, instance_bounds> bounds_;
    plan::detail::selector_memo selectors_;  // the rules' matches on the instances, which live as long
};

// Moves to the front of `items` (best first) the first item of each value of the open
// orders among `params` that `eligible` accepts, keeping the order within both parts;
// returns how many it moved, 0 (nothing moved) where fewer than two orders appear. A budget
// that leaves the space unbounded leaves the answer unproven (its gap only to the floor of
// any plan), and then what the descent starts from and what is priced first decide it. The
// bounds of the orders are not
// equally tight: the schedule's term is exact for a pipeline whose stages are groups of
// devices (1F1B's bound is 81% of its price for a 96-layer GPT on 1024 GPUs) and 0 for the
// interlaced pipeline, whose ends run on every device (39% there), so by bound alone the
// few prices a budget allows all go to one order.
template <class T, class Choices, class Eligible>
std::size_t each_order_first(std::vector<T>& items, const std::vector<open_parameter>& params, Choices choices_of,
                             Eligible eligible) {
    std::vector<std::string> orders;
    for (const open_parameter& p : params)
        if (p.what == open_parameter::kind::order) orders.push_back(p.name);
    if (orders.empty()) return 0;
    std::set<std::vector<std::int64_t>> seen;
    std::vector<bool> first(items.size(), false);
    for (std::size_t k = 0; k < items.size(); ++k) {
        if (!eligible(items[k])) continue;
        std::vector<std::int64_t> key;
        for (const std::string& name : orders) key.push_back(choices_of(items[k]).at(name));
        first[k] = seen.insert(std::move(key)).second;
    }
    if (seen.size() < 2) return 0;
    std::vector<T> reordered;
    reordered.reserve(items.size());
    for (std::size_t k = 0; k < items.size(); ++k)
        if (first[k]) reordered.push_back(std::move(items[k]));
    const std::size_t moved = reordered.size();
    for (std::size_t k = 0; k < items.size(); ++k)
        if (!first[k]) reordered.push_back(std::move(items[k]));
    items = std::move(reordered);
    return moved;
}

// The search itself, over the assignments of `params`: `bound` gives an assignment's lower
// bounds (throwing plan_error or shape_error to refuse it), `price` its programs' price
// (given the flag to pass as price_options::cancel: the search sets it for prices it will
// drop). An assignment whose memory floor exceeds the limit is set aside unpriced.
using bound_function = std::function<assignment_bounds(const plan::plan_spec&)>;
using price_function = std::function<program_price(const plan::plan_spec&, const std::atomic<bool>& cancel)>;
// What a price would cost to compute, in any unit that grows with its time (empty: all alike).
using price_cost_function = std::function<double(const plan::plan_spec&)>;
// `structure`: the real model's graph, on which each assignment's stage group is checked
// first (plan::detail::check_stage_group). `cost`: under a budget that leaves the space
// unbounded, the first leaves are priced in bands of 10% of bound, the cheapest of each band
// first (see search_assignments). `floors`: what no assignment goes below, 0 where none is
// known. Its step (any_plan_lower_bound) bounds the assignments a budget leaves unbounded
// (without it such a search's gap is 100%); its memory (any_plan_memory_floor), where it
// exceeds the limit, ends the search before any assignment is bounded.
struct any_plan_floors {
    double step = 0;
    double memory = 0;
};
LOOM_INLINE plan_search_result search_assignments(const plan::plan_spec& space, std::vector<open_parameter> params,
                                                  const cluster& c, const plan_search_options& o, const graph& structure,
                                                  const bound_function& bound, const price_function& price,
                                                  const price_cost_function& cost = {}, any_plan_floors floors = {});

}  // namespace detail

}  // namespace loom::search

// Definitions: compiled here (header-only) or once in loom::compiled (core/linkage.hpp).
#if LOOM_HEADER_DEFINITIONS

namespace loom::search {

LOOM_INLINE std::vector<std::int64_t> divisors_of(std::int64_t n) {
    std::vector<std::int64_t> out;
    for (std::int64_t k = 1; k <= n; ++k)
        if (n % k == 0) out.push_back(k);
    return out;
}

LOOM_INLINE std::vector<open_parameter> open_parameter_candidates(const plan::plan_spec& space, std::int64_t batch,
                                                                  std::int64_t layers) {
    std::vector<open_parameter> out;
    auto find = [&](const std::string& name) -> open_parameter* {
        for (auto& p : out)
            if (p.name == name) return &p;
        return nullptr;
    };
    auto add_degree = [&](const plan::degree_spec& d, open_parameter::kind k, std::int64_t range_of) {
        if (d.open.empty()) return;
        if (open_parameter* p = find(d.open)) {
            // One name in several places: the values every place allows.
            if (!d.allowed.empty()) {
                std::vector<std::int64_t> keep;
                for (auto v : p->candidates)
                    if (std::find(d.allowed.begin(), d.allowed.end(), v) != d.allowed.end()) keep.push_back(v);
                p->candidates = keep;
            }
            return;
        }
        out.push_back({d.open, k, d.allowed.empty() ? divisors_of(range_of) : d.allowed, {}});
    };
    for (const plan::rule& r : space.rules)
        if (!r.recompute_open.empty() && !find(r.recompute_open))
            out.push_back({r.recompute_open, open_parameter::kind::recompute, {0, 1}, {}});
    for (const plan::rule& r : space.rules)
        if (r.trans)
            for (const plan::split_spec& s : *r.trans) add_degree(s.degree, open_parameter::kind::degree, space.devices);
    for (const plan::rule& r : space.rules)
        if (r.assign) add_degree(r.assign->colocate, open_parameter::kind::degree, space.devices);
    if (space.stages) add_degree(space.stages->count, open_parameter::kind::stages, space.devices);
    if (space.stages) add_degree(space.stages->devices_per_stage, open_parameter::kind::degree, space.devices);
    add_degree(space.micro_batches, open_parameter::kind::micro_batches, batch);
    if (space.order.alternatives.size() > 1 && !find(space.order.open)) {
        open_parameter p{space.order.open, open_parameter::kind::order, {}, {}};
        for (std::size_t i = 0; i < space.order.alternatives.size(); ++i) {
            p.candidates.push_back(static_cast<std::int64_t>(i));
            p.labels.push_back(space.order.alternatives[i].describe());
        }
        out.push_back(std::move(p));
    }
    if (!space.zero_open.empty() && !find(space.zero_open))
        out.push_back({space.zero_open, open_parameter::kind::zero,
                       space.zero_allowed.empty() ? std::vector<std::int64_t>{0, 1, 2, 3} : space.zero_allowed, {}});
    // Last: its cuts depend on the stage count and the order chosen before it.
    if (space.stages && !space.stages->boundaries_open.empty() && !find(space.stages->boundaries_open)) {
        if (layers < 1)
            throw search_error("search_plan: the stage boundaries '" + space.stages->boundaries_open +
                               "' are open, but the model has no layers named '" + space.stages->repeat +
                               "' to cut; name the repeat the model records in plan::stages");
        open_parameter p{space.stages->boundaries_open, open_parameter::kind::boundaries, {}, {}};
        p.layers = layers;
        p.slack = space.stages->boundary_slack;
        p.describe = [space, layers](const std::map<std::string, std::int64_t>& choices) -> std::string {
            plan::plan_spec chosen = space;
            chosen.choices = choices;
            try {
                const auto starts =
                    plan::detail::stage_starts(*chosen.stages, choices, layers, static_cast<int>(boundary_ranges(chosen)));
                std::string text;
                for (std::size_t k = 0; k < starts.size(); ++k)
                    text += (k ? " + " : "") + std::to_string((k + 1 < starts.size() ? starts[k + 1] : layers) - starts[k]);
                return text + " layers";
            } catch (const plan_error&) {
                return "cut " + std::to_string(choices.at(chosen.stages->boundaries_open)) + " (not a cut of these stages)";
            }
        };
        out.push_back(std::move(p));
    }
    for (const auto& p : out)
        if (p.candidates.empty() && p.what != open_parameter::kind::boundaries)
            throw search_error("search_plan: open parameter '" + p.name +
                               "' has no candidate value (its ranges in the plan have no value in common); give it a range "
                               "that holds at least one value");
    return out;
}

LOOM_INLINE std::int64_t boundary_ranges(const plan::plan_spec& candidate) {
    std::int64_t ranges = 0;
    try {
        ranges = candidate.stages ? plan::degree_value(candidate.stages->count, candidate, "plan::stages") : 0;
        if (const auto order = plan::detail::chosen_order(candidate); order && order->kind == plan::schedule_kind::interleaved)
            ranges *= order->virtual_stages;
    } catch (const plan_error&) {
        return 0;
    }
    return std::max<std::int64_t>(ranges, 0);
}

// Whether open boundaries p have too many cuts at the stages chosen in `candidate`, so that
// only the even one is tried.
LOOM_INLINE bool even_cut_only(const open_parameter& p, const plan::plan_spec& candidate) {
    const std::int64_t ranges = boundary_ranges(candidate);
    return p.what == open_parameter::kind::boundaries && ranges >= 1 &&
           plan::count_stage_ranges(p.layers, ranges, p.slack) > max_boundary_cuts;
}

LOOM_INLINE std::vector<std::int64_t> candidates_given(const open_parameter& p, const plan::plan_spec& candidate) {
    if (p.what != open_parameter::kind::boundaries) return p.candidates;
    const std::int64_t ranges = boundary_ranges(candidate);
    if (ranges < 1) return {0};
    const std::int64_t cuts = plan::count_stage_ranges(p.layers, ranges, p.slack);
    if (cuts > max_boundary_cuts)
        return {even_cut(p, ranges)};
    std::vector<std::int64_t> out;
    for (std::int64_t k = 0; k < std::max<std::int64_t>(cuts, 1); ++k) out.push_back(k);
    return out;
}

LOOM_INLINE void for_each_assignment(const plan::plan_spec& space, const std::vector<open_parameter>& params,
                                     const std::function<void(const plan::plan_spec&)>& fn) {
    plan::plan_spec candidate = space;
    // Depth first in parameter order: the odometer, with candidates that may depend on
    // the choices before them.
    std::function<void(std::size_t)> choose = [&](std::size_t i) {
        if (i == params.size()) {
            fn(candidate);
            return;
        }
        for (std::int64_t v : candidates_given(params[i], candidate)) {
            candidate.choices[params[i].name] = v;
            choose(i + 1);
        }
    };
    choose(0);
}

LOOM_INLINE std::string value_text(const open_parameter& p, std::int64_t v) {
    if (p.what == open_parameter::kind::boundaries) return "cut " + std::to_string(v);
    if (p.what == open_parameter::kind::order && v >= 0 && static_cast<std::size_t>(v) < p.labels.size())
        return p.labels[static_cast<std::size_t>(v)];
    if (p.what == open_parameter::kind::zero) return "ZeRO-" + std::to_string(v);
    if (p.what == open_parameter::kind::recompute) return v == 1 ? "recompute" : "keep";
    return std::to_string(v);
}

LOOM_INLINE std::string choices_text(const std::vector<open_parameter>& params, const std::map<std::string, std::int64_t>& choices) {
    std::string out;
    for (const auto& p : params) {
        auto it = choices.find(p.name);
        if (it == choices.end()) continue;
        const bool ranges = p.what == open_parameter::kind::boundaries && p.describe;
        out += (out.empty() ? "" : ", ") + p.name + " = " + (ranges ? p.describe(choices) : value_text(p, it->second));
    }
    return out.empty() ? "(no open parameters)" : out;
}

namespace detail {

// Per output of node n of the logical graph `lg` (forward node `forward` there, node
// `source` of the model): its elements, and which variables of the model's node slice it,
// found by binding a split along each of them as the partitioner would (mirrored onto a
// backward op). A split it cannot trace slices nothing: the piece is taken to write all of
// that output, the fewest FLOPs per element written.
LOOM_INLINE std::vector<training_op::output_slicing> written_slicing(const graph& model, const graph& lg, node_id source,
                                                                     node_id forward, const node& n) {
    const node& f = model.nodes[static_cast<std::size_t>(source)];
    const node& lf = lg.at(forward);
    std::vector<training_op::output_slicing> out(n.outputs.size());
    for (std::size_t o = 0; o < n.outputs.size(); ++o)
        out[o].elements = static_cast<double>(lg.tensor(n.outputs[o]).dims.numel());
    for (std::size_t v = 0; v < f.sig.vars.size() && v < 64; ++v) {
        plan::op_partition along;
        along.splits.push_back({f.sig.vars[v].dim, f.sig.vars[v].label, 1});
        std::optional<int> w;
        if (&lf == &n) {
            w = n.sig.find(f.sig.vars[v].label);
        } else {
            const partition::mirrored_partition m = partition::mirror_partition(lg, along, &lf, n);
            const plan::split_axis& s = m.partition.splits.front();
            if (!m.absent.empty() || !s.cuts() || s.label.empty()) continue;
            w = n.sig.find(s.label);
        }
        if (!w) continue;
        for (std::size_t o = 0; o < n.outputs.size() && o < n.sig.output_axes.size(); ++o)
            if (n.sig.effect_on(*w, false, o).effect == split_effect::sliced) out[o].sliced_by |= std::uint64_t{1} << v;
    }
    return out;
}

}  // namespace detail

LOOM_INLINE training_work training_work_of(const graph& model, const device_profile& dev, const price_options& o) {
    const std::size_t forward = model.forward_node_count();
    partition::logical_graph_options lo;
    lo.recompute.assign(forward, false);
    lo.decompose.resize(forward);
    const partition::logical_graph lg = partition::build_logical_graph(model, lo);
    const double peak = peak_for(dev, o.storage);
    const double byte_rate = dev.memory_bandwidth * dev.elementwise_efficiency;
    training_work work;
    work.nodes.resize(forward);
    std::vector<std::int32_t> op_of(lg.g.nodes.size(), -1);  // training op of each node of lg.g
    for (std::size_t i = 0; i < lg.g.nodes.size(); ++i) {
        const node& n = lg.g.nodes[i];
        const node_id forward_node = n.forward_of != no_id ? n.forward_of : static_cast<node_id>(i);
        const node_id source = lg.source_of[static_cast<std::size_t>(forward_node)];
        if (source == no_id || static_cast<std::size_t>(source) >= forward) continue;
        training_op op;
        op.source = source;
        op.backward = n.backward;
        // As detail::instruction_seconds prices it, at the best a piece can do.
        const double flops = n.op->flops ? n.op->flops(lg.g, n) : 0.0;
        const double bytes = detail::node_bytes(lg.g, n, o.storage);
        double read = 0, written = 0, written_bytes = 0;
        for (tensor_id t : n.inputs) read += static_cast<double>(lg.g.tensor(t).dims.numel());
        for (tensor_id t : n.outputs) {
            written += static_cast<double>(lg.g.tensor(t).dims.numel());
            written_bytes += static_cast<double>(tensor_bytes(lg.g.tensor(t), storage_precision(lg.g, t, o.storage)));
        }
        if (const op_rate* rate = detail::rate_for(o, dev, n.op->name)) {
            op.seconds = rate->least_per_unit() * (rate->per_flop ? flops : bytes);
            op.rate = *rate;
            op.units = rate->per_flop ? flops : written_bytes;
            if (auto solo = o.solo_rates.find(n.op->name); solo != o.solo_rates.end() && rate->least_per_unit() > 0) {
                op.solo_factor = solo->second.least_per_unit() * o.compute_shared_by / rate->least_per_unit();
                op.solo = solo->second;
                op.solo_units = solo->second.per_flop ? flops : written_bytes;
            }
        } else {
            op.seconds = std::max(bytes / byte_rate, flops / (peak * std::max(dev.gemm_efficiency, dev.elementwise_efficiency)));
            if (written > 0 && flops >= 16.0 * written) {
                const double k = std::get<2>(gemm_shape(flops, read, written));
                const double m = std::max(1.0, std::min(std::sqrt(written), flops / read));
                const double h = o.gemm_half_dimension;
                const double efficiency = dev.gemm_efficiency * gemm_shape_factor(k, h) * gemm_shape_factor(m, h) *
                                          gemm_shape_factor(written / m, h);
                op.gemm_seconds = std::max(bytes / byte_rate, flops / (peak * efficiency));
                op.gemm_k = k;
                op.flops = flops;
                op.writes = detail::written_slicing(model, lg.g, source, forward_node, n);
            }
        }
        for (tensor_id t : n.inputs) {
            const node_id producer = lg.g.tensor(t).producer;
            if (producer == no_id) continue;
            const std::int32_t from = op_of[static_cast<std::size_t>(producer)];
            if (from < 0) continue;
            if (std::find(op.reads.begin(), op.reads.end(), from) == op.reads.end()) op.reads.push_back(from);
            // A backward op reading a forward op's output: what recomputation replays.
            const training_op& read_op = work.ops[static_cast<std::size_t>(from)];
            if (n.backward && !read_op.backward) {
                auto& readers = work.nodes[static_cast<std::size_t>(read_op.source)].backward_readers;
                if (std::find(readers.begin(), readers.end(), source) == readers.end()) readers.push_back(source);
            }
        }
        op_of[i] = static_cast<std::int32_t>(work.ops.size());
        if (!n.backward) work.nodes[static_cast<std::size_t>(source)].forward_op = op_of[i];
        work.ops.push_back(std::move(op));
    }
    return work;
}

LOOM_INLINE double any_plan_lower_bound(const training_work& work, int devices, const price_options& o) {
    double all = 0;
    for (const training_op& op : work.ops) all += op.seconds * std::min(1.0, op.solo_factor);
    return o.compute_shared_by != 1 ? all / o.compute_shared_by : all / std::max(devices, 1);
}

LOOM_INLINE double any_plan_memory_floor(const graph& model, int devices, const price_options& o) {
    std::set<tensor_id> parameters;  // those the forward ops read, as memory_lower_bound counts them
    for (std::size_t i = 0; i < model.forward_node_count(); ++i)
        for (tensor_id t : model.nodes[i].inputs)
            if (model.tensor(t).role == tensor_role::parameter) parameters.insert(t);
    double state = 0;
    for (tensor_id t : parameters) {
        const double bytes = static_cast<double>(real_bytes(storage_precision(model, t, o.storage)));
        state += static_cast<double>(model.tensor(t).dims.numel()) * (2 * bytes + o.optimizer_bytes_per_element);
    }
    return state / std::max(devices, 1) + o.runtime_bytes;
}

LOOM_INLINE double step_lower_bound(const plan::resolved_plan& rp, const training_work& work, const price_options& o,
                                    const graph* model, const cluster* c, bound_parts* parts) {
    detail::piece_spread spread(rp);
    const detail::device_compute compute = detail::compute_lower_bound(rp, work, o, model, &spread);
    std::vector<double> busy(compute.forward.size());
    for (std::size_t d = 0; d < busy.size(); ++d) busy[d] = compute.total(d);
    if (o.compute_shared_by != 1) {
        // Devices sharing one machine: each runs at the machine's rate, or at its solo rate
        // where one is given, and all of them at most at their rates together (each op no
        // slower than alone). The machine also runs every transfer, each once (the price's
        // work: all transfers' durations and all devices' compute), so its work is at least
        // the compute and the busiest device's communication, whose collectives are distinct;
        // a transfer, like an instruction, at its time divided by the devices sharing it.
        double all = 0;
        for (double b : compute.machine.empty() ? busy : compute.machine) all += b;
        const std::vector<double>& own = compute.alone.empty() ? busy : compute.alone;
        double talk_most = 0;
        if (model && c)
            for (double t : detail::communication_lower_bound(rp, *model, *c, o, nullptr)) talk_most = std::max(talk_most, t);
        const double bound = std::max(*std::max_element(own.begin(), own.end()) / o.compute_shared_by,
                                      (all + talk_most) / o.compute_shared_by);
        if (parts) *parts = {bound, std::nullopt};
        return bound;
    }
    std::vector<double> talk, weights;
    if (model && c) talk = detail::communication_lower_bound(rp, *model, *c, o, &weights);
    std::optional<detail::pipeline_blocks> blocks;
    const double ordered =
        model ? detail::dependency_lower_bound(rp, work, o, *model, compute, weights, &spread, parts ? &blocks : nullptr) : 0.0;
    for (std::size_t d = 0; d < talk.size(); ++d) busy[d] = o.overlap ? std::max(busy[d], talk[d]) : busy[d] + talk[d];
    const double most = *std::max_element(busy.begin(), busy.end());
    if (parts) *parts = {most, std::move(blocks)};
    return std::max(ordered, most);
}

}  // namespace loom::search

namespace loom::search::detail {

LOOM_INLINE bool decomposed(const node& n, const plan::op_partition& p) {
    if (!plan::transformation_registry::instance().may_decompose(*n.op)) return false;
    for (const plan::split_axis& s : p.splits) {
        if (!s.cuts()) continue;
        const std::optional<int> v = partition::detail::variable_of(n, s);
        if (!v) continue;
        const auto* t = plan::transformation_registry::instance().find(*n.op, n.sig.vars[static_cast<std::size_t>(*v)].label);
        if (t && t->decompose) return true;
    }
    return false;
}

LOOM_INLINE std::vector<std::size_t> slicing_splits(const node& n, const plan::op_partition& p, bool input,
                                                    std::size_t position) {
    std::vector<std::size_t> out;
    for (std::size_t b = 0; b < p.splits.size(); ++b) {
        if (!p.splits[b].cuts()) continue;
        const std::optional<int> v = partition::detail::variable_of(n, p.splits[b]);
        if (!v) continue;
        const std::size_t operands = (input ? n.sig.input_axes : n.sig.output_axes).size();
        if (position < operands && n.sig.effect_on(*v, input, position).effect == split_effect::sliced) out.push_back(b);
    }
    return out;
}

LOOM_INLINE std::int64_t repeating_period(const plan::op_partition& p, const std::vector<std::size_t>& kept) {
    std::int64_t period = p.pieces();
    // Pieces k on devices k (no list): no two pieces share a device, nothing repeats.
    const auto listed = static_cast<std::int64_t>(p.devices.size());
    if (listed == 0 || period % listed != 0) return period;
    for (std::size_t b = 0; b < p.splits.size(); ++b) {
        if (std::find(kept.begin(), kept.end(), b) != kept.end()) break;
        const std::int64_t degree = p.splits[b].degree;
        if (degree <= 1) continue;
        // Within the first block of the splits before b, the values of split b are blocks of
        // period / degree pieces.
        const std::int64_t block = period / degree;
        if (block % listed == 0) {  // the list's own repetition (op_partition::devices)
            period = block;
            continue;
        }
        if (period > listed) return period;
        const auto first = p.devices.begin();
        for (std::int64_t k = 1; k < degree; ++k)
            if (!std::equal(first + k * block, first + (k + 1) * block, first)) return period;
        period = block;
    }
    return period;
}

LOOM_INLINE void regions_per_device(const plan::op_partition& p, const std::vector<std::size_t>& slicing,
                                    std::size_t devices, std::vector<std::int64_t>& count, std::vector<std::size_t>& holders) {
    holders.clear();
    // The first `pieces` stand for all: the rest repeat their devices along splits that do
    // not slice the operand, so they hold the same regions on the same devices.
    const std::int64_t pieces = repeating_period(p, slicing);
    bool colocated = pieces < p.pieces();
    for (std::int64_t piece = 0; piece < pieces; ++piece)
        if (const int d = p.device_of(piece); d >= 0 && static_cast<std::size_t>(d) < devices) {
            std::int64_t& c = count[static_cast<std::size_t>(d)];
            if (c == 0) holders.push_back(static_cast<std::size_t>(d));
            colocated = c++ > 0 || colocated;
        }
    if (!colocated) return;
    // A piece's region: its coordinates along the slicing splits, as one mixed-radix number
    // (piece index = ((c0 d1 + c1) d2 + ...) replicas + replica, so coordinate b is
    // piece / stride_b % degree_b). Each device counts its distinct regions, marked in a
    // devices x regions bitmap (sorted keys where that would be large): at a thousand
    // devices with hundreds of micro-batch pieces each, this runs for every parameter
    // reading of every bounded assignment.
    std::vector<std::int64_t> stride(p.splits.size());
    std::int64_t below = p.replicas;
    for (std::size_t b = p.splits.size(); b-- > 0;) {
        stride[b] = below;
        below *= p.splits[b].degree;
    }
    std::int64_t radix = 1;
    for (std::size_t b : slicing) radix *= p.splits[b].degree;
    auto region_of = [&](std::int64_t piece) {
        std::int64_t region = 0;
        for (std::size_t b : slicing) region = region * p.splits[b].degree + piece / stride[b] % p.splits[b].degree;
        return region;
    };
    // Counted again, as regions: the holders' places in a holders x regions bitmap.
    for (std::size_t d : holders) count[d] = 0;
    constexpr std::int64_t bitmap_limit = std::int64_t{1} << 24;
    if (radix <= bitmap_limit / static_cast<std::int64_t>(std::max<std::size_t>(holders.size(), 1))) {
        std::vector<std::size_t> place(devices);
        for (std::size_t k = 0; k < holders.size(); ++k) place[holders[k]] = k;
        std::vector<bool> seen(holders.size() * static_cast<std::size_t>(radix), false);
        for (std::int64_t piece = 0; piece < pieces; ++piece) {
            const int d = p.device_of(piece);
            if (d < 0 || static_cast<std::size_t>(d) >= devices) continue;
            const std::size_t key = place[static_cast<std::size_t>(d)] * static_cast<std::size_t>(radix) +
                                    static_cast<std::size_t>(region_of(piece));
            if (seen[key]) continue;
            seen[key] = true;
            ++count[static_cast<std::size_t>(d)];
        }
        return;
    }
    std::vector<std::int64_t> keys;
    keys.reserve(static_cast<std::size_t>(pieces));
    for (std::int64_t piece = 0; piece < pieces; ++piece) {
        const int d = p.device_of(piece);
        if (d >= 0 && static_cast<std::size_t>(d) < devices) keys.push_back(static_cast<std::int64_t>(d) * radix + region_of(piece));
    }
    std::sort(keys.begin(), keys.end());
    keys.erase(std::unique(keys.begin(), keys.end()), keys.end());
    for (std::int64_t key : keys) ++count[static_cast<std::size_t>(key / radix)];
}

LOOM_INLINE const piece_spread::spread& piece_spread::of(node_id n) {
    const auto i = static_cast<std::size_t>(n);
    if (spreads_.size() <= i) spreads_.resize(std::max(i + 1, rp_.forward.size()));
    if (spreads_[i]) return *spreads_[i];
    const plan::op_partition& p = *rp_.at(n);
    count_.resize(static_cast<std::size_t>(std::max(rp_.devices, 0)), 0);  // all 0 between calls
    spread& out = spreads_[i].emplace();
    // Counted over the first period of pieces, which the rest repeat on the same devices.
    const std::int64_t period = repeating_period(p);
    const std::int64_t repeats = p.pieces() / period;
    for (std::int64_t k = 0; k < period; ++k)
        if (const int d = p.device_of(k); d >= 0 && d < rp_.devices && count_[static_cast<std::size_t>(d)]++ == 0)
            out.push_back({d, 0});
    std::sort(out.begin(), out.end());
    for (auto& [d, count] : out) {
        std::swap(count, count_[static_cast<std::size_t>(d)]);
        count *= repeats;
    }
    return out;
}

// Per forward node of the model: the variable of its signature that each split of its
// partition binds to (-1: none), for training_op::piece_elements_written; made on first use.
// Without the model, none.
class split_variables {
public:
    split_variables(const graph* model, const plan::resolved_plan& rp) : model_(model), rp_(rp) {}
    const std::vector<int>& of(node_id n) {
        static const std::vector<int> none;
        const plan::op_partition* p = rp_.at(n);
        if (!model_ || !p) return none;
        const auto i = static_cast<std::size_t>(n);
        if (made_.size() <= i) made_.resize(i + 1);
        if (!made_[i]) {
            std::vector<int>& out = made_[i].emplace();
            for (const plan::split_axis& s : p->splits)
                out.push_back(partition::detail::variable_of(model_->nodes[i], s).value_or(-1));
        }
        return *made_[i];
    }

private:
    const graph* model_;
    const plan::resolved_plan& rp_;
    std::vector<std::optional<std::vector<int>>> made_;
};

LOOM_INLINE device_compute compute_lower_bound(const plan::resolved_plan& rp, const training_work& work,
                                               const price_options& o, const graph* model, piece_spread* spread) {
    std::optional<piece_spread> own;
    if (!spread) spread = &own.emplace(rp);
    const auto devices = static_cast<std::size_t>(rp.devices);
    device_compute out{std::vector<double>(devices, 0.0), std::vector<double>(devices, 0.0), std::vector<double>(devices, 0.0)};
    auto add = [&](std::vector<double>& busy, node_id n, const plan::op_partition* p, double piece) {
        if (!p) {
            for (double& b : busy) b += piece;
            return;
        }
        for (const auto& [d, pieces] : spread->of(n)) busy[static_cast<std::size_t>(d)] += piece * static_cast<double>(pieces);
    };
    // Ops as written (not decomposed; unknown without the model).
    auto written = [&](node_id n) {
        const plan::op_partition* q = rp.at(n);
        return model && (!q || !decomposed(model->nodes[static_cast<std::size_t>(n)], *q));
    };
    const bool solo = !o.solo_rates.empty();
    if (solo) out.alone.assign(devices, 0.0), out.machine.assign(devices, 0.0);
    auto add_solo = [&](node_id n, const plan::op_partition* p, const training_op& op, double piece, bool as_written) {
        if (!solo) return;
        const double alone = op.alone_piece_seconds(share_of(p), piece, as_written, o.compute_shared_by);
        add(out.alone, n, p, alone + o.instruction_overhead);
        add(out.machine, n, p, std::min(piece, alone) + o.instruction_overhead);
    };
    split_variables variables(model, rp);
    for (const training_op& op : work.ops) {
        const plan::op_partition* p = rp.at(op.source);
        const bool as_written = written(op.source);
        const double piece = op.piece_seconds(share_of(p), op.piece_elements_written(p, variables.of(op.source)), as_written);
        add(op.backward ? out.backward : out.forward, op.source, p, piece + o.instruction_overhead);
        add_solo(op.source, p, op, piece, as_written);
    }
    if (!model) return out;
    // One replay of a recomputed node, for the backward readers in its own stage (of ops as
    // written: a decomposed op's readers and replays are other ops).
    auto stage_of = [&](node_id n) { return rp.pipelined() ? rp.stage_of.at(static_cast<std::size_t>(n)) : 0; };
    for (std::size_t i = 0; i < work.nodes.size(); ++i) {
        const node_work& w = work.nodes[i];
        const auto n = static_cast<node_id>(i);
        const plan::op_partition* p = rp.at(n);
        if (!p || !p->recompute || w.forward_op < 0 || !written(n) ||
            std::none_of(w.backward_readers.begin(), w.backward_readers.end(),
                         [&](node_id r) { return written(r) && stage_of(r) == stage_of(n); }))
            continue;
        const training_op& op = work.ops[static_cast<std::size_t>(w.forward_op)];
        const double piece = op.piece_seconds(share_of(p), op.piece_elements_written(p, variables.of(n)));
        add(out.replays, n, p, piece + o.instruction_overhead);
        add_solo(n, p, op, piece, true);
    }
    return out;
}

LOOM_INLINE double dependency_lower_bound(const plan::resolved_plan& rp, const training_work& work, const price_options& o,
                                          const graph& model, const device_compute& compute,
                                          const std::vector<double>& weights, piece_spread* spread,
                                          std::optional<pipeline_blocks>* blocks) {
    std::optional<piece_spread> own;
    if (!spread) spread = &own.emplace(rp);
    // Each op's length in a chain: one piece (one micro-batch's share on one device) with
    // its instruction; zero for the ops of a decomposed node.
    std::vector<double> share(work.nodes.size(), 0.0);  // 0: decomposed
    for (std::size_t i = 0; i < work.nodes.size(); ++i) {
        const plan::op_partition* p = rp.at(static_cast<node_id>(i));
        share[i] = p && decomposed(model.nodes[i], *p) ? 0.0 : share_of(p);
    }
    const std::size_t ops = work.ops.size();
    split_variables variables(&model, rp);
    std::vector<double> length(ops), before(ops, 0.0), after(ops, 0.0);
    for (std::size_t k = 0; k < ops; ++k) {
        const training_op& op = work.ops[k];
        const double n = share[static_cast<std::size_t>(op.source)];
        length[k] = n > 0 ? op.piece_seconds(n, op.piece_elements_written(rp.at(op.source), variables.of(op.source))) +
                                o.instruction_overhead
                          : 0.0;
        for (std::int32_t r : op.reads)
            before[k] = std::max(before[k], before[static_cast<std::size_t>(r)] + length[static_cast<std::size_t>(r)]);
    }
    for (std::size_t k = ops; k-- > 0;)
        for (std::int32_t r : work.ops[k].reads)
            after[static_cast<std::size_t>(r)] = std::max(after[static_cast<std::size_t>(r)], after[k] + length[k]);
    double bound = schedule_lower_bound(rp, work, length, weights, spread, blocks);
    // Per device and pass (forward, backward), the shortest chain before and after any op
    // it holds.
    constexpr double none = std::numeric_limits<double>::infinity();
    const std::size_t devices = compute.forward.size();
    std::vector<double> head[2] = {std::vector<double>(devices, none), std::vector<double>(devices, none)};
    std::vector<double> tail[2] = {head[0], head[0]};
    for (std::size_t k = 0; k < ops; ++k) {
        const plan::op_partition* p = rp.at(work.ops[k].source);
        const int pass = work.ops[k].backward ? 1 : 0;
        auto hold = [&](int d) {
            if (d < 0 || d >= static_cast<int>(devices)) return;
            auto& h = head[pass][static_cast<std::size_t>(d)];
            auto& t = tail[pass][static_cast<std::size_t>(d)];
            h = std::min(h, before[k]);
            t = std::min(t, after[k]);
        };
        if (!p)
            for (std::size_t d = 0; d < devices; ++d) hold(static_cast<int>(d));
        else
            for (const auto& [d, pieces] : spread->of(work.ops[k].source)) hold(d);
    }
    // A device runs all its ops between the start of its first and the end of its last, and
    // its backward ops (replays apart, which need only local inputs) between the first
    // that can start and the last.
    for (std::size_t d = 0; d < devices; ++d) {
        const double first = std::min(head[0][d], head[1][d]), last = std::min(tail[0][d], tail[1][d]);
        if (first != none) bound = std::max(bound, first + compute.total(d) + last);
        if (head[1][d] != none) bound = std::max(bound, head[1][d] + compute.backward[d] + tail[1][d]);
        if (head[0][d] != none) bound = std::max(bound, head[0][d] + compute.forward[d] + tail[0][d]);
    }
    return bound;
}

LOOM_INLINE held_in_flight activation_floor(const plan::resolved_plan& rp, const graph& model, const training_work& work,
                                            const price_options& o, const std::vector<std::vector<double>>& partials) {
    const auto devices = static_cast<std::size_t>(rp.devices);
    const std::size_t forward = std::min({rp.forward.size(), model.forward_node_count(), work.nodes.size()});
    const bool ordered = rp.order && rp.pipelined();
    const int stages = ordered ? std::max(1, rp.order->shape.stages) : 1;
    const int last_round = ordered ? rp.order->shape.rounds - 1 : 0;
    // One micro-batch is the whole batch: no op carries the micro-batch split, and what an op
    // keeps once per step it keeps for that one micro-batch.
    const bool one_micro_batch = ordered && rp.order->shape.micro_batches == 1;
    // Per (tensor, device): the largest piece of it one micro-batch keeps there, and its stage.
    struct kept {
        double bytes = 0;
        int stage = 0;
    };
    // Per tensor: (device, kept) in device order, as few as the devices of its pieces.
    std::vector<std::vector<std::pair<std::size_t, kept>>> pieces(model.tensors.size());
    auto stage_of = [&](std::size_t n) { return ordered && n < rp.stage_of.size() ? rp.stage_of[n] : 0; };
    auto recomputed = [&](std::size_t n) {
        const plan::op_partition* p = n < forward ? rp.at(static_cast<node_id>(n)) : nullptr;
        return p && p->recompute;
    };
    auto layer_of = [&](std::size_t n) { return partition::detail::recompute_layer_of(model, static_cast<node_id>(n)); };
    // Whose pieces keep what: y keeps the operand its derivative reads (y's own output when
    // y == x, else y's input that x produced); a recomputed x that a backward op of its own
    // stage reads is replayed, and its replay starts from x's inputs made outside its layer
    // or stage or by an op not recomputed (y == x, x's inputs from `from`).
    struct keeper {
        std::size_t y, x;
        bool inputs_of_replay;
    };
    std::vector<keeper> keepers;
    for (std::size_t x = 0; x < forward; ++x)
        for (const node_id y : work.nodes[x].backward_readers) {
            const auto yi = static_cast<std::size_t>(y);
            if (yi >= forward) continue;
            if (!recomputed(x) || stage_of(yi) != stage_of(x)) keepers.push_back({yi, x, false});
            else keepers.push_back({x, x, true});
        }
    for (const keeper& kp : keepers) {
        const std::size_t yi = kp.y, x = kp.x;
        const node& n = model.nodes[yi];
        const plan::op_partition* p = rp.at(static_cast<node_id>(yi));
        if (p && decomposed(n, *p)) continue;
        if (ordered && (yi >= rp.stage_of.size() || (!rp.micro_split[yi] && !one_micro_batch) ||
                        rp.stage_of[yi] < 0 || rp.stage_of[yi] >= stages || rp.round_of[yi] != last_round))
            continue;  // kept once per step, or by an earlier round that keeps nothing
        // The operand: of several, the smallest piece.
        std::optional<std::pair<tensor_id, double>> operand;
        auto consider = [&](bool input, std::size_t k, tensor_id t) {
            const tensor_desc& td = model.tensor(t);
            if (td.role == tensor_role::parameter) return;
            double elements = static_cast<double>(td.dims.numel());
            bool per_micro_batch = !ordered || one_micro_batch;
            if (p)
                for (std::size_t b : slicing_splits(n, *p, input, k)) {
                    elements /= static_cast<double>(p->splits[b].degree);
                    per_micro_batch = per_micro_batch || (b == 0 && rp.micro_split[yi]);
                }
            if (!per_micro_batch) return;  // every micro-batch reads the same tensor
            const double bytes = elements * static_cast<double>(real_bytes(storage_precision(model, t, o.storage)));
            if (!operand || bytes < operand->second) operand = {t, bytes};
        };
        const int stage = stage_of(yi);
        auto hold_operand = [&] {
            if (!operand) return;
            auto& on = pieces[static_cast<std::size_t>(operand->first)];
            auto hold = [&](std::size_t d) {
                auto at = std::lower_bound(on.begin(), on.end(), d, [](const auto& e, std::size_t device) { return e.first < device; });
                if (at == on.end() || at->first != d) at = on.insert(at, {d, kept{}});
                kept& k = at->second;
                if (operand->second > k.bytes) k = {operand->second, stage};
            };
            if (!p) {
                for (std::size_t d = 0; d < devices; ++d) hold(d);
            } else {
                for (std::int64_t i = 0, period = repeating_period(*p); i < period; ++i)
                    if (const int d = p->device_of(i); d >= 0 && static_cast<std::size_t>(d) < devices)
                        hold(static_cast<std::size_t>(d));
            }
            operand.reset();
        };
        if (kp.inputs_of_replay) {
            for (std::size_t k = 0; k < n.inputs.size(); ++k) {
                const node_id from = model.tensor(n.inputs[k]).producer;
                if (from == no_id) continue;
                const auto fi = static_cast<std::size_t>(from);
                if (recomputed(fi) && stage_of(fi) == stage && layer_of(fi) == layer_of(yi)) continue;  // replayed too
                consider(true, k, n.inputs[k]);
                hold_operand();
            }
        } else if (yi == x) {
            for (std::size_t k = 0; k < n.outputs.size(); ++k) consider(false, k, n.outputs[k]);
        } else {
            for (std::size_t k = 0; k < n.inputs.size(); ++k)
                if (model.tensor(n.inputs[k]).producer == static_cast<node_id>(x)) consider(true, k, n.inputs[k]);
        }
        hold_operand();
    }
    // Per device and stage: what one micro-batch keeps.
    std::vector<std::vector<double>> per_micro_batch(devices, std::vector<double>(static_cast<std::size_t>(stages), 0.0));
    for (const auto& on : pieces)
        for (const auto& [d, k] : on) per_micro_batch[d][static_cast<std::size_t>(k.stage)] += k.bytes;
    held_in_flight floor{std::vector<double>(devices, 0.0), std::vector<double>(devices, 0.0)};
    if (!ordered) {
        for (std::size_t d = 0; d < devices; ++d) floor.activations[d] = per_micro_batch[d][0];
        return floor;
    }
    // Per device and stage: its backward blocks, in all and so far.
    std::vector<std::vector<int>> backwards(devices, std::vector<int>(static_cast<std::size_t>(stages), 0));
    std::vector<std::vector<int>> done = backwards;
    for (std::size_t d = 0; d < devices && d < rp.order->device_order.size(); ++d)
        for (const schedule::block& b : rp.order->device_order[d])
            if (schedule::is_backward(b) && b.stage >= 0 && b.stage < stages) ++backwards[d][static_cast<std::size_t>(b.stage)];
    schedule::detail::walk_in_flight(*rp.order, [&](int d, std::size_t, const schedule::block& b, const std::vector<int>& held) {
        const auto dev = static_cast<std::size_t>(d);
        if (dev >= devices || b.stage < 0 || b.stage >= stages) return;
        const bool backward = schedule::is_backward(b);
        if (backward) ++done[dev][static_cast<std::size_t>(b.stage)];
        else if (!schedule::is_forward(b)) return;
        // After a forward block, what every micro-batch in flight keeps; after a backward
        // block, the same without its own micro-batch, whose backward has ended.
        double kept = 0, sums = 0;
        for (std::size_t stage = 0; stage < held.size() && stage < per_micro_batch[dev].size(); ++stage) {
            const int micro_batches = held[stage] - (backward && stage == static_cast<std::size_t>(b.stage) ? 1 : 0);
            kept += static_cast<double>(std::max(micro_batches, 0)) * per_micro_batch[dev][stage];
            if (dev < partials.size() && stage < partials[dev].size() && done[dev][stage] >= 1 &&
                done[dev][stage] < backwards[dev][stage])
                sums += partials[dev][stage];
        }
        // After a backward block, the activations alone are below those after a forward.
        if (!backward) floor.activations[dev] = std::max(floor.activations[dev], kept);
        if (sums > 0) floor.with_partial_sums[dev] = std::max(floor.with_partial_sums[dev], kept + sums);
    });
    return floor;
}

LOOM_INLINE std::optional<schedule::schedule> pipeline_groups(const schedule::schedule& s) {
    // The groups: the distinct device sets the stages run on, disjoint, each member
    // following its group's first member's order.
    std::vector<std::vector<int>> groups;
    std::vector<int> group_of(static_cast<std::size_t>(s.shape.devices), -1);
    schedule::schedule out;
    out.name = s.name;
    out.shape = s.shape;
    for (std::size_t stage = 0; stage < s.shape.stage_devices.size(); ++stage) {
        const std::vector<int>& members = s.shape.stage_devices[stage];
        if (members.empty()) return std::nullopt;
        int g = -1;
        for (int d : members) {
            if (d < 0 || d >= s.shape.devices || static_cast<std::size_t>(d) >= s.device_order.size()) return std::nullopt;
            const int of = group_of[static_cast<std::size_t>(d)];
            if (of >= 0 && g < 0) g = of;
            if (of >= 0 && of != g) return std::nullopt;  // devices of two groups
        }
        if (g >= 0) {
            if (groups[static_cast<std::size_t>(g)] != members) return std::nullopt;  // overlapping sets
        } else {
            for (int d : members) {
                if (group_of[static_cast<std::size_t>(d)] >= 0) return std::nullopt;
                if (s.device_order[static_cast<std::size_t>(d)] != s.device_order[static_cast<std::size_t>(members.front())])
                    return std::nullopt;
                group_of[static_cast<std::size_t>(d)] = static_cast<int>(groups.size());
            }
            g = static_cast<int>(groups.size());
            groups.push_back(members);
        }
        out.shape.stage_devices[stage] = {g};
    }
    out.shape.devices = static_cast<int>(groups.size());
    for (const auto& members : groups) out.device_order.push_back(s.device_order[static_cast<std::size_t>(members.front())]);
    return out;
}

LOOM_INLINE double schedule_lower_bound(const plan::resolved_plan& rp, const training_work& work,
                                        const std::vector<double>& length, const std::vector<double>& weights,
                                        piece_spread* spread, std::optional<pipeline_blocks>* blocks) {
    if (!rp.order || !rp.pipelined()) return 0.0;
    std::optional<piece_spread> own;
    if (!spread) spread = &own.emplace(rp);
    const std::optional<schedule::schedule> order = pipeline_groups(*rp.order);
    if (!order) return 0.0;
    const schedule::pipeline_shape& shape = order->shape;
    if (shape.micro_batches != rp.micro_batches) return 0.0;
    const int rounds = shape.rounds;
    const std::size_t kinds = block_kinds(shape);
    auto kind_of_block = [&](const schedule::block& b) { return block_kind(shape, b); };
    // Each op's kind; ops outside the micro-batches' blocks (no batch to split) count nowhere.
    constexpr std::size_t outside = static_cast<std::size_t>(-1);
    const std::size_t ops = work.ops.size();
    std::vector<std::size_t> kind(ops, outside);
    for (std::size_t k = 0; k < ops; ++k) {
        const auto f = static_cast<std::size_t>(work.ops[k].source);
        if (f >= rp.stage_of.size() || !rp.micro_split[f]) continue;
        const int stage = rp.stage_of[f], round = rp.round_of[f];
        if (stage < 0 || stage >= shape.stages || round < 0 || round >= rounds) return 0.0;
        kind[k] = static_cast<std::size_t>(stage * (rounds + 1) + (work.ops[k].backward ? rounds : round));
    }
    // The kinds each kind waits for on another pipeline device (the order's own dependencies).
    std::vector<std::vector<std::size_t>> remote(kinds);
    for (std::size_t q = 0; q < kinds; ++q) {
        const int stage = static_cast<int>(q) / (rounds + 1), r = static_cast<int>(q) % (rounds + 1);
        const schedule::block b = r == rounds ? schedule::backward_block(stage, 0) : schedule::forward_block(stage, 0, r);
        schedule::for_each_input(shape, b, [&](const schedule::dependency& dep) {
            if (shape.stage_devices[static_cast<std::size_t>(dep.producer.stage)] != shape.stage_devices[static_cast<std::size_t>(stage)])
                remote[q].push_back(kind_of_block(dep.producer));
        });
    }
    // An op waits for a remote kind when it reads an op of that kind, or an op of its own
    // kind that waits for it; it waits for its block's inputs when it waits for every one.
    // Per op: the kinds it waits for, a bit each in `words` words (one flat array: a
    // training step has thousands of ops, each a few words).
    const std::size_t words = (kinds + 63) / 64;
    std::vector<std::uint64_t> waits(ops * words, 0);
    auto waits_of = [&](std::size_t k) { return waits.data() + k * words; };
    std::vector<char> waiting(ops, 0), output(ops, 0);
    std::vector<double> chain(ops, 0.0);  // longest chain of waiting ops of its kind ending at it
    for (std::size_t k = 0; k < ops; ++k) {
        const std::size_t q = kind[k];
        if (q == outside) continue;
        std::uint64_t* mine = waits_of(k);
        double longest = 0;
        for (std::int32_t r : work.ops[k].reads) {
            const auto from = static_cast<std::size_t>(r);
            if (kind[from] == q) {
                const std::uint64_t* theirs = waits_of(from);
                for (std::size_t w = 0; w < words; ++w) mine[w] |= theirs[w];
                if (waiting[from] || remote[q].empty()) longest = std::max(longest, chain[from]);
            } else if (kind[from] != outside) {
                mine[kind[from] / 64] |= std::uint64_t{1} << (kind[from] % 64);
                if (static_cast<int>(kind[from]) / (rounds + 1) != static_cast<int>(q) / (rounds + 1)) output[from] = 1;
            }
        }
        waiting[k] = std::all_of(remote[q].begin(), remote[q].end(), [&](std::size_t w) { return (mine[w / 64] >> (w % 64)) & 1; });
        if (waiting[k]) chain[k] = longest + length[k];
    }
    // Per kind: its work on each device, and the chains to its outputs.
    const auto devices = static_cast<std::size_t>(rp.devices);
    pipeline_blocks played{shape, std::vector<std::vector<double>>(kinds), std::vector<std::vector<double>>(kinds)};
    auto& work_on = played.work;
    for (std::size_t k = 0; k < ops; ++k) {
        const std::size_t q = kind[k];
        if (q == outside) continue;
        if (output[k]) {
            if (!waiting[k]) return 0.0;  // an output that need not wait for the block's inputs
            played.outputs[q].push_back(chain[k]);
        }
        if (!waiting[k]) continue;
        if (work_on[q].empty()) work_on[q].assign(devices, 0.0);
        const plan::op_partition* p = rp.at(work.ops[k].source);
        const double per_micro_batch = length[k] / static_cast<double>(rp.micro_batches);
        if (!p) {
            for (double& w : work_on[q]) w += length[k];
            continue;
        }
        for (const auto& [d, pieces] : spread->of(work.ops[k].source))
            work_on[q][static_cast<std::size_t>(d)] += per_micro_batch * static_cast<double>(pieces);
    }
    const std::optional<schedule::simulation> played_out = play_blocks(*order, played);
    if (!played_out) return 0.0;
    const schedule::simulation& timeline = *played_out;
    constexpr double none = std::numeric_limits<double>::infinity();
    double bound = timeline.makespan;
    // A weight's gradient is summed over the micro-batches before it is reduced, so every
    // reduction of a device waits for the last backward block of its stage to start (the
    // earliest such start among the stages it holds).
    for (std::size_t d = 0; d < weights.size() && d < devices; ++d) {
        if (weights[d] <= 0) continue;
        double last_backward = none;
        for (int stage = 0; stage < shape.stages; ++stage) {
            const std::size_t q = static_cast<std::size_t>(stage * (rounds + 1) + rounds);
            if (work_on[q].empty() || work_on[q][d] <= 0) continue;
            double last = 0;  // the start of the stage's last backward block
            for (int micro = 0; micro < shape.micro_batches; ++micro)
                last = std::max(last, timeline.at(schedule::backward_block(stage, micro)).start);
            last_backward = std::min(last_backward, last);
        }
        if (last_backward != none) bound = std::max(bound, last_backward + weights[d]);
    }
    if (blocks) *blocks = std::move(played);
    return bound;
}

LOOM_INLINE std::optional<schedule::simulation> play_blocks(const schedule::schedule& order, const pipeline_blocks& b) {
    const schedule::pipeline_shape& shape = order.shape;
    const std::size_t kinds = block_kinds(shape);
    if (b.work.size() != kinds || b.outputs.size() != kinds) return std::nullopt;
    auto kind_of_block = [&](const schedule::block& x) { return block_kind(shape, x); };
    constexpr double none = std::numeric_limits<double>::infinity();
    std::vector<double> duration(kinds, 0.0), ready(kinds, none);
    for (std::size_t q = 0; q < kinds; ++q) {
        double least = none;
        for (double w : b.work[q])
            if (w > 0) least = std::min(least, w);
        duration[q] = least == none ? 0.0 : least;
        for (double c : b.outputs[q]) ready[q] = std::min(ready[q], c);
    }
    schedule::cost_model costs;
    costs.duration = [&](const schedule::block& x) { return duration[kind_of_block(x)]; };
    costs.ready = [&](const schedule::block& x) {
        const double r = ready[kind_of_block(x)];
        return r == none ? duration[kind_of_block(x)] : r;
    };
    try {
        return schedule::simulate(order, costs, {.validated = true});
    } catch (const schedule::schedule_error&) {
        return std::nullopt;
    }
}

LOOM_INLINE std::optional<pipeline_blocks> extrapolate_blocks(const pipeline_blocks& a, const pipeline_blocks& b, double t) {
    if (a.shape.stages != b.shape.stages || a.shape.rounds != b.shape.rounds ||
        a.shape.stage_devices != b.shape.stage_devices || a.work.size() != b.work.size() ||
        a.outputs.size() != b.outputs.size())
        return std::nullopt;
    pipeline_blocks out = b;
    // Linear in the layers, never below zero: a block's work and its chains only grow with them.
    auto along = [t](double x, double y) { return std::max(0.0, x + (y - x) * t); };
    for (std::size_t q = 0; q < a.work.size(); ++q) {
        if (a.work[q].size() != b.work[q].size() || a.outputs[q].size() != b.outputs[q].size()) return std::nullopt;
        for (std::size_t d = 0; d < a.work[q].size(); ++d) out.work[q][d] = along(a.work[q][d], b.work[q][d]);
        for (std::size_t k = 0; k < a.outputs[q].size(); ++k) out.outputs[q][k] = along(a.outputs[q][k], b.outputs[q][k]);
    }
    return out;
}

}  // namespace loom::search::detail

namespace loom::search {

LOOM_INLINE memory_floor memory_lower_bound(const plan::resolved_plan& rp, const graph& model, const price_options& o,
                                            const training_work* work) {
    const auto devices = static_cast<std::size_t>(rp.devices);
    memory_floor out{std::vector<double>(devices, 0.0), std::vector<double>(devices, 0.0),
                     std::vector<double>(devices, 0.0), std::vector<double>(devices, 0.0),
                     std::vector<double>(devices, 0.0)};
    // The gradient partial sums over micro-batches (see memory_floor), per device and stage:
    // of the readings of pipelined ops that carry the micro-batch split in the last forward
    // round (whose backward blocks the order walks), as written.
    const bool ordered = work && rp.order && rp.pipelined();
    const int stages = ordered ? std::max(1, rp.order->shape.stages) : 0;
    std::vector<std::vector<double>> partials(ordered ? devices : 0, std::vector<double>(static_cast<std::size_t>(stages), 0.0));
    auto sums_micro_batches = [&](std::size_t i, const plan::op_partition* p) {
        return ordered && i < rp.stage_of.size() && i < rp.micro_split.size() && rp.micro_split[i] &&
               rp.stage_of[i] >= 0 && rp.stage_of[i] < stages && i < rp.round_of.size() &&
               rp.round_of[i] == rp.order->shape.rounds - 1 &&
               !(p && detail::decomposed(model.nodes[i], *p));
    };
    // Per device holding the parameter: its partial sum's elements and stage (-1: none), of
    // the reading that holds most there (a parameter two stages read is summed once).
    std::vector<std::pair<double, int>> partial_of(devices, {0.0, -1});
    // Per parameter: the largest region and fewest copies any device holds of it (a tied
    // embedding read by two ops counts once, at its larger reading).
    struct holding {
        double region = 0;   // elements held: the reading's regions on this device
        double copies = 0;   // devices holding each region, on average
        double regions = 1;  // the pieces that reading cut the parameter into
    };
    std::map<tensor_id, std::vector<std::pair<std::size_t, std::size_t>>> readers;  // parameter -> (node, input)
    const std::size_t forward = std::min(rp.forward.size(), model.forward_node_count());
    for (std::size_t i = 0; i < forward; ++i)
        for (std::size_t k = 0; k < model.nodes[i].inputs.size(); ++k)
            if (model.tensor(model.nodes[i].inputs[k]).role == tensor_role::parameter)
                readers[model.nodes[i].inputs[k]].push_back({i, k});
    const int zero = static_cast<int>(rp.zero);
    std::vector<holding> held(devices);
    std::vector<std::int64_t> regions_held(devices, 0);  // per device: the regions one reading's pieces hold there
    std::vector<std::size_t> holders;                   // the devices of one reading's pieces
    std::vector<std::size_t> touched;                   // devices holding the parameter
    for (const auto& [t, list] : readers) {
        touched.clear();
        for (const auto& [i, k] : list) {
            const node& n = model.nodes[i];
            const plan::op_partition* p = rp.at(static_cast<node_id>(i));
            double region = static_cast<double>(model.tensor(t).dims.numel()), regions = 1;
            std::vector<std::size_t> slicing;
            if (p && !detail::decomposed(n, *p)) slicing = detail::slicing_splits(n, *p, true, k);
            for (std::size_t b : slicing) {
                region /= static_cast<double>(p->splits[b].degree);
                regions *= static_cast<double>(p->splits[b].degree);
            }
            // A device holds every distinct region its pieces read: colocated pieces of
            // one reading (Coshard) hold theirs side by side.
            if (!p) {
                holders.resize(devices);
                for (std::size_t d = 0; d < devices; ++d) {
                    holders[d] = d;
                    regions_held[d] = 1;
                }
            } else {
                detail::regions_per_device(*p, slicing, devices, regions_held, holders);
            }
            std::int64_t holdings = 0;  // (device, region) pairs
            for (std::size_t d : holders) holdings += regions_held[d];
            const double copies = std::max(1.0, static_cast<double>(holdings) / regions);
            // ZeRO-2 and 3 reduce each micro-batch's gradient onto the shards as it is made:
            // no partial sum of a whole region outlives its micro-batch (the tied embedding's,
            // merged per device first, is left out: a floor may hold less than the programs).
            const bool partial = zero < 2 && sums_micro_batches(i, p);
            for (std::size_t d : holders) {
                const double amount = region * static_cast<double>(regions_held[d]);
                if (held[d].region == 0) touched.push_back(d);
                if (amount > held[d].region || held[d].region == 0) held[d] = {amount, copies, regions};
                if (partial && amount > partial_of[d].first) partial_of[d] = {amount, rp.stage_of[i]};
                regions_held[d] = 0;
            }
        }
        const double bytes = static_cast<double>(real_bytes(storage_precision(model, t, o.storage)));
        for (std::size_t d : touched) {
            if (const auto [elements, stage] = std::exchange(partial_of[d], {0.0, -1}); stage >= 0)
                partials[d][static_cast<std::size_t>(stage)] += elements * bytes;
            const holding h = held[d];
            held[d] = {};
            // parameters, gradients (same precision), optimizer state
            const double parts[3][2] = {{h.region * bytes, zero >= 3 ? 1.0 : 0.0},
                                        {h.region * bytes, zero >= 2 ? 1.0 : 0.0},
                                        {h.region * o.optimizer_bytes_per_element, zero >= 1 ? 1.0 : 0.0}};
            for (const auto& [amount, sharded] : parts) {
                if (sharded > 0) out.sharded[d] += amount / h.copies;
                else out.whole[d] += amount;
            }
            // ZeRO-1/2 shard the update of a piece over every device storing it, a tied
            // parameter's readers on other stages too: the devices holding the parameter
            // per piece, when that is more than one reading's copies. ZeRO-3 stores shards
            // whose cut the readings do not show (a tied parameter's): counted as none.
            const double update_copies = std::max(h.copies, static_cast<double>(touched.size()) / h.regions);
            if (zero < 3) out.updated[d] += zero >= 1 ? h.region / update_copies : h.region;
        }
    }
    if (work) {
        detail::held_in_flight held_then = detail::activation_floor(rp, model, *work, o, partials);
        out.activations = std::move(held_then.activations);
        out.with_partial_sums = std::move(held_then.with_partial_sums);
    }
    return out;
}

LOOM_INLINE double after_programs_lower_bound(const memory_floor& floor, const cluster& c, const price_options& o) {
    if (!(c.device.memory_bandwidth * c.device.elementwise_efficiency > 0)) return 0;
    double slowest = 0, all = 0;
    for (double n : floor.updated) {
        const double seconds = optimizer_pass_seconds(n, 0, c, o);
        slowest = std::max(slowest, seconds);
        all += seconds;
    }
    return o.compute_shared_by > 1 ? all : slowest;
}

}  // namespace loom::search

namespace loom::search::detail {

LOOM_INLINE std::vector<double> communication_lower_bound(const plan::resolved_plan& rp, const graph& model, const cluster& c,
                                                          const price_options& o, std::vector<double>* weights) {
    // tensor -> (seconds, the op that forces it) of its largest reduction so far
    std::map<tensor_id, std::pair<double, node_id>> reductions;
    const std::size_t forward = std::min(rp.forward.size(), model.forward_node_count());
    const int per_node = std::max(1, c.topo.devices_per_node);
    // A collective over `members` devices: at least its transmission at the group's tightest
    // placement and one message's latency (more steps cost more latency, but a placement
    // over more nodes may need fewer steps: one is what every placement pays).
    // Inside a node, the fastest of the links measured per collective: the bound's
    // collectives (reduce-scatter, all-gather) need not be the ones the program runs.
    cluster fastest = c;
    for (const auto& [kind, l] : c.topo.intra_node_by_collective) {
        fastest.topo.intra_node.bandwidth = std::max(fastest.topo.intra_node.bandwidth, l.bandwidth);
        fastest.topo.intra_node.latency = std::min(fastest.topo.intra_node.latency, l.latency);
    }
    fastest.topo.intra_node_by_collective.clear();
    const double message = std::min(fastest.topo.intra_node.latency, c.topo.inter_node_per_nic.latency);
    auto least_seconds = [&](collective kind, double bytes, int members) {
        group_placement tight;
        tight.nodes = (members + per_node - 1) / per_node;
        tight.max_per_node = std::min(members, per_node);
        tight.min_per_node = members - (tight.nodes - 1) * tight.max_per_node;
        return collective_cost(fastest, kind, bytes, members, tight, o.collectives, 1).transmission + message;
    };
    // The distinct devices of the pieces that differ from piece 0 only along axis a.
    // In ascending order.
    auto devices_along = [](const plan::op_partition& p, std::size_t a) {
        std::vector<int> seen;
        std::int64_t stride = p.replicas;
        for (std::size_t b = p.splits.size(); b-- > a + 1;) stride *= p.splits[b].degree;
        seen.reserve(static_cast<std::size_t>(p.splits[a].degree));
        for (std::int64_t k = 0; k < p.splits[a].degree; ++k) seen.push_back(p.device_of(k * stride));
        std::sort(seen.begin(), seen.end());
        seen.erase(std::unique(seen.begin(), seen.end()), seen.end());
        return seen;
    };
    auto members_along = [&](const plan::op_partition& p, std::size_t a) { return static_cast<int>(devices_along(p, a).size()); };
    // Whether every device of `group` reads one same region of tensor t through op q (t its
    // input or output at `position`), so that each needs that region's whole sum: the
    // regions are the coordinates of q's pieces along the cuts that slice t. Asked for every
    // partial operand of every op: its buffers live across the calls.
    std::vector<int> member_slot(static_cast<std::size_t>(rp.devices), -1);  // device -> its place in the group
    std::vector<char> region_read;            // (region, place in the group) -> read
    std::vector<std::size_t> region_readers;  // region -> members reading it
    std::vector<std::size_t> read_keys;       // region x places + place, where a bitmap would be large
    auto read_whole_by_all = [&](node_id q, bool input, std::size_t position, const std::vector<int>& group) {
        const plan::op_partition* pq = rp.at(q);
        if (!pq) return true;  // whole on every device
        const node& nq = model.nodes[static_cast<std::size_t>(q)];
        if (decomposed(nq, *pq)) return false;
        const std::vector<std::size_t> slicing = slicing_splits(nq, *pq, input, position);
        // A piece's coordinate along split b: (piece / stride[b]) % degree (op_partition::coordinates).
        std::vector<std::int64_t> stride(pq->splits.size());
        for (std::int64_t next = pq->replicas, b = static_cast<std::int64_t>(pq->splits.size()); b-- > 0;) {
            stride[static_cast<std::size_t>(b)] = next;
            next *= pq->splits[static_cast<std::size_t>(b)].degree;
        }
        // The group's distinct devices (a device listed twice counts once, as a reader).
        std::size_t places = 0;
        for (int d : group)
            if (d >= 0 && d < rp.devices && member_slot[static_cast<std::size_t>(d)] < 0)
                member_slot[static_cast<std::size_t>(d)] = static_cast<int>(places++);
        std::size_t regions = 1;
        for (std::size_t b : slicing) regions *= static_cast<std::size_t>(pq->splits[b].degree);
        // Each (region, member) pair read, in a regions x members bitmap, or where that would
        // be far larger than the pieces (a data-parallel group of hundreds reading one of
        // thousands of micro-batch regions), as sorted keys: a region's keys are adjacent.
        // The pieces past the first period repeat its devices and regions.
        const std::int64_t period = repeating_period(*pq, slicing);
        const auto pieces = static_cast<std::size_t>(period);
        const bool bitmap = regions * places <= std::max<std::size_t>(4096, 4 * pieces);
        if (bitmap) {
            region_read.assign(regions * places, 0);
            region_readers.assign(regions, 0);
        } else {
            read_keys.clear();
        }
        bool whole = false;
        for (std::int64_t piece = 0; piece < period && !whole; ++piece) {
            const int d = pq->device_of(piece);
            if (d < 0 || d >= rp.devices || member_slot[static_cast<std::size_t>(d)] < 0) continue;
            std::size_t region = 0;  // its coordinates as one number
            for (std::size_t b : slicing)
                region = region * static_cast<std::size_t>(pq->splits[b].degree) +
                         static_cast<std::size_t>((piece / stride[b]) % pq->splits[b].degree);
            const std::size_t key = region * places + static_cast<std::size_t>(member_slot[static_cast<std::size_t>(d)]);
            if (!bitmap) {
                read_keys.push_back(key);
                continue;
            }
            if (region_read[key]) continue;
            region_read[key] = 1;
            whole = ++region_readers[region] == group.size();
        }
        if (!bitmap) {
            std::sort(read_keys.begin(), read_keys.end());
            read_keys.erase(std::unique(read_keys.begin(), read_keys.end()), read_keys.end());
            for (std::size_t k = 0, run = 0; k < read_keys.size() && !whole; ++k) {
                run = k > 0 && read_keys[k] / places == read_keys[k - 1] / places ? run + 1 : 1;
                whole = run == group.size();
            }
        }
        for (int d : group)
            if (d >= 0 && d < rp.devices) member_slot[static_cast<std::size_t>(d)] = -1;
        return whole;
    };
    // Per tensor: the forward ops that read it, with the input's position.
    std::vector<std::vector<std::pair<std::size_t, std::size_t>>> readers_of(model.tensors.size());
    for (std::size_t q = 0; q < forward; ++q)
        for (std::size_t k = 0; k < model.nodes[q].inputs.size(); ++k)
            readers_of[static_cast<std::size_t>(model.nodes[q].inputs[k])].push_back({q, k});
    // Whether the sum of partial tensor t (made partial by node i) must reach every device of
    // `group` whole within the step: a weight's gradient without ZeRO (every replica updates
    // the whole weight) or a weight under ZeRO-3 (every replica gathers it to use it), an
    // output that a consumer reads the same region of on every member, or an input's
    // gradient whose producer's backward does.
    auto needed_whole = [&](tensor_id t, std::size_t i, const std::vector<int>& group) {
        const tensor_desc& td = model.tensor(t);
        if (td.role == tensor_role::parameter)
            return rp.zero == plan::zero_stage::none || rp.zero == plan::zero_stage::parameters;
        const node& n = model.nodes[i];
        if (std::find(n.outputs.begin(), n.outputs.end(), t) != n.outputs.end()) {
            for (const auto& [q, k] : readers_of[static_cast<std::size_t>(t)])
                if (q > i && read_whole_by_all(static_cast<node_id>(q), true, k, group)) return true;
            return false;
        }
        if (td.producer == no_id || static_cast<std::size_t>(td.producer) >= forward) return false;
        const node& producer = model.nodes[static_cast<std::size_t>(td.producer)];
        const auto position = static_cast<std::size_t>(std::find(producer.outputs.begin(), producer.outputs.end(), t) -
                                                       producer.outputs.begin());
        return read_whole_by_all(td.producer, false, position, group);
    };
    for (std::size_t i = 0; i < forward; ++i) {
        const plan::op_partition* p = rp.at(static_cast<node_id>(i));
        if (!p) continue;
        const node& n = model.nodes[i];
        // Partitions as the partitioner binds them: a split the op cannot make is left out.
        std::vector<std::optional<int>> variable(p->splits.size());
        for (std::size_t a = 0; a < p->splits.size(); ++a)
            if (p->splits[a].cuts()) variable[a] = partition::detail::variable_of(n, p->splits[a]);
        if (decomposed(n, *p)) continue;  // rebuilt into other ops, which move less than the op as written
        for (std::size_t a = 0; a < p->splits.size(); ++a) {
            if (!variable[a]) continue;
            const int var = *variable[a];
            // Operands that become partial along this axis: inputs that lack the variable
            // (their gradients), and outputs of a contracted variable. A split whose
            // transformation adjusts each piece may use an input on one piece only (the
            // row-parallel linear's bias): its inputs' gradients are left out.
            const auto* adjusted = plan::transformation_registry::instance().find(
                *n.op, n.sig.vars[static_cast<std::size_t>(*variable[a])].label);
            std::vector<tensor_id> partial;
            for (std::size_t k = 0; k < n.inputs.size() && k < n.sig.input_axes.size() && !adjusted; ++k) {
                const tensor_desc& t = model.tensor(n.inputs[k]);
                const bool needs_gradient = t.kind != value_kind::index && (t.producer != no_id || t.role == tensor_role::parameter);
                if (needs_gradient && n.sig.effect_on(var, true, k).effect == split_effect::replicated) partial.push_back(n.inputs[k]);
            }
            for (std::size_t k = 0; k < n.outputs.size() && k < n.sig.output_axes.size(); ++k)
                if (n.sig.effect_on(var, false, k).effect == split_effect::partial) partial.push_back(n.outputs[k]);
            if (partial.empty()) continue;
            // The group: the distinct devices of the pieces that differ from piece 0 only
            // along this axis (every group of an axis is alike); every device holding a
            // piece belongs to one.
            const std::vector<int> group = devices_along(*p, a);
            const int members = static_cast<int>(group.size());
            if (members < 2) continue;
            for (tensor_id t : partial) {
                // The piece each device holds: the tensor cut by the op's other cuts that slice it.
                const tensor_desc& td = model.tensor(t);
                double elements = static_cast<double>(td.dims.numel());
                double reductions_per_device = 1;  // pieces of t one device holds, each reduced on its own
                const bool is_input = std::find(n.inputs.begin(), n.inputs.end(), t) != n.inputs.end();
                for (std::size_t b = 0; b < p->splits.size(); ++b) {
                    if (b == a || !variable[b]) continue;
                    const auto pos = static_cast<std::size_t>(
                        (is_input ? std::find(n.inputs.begin(), n.inputs.end(), t) - n.inputs.begin()
                                  : std::find(n.outputs.begin(), n.outputs.end(), t) - n.outputs.begin()));
                    const std::size_t operands = (is_input ? n.sig.input_axes : n.sig.output_axes).size();
                    // Sliced: a piece holds 1/degree of it, and a device as many pieces as
                    // share it along that axis (micro-batches), each reduced in turn.
                    if (pos < operands && n.sig.effect_on(*variable[b], is_input, pos).effect == split_effect::sliced) {
                        const int along = members_along(*p, b);
                        elements /= static_cast<double>(along);
                        reductions_per_device *= static_cast<double>(p->splits[b].degree / std::max(1, along));
                    }
                }
                const double bytes = elements * static_cast<double>(real_bytes(storage_precision(model, t, o.storage)));
                const double piece = bytes / reductions_per_device;
                // Gathering the sum back to every member costs as much again (an all-reduce is a
                // reduce-scatter and an all-gather, in every algorithm).
                const double time =
                    reductions_per_device * (least_seconds(collective::reduce_scatter, piece, members) +
                                             (needed_whole(t, i, group) ? least_seconds(collective::all_gather, piece, members) : 0.0));
                auto& best = reductions[t];
                if (time <= best.first) continue;
                best = {time, node_id(i)};
            }
        }
    }
    // Each reduction is paid by every device holding a piece of the op that forces it.
    std::map<node_id, std::pair<double, double>> per_op;  // all, the weights' gradients
    for (const auto& [t, r] : reductions) {
        per_op[r.second].first += r.first;
        if (model.tensor(t).role == tensor_role::parameter) per_op[r.second].second += r.first;
    }
    std::vector<double> seconds(static_cast<std::size_t>(rp.devices), 0.0);
    if (weights) weights->assign(seconds.size(), 0.0);
    std::vector<char> holds(static_cast<std::size_t>(rp.devices), 0);  // 0 between ops
    std::vector<std::size_t> holders;
    for (const auto& [op, time] : per_op) {
        const plan::op_partition* p = rp.at(op);
        holders.clear();
        for (std::int64_t k = 0, period = repeating_period(*p); k < period; ++k)
            if (const int d = p->device_of(k); d >= 0 && d < rp.devices && !holds[static_cast<std::size_t>(d)]) {
                holds[static_cast<std::size_t>(d)] = 1;
                holders.push_back(static_cast<std::size_t>(d));
            }
        for (std::size_t d : holders) {
            seconds[d] += time.first;
            if (weights) (*weights)[d] += time.second;
            holds[d] = 0;
        }
    }
    return seconds;
}

LOOM_INLINE std::string seconds_text(double s) {
    std::ostringstream os;
    os.precision(3);
    if (s >= 1) os << s << " s";
    else if (s >= 1e-3) os << s * 1e3 << " ms";
    else os << s * 1e6 << " us";
    return os.str();
}

LOOM_INLINE std::string gib_text(double bytes) {
    std::ostringstream os;
    os.precision(3);
    os << bytes / gib << " GiB";
    return os.str();
}

LOOM_INLINE std::string price_text(const program_price& p) {
    std::ostringstream os;
    // Devices that compute at least 1% of what the busiest does.
    int used = 0;
    for (const auto& d : p.devices) used += d.compute >= 0.01 * p.max_compute() ? 1 : 0;
    os << "computes on " << used << " of " << p.devices.size() << " devices; step " << seconds_text(p.step_seconds) << " (busiest compute " << seconds_text(p.max_compute())
       << ", busiest communication " << seconds_text(p.max_communication()) << ", "
       << static_cast<int>(std::lround(p.idle_fraction() * 100)) << "% of device time idle), peak memory "
       << gib_text(p.peak_memory()) << " on device " << p.peak_memory_device();
    return os.str();
}

LOOM_INLINE std::string separation_text(const program_price& a, const program_price& b) {
    if (std::abs(a.step_seconds - b.step_seconds) <= 1e-12 * std::max(a.step_seconds, b.step_seconds))
        return "nothing in their price: they tie, and the first in the enumeration order wins";
    struct part {
        const char* name;
        double a, b;
    };
    const double idle_a = a.makespan * a.idle_fraction(), idle_b = b.makespan * b.idle_fraction();
    // The norm, clipping and the optimizer's update, then the collectives after them (the
    // norm's all-reduce, ZeRO's shard gathers).
    auto after_programs = [](const program_price& p) {
        double m = 0;
        for (const auto& d : p.devices) m = std::max(m, d.optimizer + d.gathers);
        return m;
    };
    const part parts[] = {{"busiest device's compute", a.max_compute(), b.max_compute()},
                          {"busiest device's communication", a.max_communication(), b.max_communication()},
                          {"idle time (bubbles and exposed communication) per device", idle_a, idle_b},
                          {"slowest step after the programs (norm, clipping, optimizer, shard gathers)",
                           after_programs(a), after_programs(b)}};
    // The component that grew most in the slower plan b (one that shrank cannot be why).
    const part* most = nullptr;
    for (const part& p : parts)
        if (p.b > p.a && (!most || p.b - p.a > most->b - most->a)) most = &p;
    if (!most) return "no single part: the slower plan's parts each take less, but they overlap less";
    return std::string(most->name) + ": " + seconds_text(most->a) + " against " + seconds_text(most->b);
}
}  // namespace loom::search::detail

namespace loom::search {

LOOM_INLINE std::string plan_search_result::explain() const {
    std::ostringstream os;
    os << "chosen: " << choices_text(parameters, best.choices) << "\n  " << detail::price_text(best.price) << "\n";
    if (stats.ties) os << "  (" << stats.ties << " other assignments price the same)\n";
    if (runner_up) {
        const double slower = runner_up->price.step_seconds / best.price.step_seconds - 1.0;
        os << "runner-up: " << choices_text(parameters, runner_up->choices) << "\n  "
           << detail::price_text(runner_up->price) << " (" << static_cast<int>(std::lround(slower * 1000)) / 10.0
           << "% slower)\n  what separated them: " << detail::separation_text(best.price, runner_up->price) << "\n";
    } else {
        os << "runner-up: none (no slower assignment is legal and fits)\n";
    }
    os << "searched " << stats.assignments << " assignments: " << stats.refused << " refused, " << stats.priced
       << " priced from their programs, " << stats.over_memory << " over " << detail::gib_text(memory_limit)
       << " per device";
    if (stats.over_memory_unpriced)
        os << " (" << stats.over_memory_unpriced
           << " by their weights, gradients, optimizer state and activations in flight alone, unpriced)";
    os << ", " << stats.pruned << " pruned by the bound";
    if (stats.unexplored) os << ", " << stats.unexplored << " left by the budget";
    if (stats.unbounded)
        os << ", " << stats.unbounded << " not even bounded within the budget (the best is not proven: narrow the space "
           << "or raise the budget)";
    if (stats.descended)
        os << ", " << stats.descended << " of the others reached by a descent from the best bounded (which bounded "
           << stats.looked_at << " to compare)";
    if (stats.even_cut_only)
        os << ", " << stats.even_cut_only << " with the even stage cut only (more than " << max_boundary_cuts
           << " cuts at their stage count: narrow the boundaries' slack to search them)";
    os << "; gap " << static_cast<int>(std::lround(gap * 1000)) / 10.0 << "%";
    if (gap == 0) os << " (proven best)";
    else if (stats.unbounded && gap < 1) os << " (at most: to the whole training work spread over every device)";
    os << "; " << detail::seconds_text(stats.seconds) << " (" << detail::seconds_text(stats.bounding_seconds)
       << " resolving and bounding)\n";
    return os.str();
}

LOOM_INLINE plan_search_result search_plan(const graph& model, const plan::plan_spec& space, const cluster& c,
                                           const plan_search_options& o) {
    const training_work work = training_work_of(model, c.device, o.price);
    plan::detail::selector_memo selectors;  // the rules' matches on the model, resolved once per selector
    selectors.remember(model);
    return detail::search_assignments(
        space, open_parameter_candidates(space, batch_of(model), space.stages ? plan::detail::layer_count(model, space.stages->repeat) : 0), c, o,
        model,
        [&](const plan::plan_spec& candidate) {
            const plan::detail::selector_memo_scope remembering(selectors);
            const plan::resolved_plan rp = plan::resolve(candidate, model);
            const memory_floor least = memory_lower_bound(rp, model, o.price, &work);
            return detail::assignment_bounds{
                step_lower_bound(rp, work, o.price, &model, &c) + after_programs_lower_bound(least, c, o.price),
                least.peak() + o.price.runtime_bytes};
        },
        [&](const plan::plan_spec& candidate, const std::atomic<bool>&) {
            return price_programs(partition::apply_plan(model, candidate), c, o.price);
        },
        {}, {any_plan_lower_bound(work, space.devices, o.price), any_plan_memory_floor(model, space.devices, o.price)});
}

LOOM_INLINE plan_search_result search_plan(const model_family& model, const plan::plan_spec& space, const cluster& c,
                                           const plan_search_options& o) {
    detail::folded_bounds bounds(model, c, o.price);
    if (!model.forward) throw usage_error("search_plan: the model family needs a forward(layers, batch) builder");
    const graph whole = model.forward(model.layers, model.batch);  // its ops as they are, for the stage-group checks
    return detail::search_assignments(
        space, open_parameter_candidates(space, model.batch, model.layers), c, o, whole,
        [&](const plan::plan_spec& candidate) { return bounds(candidate); },
        [&](const plan::plan_spec& candidate, const std::atomic<bool>& cancel) {
            price_options po = o.price;
            po.cancel = &cancel;
            return price_folded(model, candidate, c, po).price;
        },
        [&](const plan::plan_spec& candidate) {
            double pieces = 0;
            for (const instance_pieces& at : folded_instance_pieces(model, candidate, c))
                pieces += static_cast<double>(at.largest) * static_cast<double>(at.instances);
            // The interlaced pipeline's instances are ordered by a list scheduler and cost
            // more per piece: 32 to 35 us against 13 to 14 under 1F1B and 20 under GPipe
            // (a 96-layer GPT on 1024 GPUs). Counted at par, two of its prices took 7 of a 30 s
            // budget's 12 for pricing, and its plans, whose bounds are the loosest, lost.
            return shape_of(candidate, model).interlaced ? 2.5 * pieces : pieces;
        },
        {any_plan_lower_bound(training_work_of(whole, c.device, o.price), space.devices, o.price),
         any_plan_memory_floor(whole, space.devices, o.price)});
}

}  // namespace loom::search

namespace loom::search::detail {

LOOM_INLINE const folded_bounds::instance& folded_bounds::instance_of(std::int64_t layers, std::int64_t batch) {
    auto it = instances_.find({layers, batch});
    if (it == instances_.end()) {
        graph g = model_.forward(layers, batch);
        training_work work = training_work_of(g, cluster_.device, options_);
        it = instances_.emplace(std::pair{layers, batch}, instance{std::move(g), std::move(work)}).first;
        selectors_.remember(it->second.g);
    }
    return it->second;
}

LOOM_INLINE assignment_bounds folded_bounds::operator()(const plan::plan_spec& candidate) {
    const plan::detail::selector_memo_scope remembering(selectors_);
    // The bound of each instance's plan (its devices compute what the real ones do),
    // extrapolated over the layers per stage, the micro-batches and the stages as the price is.
    // A plan whose price would refuse it for the size of its instances is refused here.
    check_instance_pieces(model_, candidate, cluster_, options_,
                          [this](std::int64_t layers, std::int64_t batch) -> const graph& { return instance_of(layers, batch).g; });
    const fold_shape s = shape_of(candidate, model_);
    const std::vector<std::int64_t> layers = instance_layers(model_, s);
    std::vector<std::int64_t> stage_counts = instance_stages(s, candidate.devices, cluster_.topo);
    if (stage_counts.size() != 2) stage_counts = {s.stages};
    const std::int64_t replicas = fold_replicas(s, model_, candidate) ? 2 : s.replicas;
    const std::int64_t samples = micro_batch_samples(model_, s);
    auto along = [](const std::vector<double>& v, const std::vector<std::int64_t>& at, std::int64_t real) {
        return v.size() == 1 ? v.front() : v[0] + (v[1] - v[0]) * line_position(at, real);
    };
    // Per stage count: the whole bound and its busiest-device term, each extrapolated: both
    // are convex in the micro-batches, the layers and the stages (each term is linear in
    // them, or falls as 1/S), so the line through two instances stays below them beyond.
    // The busiest device's term is linear, so its line is exact, where the order's bound,
    // looser at the larger instance, can bend the whole bound's line down.
    std::vector<double> step_by_stages, memory_by_stages, summing_by_stages, after_by_stages;
    for (std::int64_t stages : stage_counts) {
        const fold_shape at = stages == s.stages ? s : with_stages(s, stages);
        const std::vector<std::int64_t> micro_batches = instance_micro_batches(at);
        std::vector<double> by_micro_batches, busiest_by_micro_batches, memory_by_layers, summing_by_layers, after_by_layers;
        std::vector<const std::optional<pipeline_blocks>*> blocks_by_layers;  // of the fewer micro-batches
        for (std::int64_t mb : micro_batches) {
            std::vector<double> by_layers, busiest_by_layers;
            for (std::int64_t k : layers) {
                plan::plan_spec p = instance_plan(candidate, at, replicas, mb, k);
                instance_key key{instance_depth(at, k), samples * replicas * mb, p.devices, {}, std::move(p.choices)};
                if (p.stages) key.boundaries = p.stages->boundaries;
                const bool memory = mb == micro_batches.front();
                auto known = bounds_.find(key);
                if (known == bounds_.end() || (memory && !known->second.memory)) {
                    p.choices = key.choices;
                    const instance& i = instance_of(key.layers, key.batch);
                    const plan::resolved_plan rp = plan::resolve(p, i.g);
                    instance_bounds b;
                    b.step = step_lower_bound(rp, i.work, options_, &i.g, &cluster_, &b.parts);
                    if (memory) b.memory = memory_lower_bound(rp, i.g, options_, &i.work);
                    b.zero = rp.zero;
                    known = bounds_.insert_or_assign(std::move(key), std::move(b)).first;
                }
                by_layers.push_back(known->second.step);
                busiest_by_layers.push_back(known->second.parts.busiest);
                if (mb == micro_batches.front()) blocks_by_layers.push_back(&known->second.parts.blocks);
                if (!memory) continue;
                // The memory floor, the instance's shards cut over the real replicas. Each
                // device's floor grows linearly with the layers per stage, so their maximum is
                // convex in them: the line through two instances stays below it beyond. The
                // activations in flight are those of the fewer micro-batches: no more than the
                // real plan's.
                // The step after the programs likewise: the optimizer's elements grow linearly
                // with the layers, ZeRO's shards cut over the real replicas.
                memory_floor least = *known->second.memory;
                const double to_real = static_cast<double>(replicas) / static_cast<double>(s.replicas);
                for (double& b : least.sharded) b *= to_real;
                if (known->second.zero != plan::zero_stage::none)
                    for (double& n : least.updated) n *= to_real;
                memory_by_layers.push_back(least.peak_without_partial_sums());
                summing_by_layers.push_back(least.peak());
                after_by_layers.push_back(after_programs_lower_bound(least, cluster_, options_));
            }
            by_micro_batches.push_back(along(by_layers, layers, fold_layers_per_stage(s)));
            busiest_by_micro_batches.push_back(along(busiest_by_layers, layers, fold_layers_per_stage(s)));
        }
        double step = std::max(along(by_micro_batches, micro_batches, s.micro_batches),
                               along(busiest_by_micro_batches, micro_batches, s.micro_batches));
        if (stage_counts.size() == 1) step = std::max(step, real_order_bound(candidate, s, layers, blocks_by_layers));
        step_by_stages.push_back(step);
        memory_by_stages.push_back(along(memory_by_layers, layers, fold_layers_per_stage(s)));
        summing_by_stages.push_back(along(summing_by_layers, layers, fold_layers_per_stage(s)));
        after_by_stages.push_back(along(after_by_layers, layers, fold_layers_per_stage(s)));
    }
    // The memory at the moments that hold gradient partial sums too: the instance of the most
    // stages. A deeper pipeline holds no less (the same layers per stage, as many micro-batches
    // in flight or more), but not linearly more: the micro-batches in flight stop growing
    // with the stages where the order holds all of them (4 and 8 stages of an interleaved
    // order at 2 layers each floored at 19.8 and 25.3 MB, 16 at 26.0 MB, not the line's 36.4).
    return {along(step_by_stages, stage_counts, s.stages) + along(after_by_stages, stage_counts, s.stages),
            std::max(along(memory_by_stages, stage_counts, s.stages), summing_by_stages.back()) + options_.runtime_bytes};
}

LOOM_INLINE double folded_bounds::real_order_bound(const plan::plan_spec& candidate, const fold_shape& s,
                                                   const std::vector<std::int64_t>& layers,
                                                   const std::vector<const std::optional<pipeline_blocks>*>& blocks) {
    if (blocks.empty() || blocks.size() != layers.size()) return 0.0;
    for (const auto* b : blocks)
        if (!*b) return 0.0;
    std::optional<pipeline_blocks> real = **blocks.front();
    if (blocks.size() == 2) real = extrapolate_blocks(**blocks[0], **blocks[1], line_position(layers, fold_layers_per_stage(s)));
    if (!real) return 0.0;
    try {
        // A template's order is valid by construction (the real plan's resolve validates its
        // own); one ordered by the user's constraints is not played unvalidated.
        const std::optional<plan::order_policy> order = plan::detail::chosen_order(candidate);
        if (!order || order->kind == plan::schedule_kind::from_constraints) return 0.0;
        const std::optional<schedule::schedule> grouped = pipeline_groups(plan::detail::built_pipeline_order(
            *order, static_cast<int>(s.stages), static_cast<int>(s.micro_batches), 1));
        if (!grouped || grouped->shape.stages != real->shape.stages || grouped->shape.rounds != real->shape.rounds ||
            grouped->shape.stage_devices != real->shape.stage_devices)
            return 0.0;
        const std::optional<schedule::simulation> played = play_blocks(*grouped, *real);
        return played ? played->makespan : 0.0;
    } catch (const plan_error&) {
        return 0.0;
    }
}

LOOM_INLINE void concrete_boundaries(plan::plan_spec& p, const std::vector<open_parameter>& params) {
    for (const open_parameter& param : params) {
        if (param.what != open_parameter::kind::boundaries || !p.stages) continue;
        const std::vector<std::int64_t> starts =
            plan::detail::stage_starts(*p.stages, p.choices, param.layers, static_cast<int>(boundary_ranges(p)));
        p.stages->boundaries.assign(starts.begin() + 1, starts.end());
        p.stages->boundaries_open.clear();
        p.stages->boundary_slack = -1;
        p.choices.erase(param.name);
    }
}

LOOM_INLINE plan_search_result search_assignments(const plan::plan_spec& space, std::vector<open_parameter> parameters,
                                                  const cluster& c, const plan_search_options& o, const graph& structure,
                                                  const bound_function& bound_of, const price_function& price_of,
                                                  const price_cost_function& cost_of, any_plan_floors floors) {
    const auto started = std::chrono::steady_clock::now();
    auto elapsed = [&] { return std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count(); };
    if (space.devices > c.devices())
        throw search_error("search_plan: the plan is for " + std::to_string(space.devices) + " devices but cluster '" +
                           c.name + "' has " + std::to_string(c.devices()) +
                           "; give a plan for at most that many devices or a larger cluster");
    using choice_map = std::map<std::string, std::int64_t>;
    plan_search_result result;
    result.parameters = std::move(parameters);
    result.memory_limit = o.memory_limit > 0 ? o.memory_limit : c.device.memory_bytes;
    if (floors.memory > result.memory_limit)
        throw search_error("search_plan: no plan in the space fits: the model's weights, gradients and optimizer state "
                           "alone, each element held once over all " + std::to_string(space.devices) +
                           " devices (ZeRO-3 over every one), with the runtime's " + detail::gib_text(o.price.runtime_bytes) +
                           ", need " + detail::gib_text(floors.memory) + " per device, more than the limit of " +
                           detail::gib_text(result.memory_limit) +
                           "; add devices, or raise the memory limit, or store the optimizer state in fewer bytes");
    const auto& params = result.parameters;
    plan_search_statistics& stats = result.stats;

    // 1-3: every assignment, resolved and bounded.
    struct leaf {
        std::map<std::string, std::int64_t> choices;
        double bound = 0;
        double memory = 0;  // floor
        std::int64_t index = 0;
    };
    std::vector<leaf> leaves;
    std::map<std::string, std::string> refusal_example;  // reason -> an assignment refused for it
    auto refuse = [&](const std::string& why, const std::map<std::string, std::int64_t>& choices) {
        ++stats.refused;
        if (++stats.refusals[why] == 1) refusal_example[why] = choices_text(params, choices);
    };
    // Partial assignments: a refusal holds for every assignment that agrees with it on the
    // choices its check read (plan::detail::choice_log), so the odometer skips the rest of
    // the subtree those choices root. Each assignment is first checked over one stage group
    // (plan::detail::check_stage_group: the rules' degrees, colocations and recompute
    // choices, the stage count and devices per stage), whose verdict is kept per value of
    // those structural choices; then resolved and bounded.
    const std::size_t n = params.size();
    auto index_of = [&](const std::string& name) -> std::optional<std::size_t> {
        for (std::size_t i = 0; i < n; ++i)
            if (params[i].name == name) return i;
        return std::nullopt;
    };
    std::vector<std::size_t> structural;
    for (std::size_t i = 0; i < n; ++i)
        if (params[i].what == open_parameter::kind::degree || params[i].what == open_parameter::kind::recompute ||
            params[i].what == open_parameter::kind::stages)
            structural.push_back(i);
    struct verdict {
        std::string refusal;  // empty: passed
        std::size_t settled = 0;  // the refusal holds for every assignment agreeing on params [0, settled)
    };
    std::map<std::vector<std::int64_t>, verdict> group_verdicts;
    // The parameters a refusal's check read: their prefix decides it.
    auto settled_by = [&](const plan::detail::choice_log& log) {
        std::size_t settled = 0;
        for (const std::string& name : log.names)
            if (const auto i = index_of(name)) settled = std::max(settled, *i + 1);
        return settled;
    };
    plan::plan_spec candidate = space;
    // The assignments below level i with the choices made above it (the boundaries' cuts
    // depend on the stage count and order chosen).
    std::function<std::int64_t(std::size_t)> leaves_under = [&](std::size_t i) -> std::int64_t {
        if (i == n) return 1;
        const std::vector<std::int64_t> values = candidates_given(params[i], candidate);
        bool decides_later = false;
        if (params[i].what == open_parameter::kind::stages || params[i].what == open_parameter::kind::order)
            for (std::size_t j = i + 1; j < n; ++j) decides_later = decides_later || params[j].what == open_parameter::kind::boundaries;
        if (!decides_later) return static_cast<std::int64_t>(values.size()) * leaves_under(i + 1);
        std::int64_t total = 0;
        for (std::int64_t v : values) {
            candidate.choices[params[i].name] = v;
            total += leaves_under(i + 1);
        }
        return total;
    };
    // The skipped assignments: refused for `skip_reason`.
    std::string skip_reason;
    auto skip = [&](std::int64_t count) {
        stats.assignments += count;
        stats.skipped += count;
        stats.refused += count;
        stats.refusals[skip_reason] += count;
    };
    // A budget spent before every assignment is bounded leaves the rest unbounded (counted,
    // not resolved), once one has a bound: the search then prices the best-bounded of those
    // it has. A count budget (max_bounded) stops it likewise. An enumeration that, at its
    // pace after 5% of the time budget, would not end within the budget pauses then: a
    // descent (3b) gets the time, and the enumeration resumes where the descent leaves some,
    // until `resumed_until` instead of by its pace. One that would end runs on, to prove its
    // answer.
    const bool budgeted = o.time_budget_seconds > 0;
    double space_size = 0;
    double resumed_until = 0;
    auto enumeration_spent = [&] {
        if (leaves.empty()) return false;
        if (o.max_bounded > 0 && static_cast<std::int64_t>(leaves.size()) >= o.max_bounded) return true;
        if (!budgeted) return false;
        const double t = elapsed();
        if (resumed_until > 0) return t > resumed_until;
        if (t > o.time_budget_seconds) return true;
        const double done = static_cast<double>(stats.assignments) / std::max(space_size, 1.0);
        return t > o.time_budget_seconds / 20 && t / std::max(done, 1e-12) > o.time_budget_seconds;
    };
    // The assignments the descent (3b) bounded, and those it made leaves: a resumed
    // enumeration takes their bounds instead of bounding them again.
    std::map<choice_map, std::optional<assignment_bounds>> known;  // none: refused
    std::set<choice_map> kept;
    // The verdict of the stage-group check on `candidate`'s structural choices, kept per
    // value of them (in `fresh` when the check read other choices too).
    verdict fresh;
    auto stage_group = [&]() -> const verdict& {
        std::vector<std::int64_t> key;
        for (std::size_t i : structural) key.push_back(candidate.choices.at(params[i].name));
        if (const auto known = group_verdicts.find(key); known != group_verdicts.end()) return known->second;
        fresh = {};
        plan::detail::choice_log log;
        try {
            const plan::detail::choice_log_scope logging(log);
            plan::detail::check_stage_group(candidate, structure);
        } catch (const plan_error& e) {
            fresh.refusal = e.what();
        } catch (const shape_error& e) {
            fresh.refusal = e.what();
        }
        fresh.settled = fresh.refusal.empty() ? n : settled_by(log);
        // Kept only when the check read nothing but structural choices (the key).
        bool keyed = true;
        for (const std::string& name : log.names)
            if (const auto i = index_of(name))
                keyed = keyed && std::find(structural.begin(), structural.end(), *i) != structural.end();
        return keyed ? group_verdicts.emplace(std::move(key), fresh).first->second : fresh;
    };
    // One assignment: n, or the prefix length after which every assignment is skipped.
    auto visit = [&]() -> std::size_t {
        ++stats.assignments;
        if (kept.count(candidate.choices)) {  // a leaf already, which the descent took from the unbounded
            ++stats.unbounded;
            return n;
        }
        if (const auto it = known.find(candidate.choices); it != known.end() && it->second) {
            leaves.push_back({candidate.choices, it->second->step, it->second->memory, stats.assignments - 1});
            return n;
        }
        const verdict* group = &stage_group();
        if (!group->refusal.empty()) {
            refuse(group->refusal, candidate.choices);
            skip_reason = group->refusal;
            return group->settled;
        }
        for (const open_parameter& p : params)
            if (even_cut_only(p, candidate)) ++stats.even_cut_only;
        plan::detail::choice_log log;
        std::string refusal;
        try {
            const plan::detail::choice_log_scope logging(log);
            const assignment_bounds b = bound_of(candidate);
            leaves.push_back({candidate.choices, b.step, b.memory, stats.assignments - 1});
            return n;
        } catch (const plan_error& e) {
            refusal = e.what();
        } catch (const shape_error& e) {
            refusal = e.what();
        }
        refuse(refusal, candidate.choices);
        skip_reason = refusal;
        return settled_by(log);
    };
    // The odometer, the last parameter turning fastest: per parameter its candidates under
    // the choices above it and the one turned to. A visit that settles a prefix skips the
    // rest of the subtree it roots. A spent budget pauses it before an assignment, the rest
    // counted unbounded (`paused` of them) until it resumes.
    struct dial {
        std::vector<std::int64_t> values;
        std::size_t at = 0;
    };
    std::vector<dial> dials(n);
    std::size_t depth = 0;  // dials [0, depth) are turned to their values
    bool ended = false;
    std::int64_t paused = 0;
    // Past dial i's value: the nearest dial from i up with a value left turns to it (those
    // below it turn to their first values next); none left ends the odometer.
    auto turn_from = [&](std::size_t i) {
        for (;;) {
            dial& d = dials[i];
            if (++d.at < d.values.size()) {
                candidate.choices[params[i].name] = d.values[d.at];
                depth = i + 1;
                return;
            }
            if (i == 0) {
                ended = true;
                return;
            }
            --i;
        }
    };
    auto run_odometer = [&] {
        // Resumed: the assignment at the dials (the descent turned `candidate` elsewhere).
        if (paused > 0)
            for (std::size_t i = 0; i < depth; ++i) candidate.choices[params[i].name] = dials[i].values[dials[i].at];
        stats.assignments -= paused;
        stats.unbounded -= paused;
        stats.skipped -= paused;
        paused = 0;
        while (!ended) {
            // Turn the dials below `depth` to their first values.
            for (; depth < n; ++depth) {
                dials[depth] = {candidates_given(params[depth], candidate), 0};
                if (dials[depth].values.empty()) break;
                candidate.choices[params[depth].name] = dials[depth].values.front();
            }
            if (depth < n) {  // a parameter without candidates here: nothing under the dials above
                if (depth == 0) ended = true;
                else turn_from(depth - 1);
                continue;
            }
            if (enumeration_spent()) {
                paused = static_cast<std::int64_t>(space_size) - stats.assignments;
                stats.assignments += paused;
                stats.unbounded += paused;
                stats.skipped += paused;
                return;
            }
            const std::size_t settled = visit();
            if (settled >= n) {
                turn_from(n - 1);
                continue;
            }
            // Every assignment agreeing on [0, settled) is settled: the rest of each dial's
            // values from the last up to `settled` are skipped, and the dial above turns.
            for (std::size_t i = n; i-- > settled;) {
                dial& d = dials[i];
                std::int64_t rest = 0;
                for (std::size_t r = d.at + 1; r < d.values.size(); ++r) {
                    candidate.choices[params[i].name] = d.values[r];
                    rest += leaves_under(i + 1);
                }
                skip(rest);
            }
            if (settled == 0) ended = true;
            else turn_from(settled - 1);
        }
    };
    candidate = space;
    space_size = static_cast<double>(leaves_under(0));
    run_odometer();

    // 3b. An enumeration cut short by a budget has bounded only the first corner of the
    // odometer (its first recompute, degree and stage-count values), which on a large model
    // holds nothing that fits. From the best assignments it bounded, a descent moves one
    // parameter at a time, or exchanges a factor between two degrees or stage counts (the
    // devices used the same), or, where neither improves, moves a degree or stage count
    // together with any other parameter (see `pairs`), to the values with the best bounds:
    // a memory floor within the limit first, then a step bound at least `descent_step` lower (a bound that more
    // micro-batches lower by a hair would lead it to hundreds of them, which price slowly
    // and run no faster). It stops where no move improves, or at 60% of the time budget
    // (the rest is the prices': at 1024 GPUs one takes 5 to 7 s on one core, and two of
    // other orders run side by side); under a time budget it then starts again from the
    // next best, while the time lasts.
    // The assignments it moves to join the leaves priced best first below (those it only
    // looked at stay counted unbounded); the answer stays unproven (a gap to the floor).
    if (stats.unbounded > 0 && !leaves.empty()) {
        constexpr double descent_step = 0.01;
        const double descent_end = o.time_budget_seconds * 0.6;
        double deadline = descent_end;  // of the descent under way
        auto out_of_time = [&] { return budgeted && elapsed() > deadline; };
        struct point {
            choice_map choices;
            assignment_bounds bounds;
        };
        const auto fits = [&](const assignment_bounds& b) { return b.memory <= result.memory_limit; };
        // a ahead of b: fitting first, then a step bound lower by more than `margin`, or
        // among those that do not fit, a lower memory floor.
        const auto ahead = [&](const assignment_bounds& a, const assignment_bounds& b, double margin) {
            if (fits(a) != fits(b)) return fits(a);
            return fits(a) ? a.step < b.step * (1 - margin) : a.memory < b.memory;
        };
        for (const leaf& l : leaves) {
            kept.insert(l.choices);
            known.emplace(l.choices, assignment_bounds{l.bound, l.memory});
        }
        auto evaluate = [&](const choice_map& choices) -> std::optional<assignment_bounds> {
            if (const auto it = known.find(choices); it != known.end()) return it->second;
            std::optional<assignment_bounds> b;
            candidate.choices = choices;
            if (stage_group().refusal.empty()) {
                try {
                    ++stats.looked_at;
                    b = bound_of(candidate);
                } catch (const plan_error&) {
                } catch (const shape_error&) {
                }
            }
            known.emplace(choices, b);
            return b;
        };
        // `choices` with parameter i at v; a new stage count or order takes the even cut of
        // the layers (the cut's number means another cut under them).
        auto moved = [&](choice_map choices, std::size_t i, std::int64_t v) {
            choices[params[i].name] = v;
            if (params[i].what != open_parameter::kind::stages && params[i].what != open_parameter::kind::order)
                return choices;
            for (const open_parameter& p : params) {
                if (p.what != open_parameter::kind::boundaries) continue;
                candidate.choices = choices;
                const std::int64_t ranges = boundary_ranges(candidate);
                choices[p.name] = 0;  // where the layers make no such cut, plan::resolve refuses it
                if (ranges < 1) continue;
                try {
                    choices[p.name] = even_cut(p, ranges);
                } catch (const plan_error&) {
                }
            }
            return choices;
        };
        // Parameter i's values under `choices`: every one, or 64 spread over the cuts of
        // open boundaries.
        auto values_of = [&](std::size_t i, const choice_map& choices) {
            candidate.choices = choices;
            std::vector<std::int64_t> all = candidates_given(params[i], candidate);
            constexpr std::size_t most = 64;
            if (all.size() <= most) return all;
            std::vector<std::int64_t> some;
            for (std::size_t k = 0; k < most; ++k) some.push_back(all[k * all.size() / most]);
            return some;
        };
        // Pairs of a degree or stage count and any other parameter: a degree alone may not
        // fill the devices, and one alone may not relieve memory (more replicas without
        // ZeRO's shards).
        std::vector<std::pair<std::size_t, std::size_t>> pairs;
        const auto degree_or_stages = [&](std::size_t i) {
            return params[i].what == open_parameter::kind::degree || params[i].what == open_parameter::kind::stages;
        };
        std::vector<std::pair<std::size_t, std::size_t>> exchanges;
        for (std::size_t i = 0; i < n; ++i)
            for (std::size_t j = i + 1; j < n; ++j) {
                if (degree_or_stages(i) || degree_or_stages(j)) pairs.push_back({i, j});
                if (degree_or_stages(i) && degree_or_stages(j)) exchanges.push_back({i, j});
            }
        // An assignment the descent bounded joins the leaves priced below.
        auto join = [&](const choice_map& choices, const assignment_bounds& b) {
            if (!kept.insert(choices).second) return;
            leaves.push_back({choices, b.step, b.memory, stats.assignments + stats.descended});
            ++stats.descended;
            --stats.unbounded;
        };
        // `keep_order`: moves leave the orders as they are (a descent from the best of each
        // order, which would otherwise move to the order of the loosest bound).
        const auto is_order = [&](std::size_t i) { return params[i].what == open_parameter::kind::order; };
        auto descend_from = [&](point here, bool keep_order) {
            const auto frozen = [&](std::size_t i) { return keep_order && is_order(i); };
            for (bool improved = true; improved && !out_of_time();) {
                improved = false;
                auto consider = [&](const choice_map& next) {
                    if (out_of_time()) return;
                    const std::optional<assignment_bounds> b = evaluate(next);
                    if (!b || !ahead(*b, here.bounds, descent_step)) return;
                    here = {next, *b};
                    improved = true;
                    join(next, *b);
                };
                // An exchange that makes more replicas than the batch splits into at these
                // micro-batches is refused; it stands with the most micro-batches that do
                // split (DP 16 x PP 16 at 64 micro-batches to DP 32 x PP 8 at 32: each
                // micro-batch the same size).
                auto consider_exchange = [&](const choice_map& next) {
                    if (out_of_time()) return;
                    if (evaluate(next)) return consider(next);
                    for (std::size_t m = 0; m < n; ++m) {
                        if (params[m].what != open_parameter::kind::micro_batches) continue;
                        std::vector<std::int64_t> fewer = values_of(m, next);
                        std::sort(fewer.rbegin(), fewer.rend());
                        for (std::int64_t w : fewer) {
                            if (w >= next.at(params[m].name)) continue;
                            if (const choice_map repaired = moved(next, m, w); evaluate(repaired)) return consider(repaired);
                        }
                    }
                };
                for (std::size_t i = 0; i < n; ++i) {
                    if (frozen(i)) continue;
                    const choice_map from = here.choices;
                    for (std::int64_t v : values_of(i, from))
                        if (v != from.at(params[i].name)) consider(moved(from, i, v));
                }
                // Exchanges: one degree or stage count divided by f, another multiplied by f,
                // the devices they use the same (tensor for data parallelism, stages for
                // either). A single move from a plan that fills the devices leaves some idle
                // or needs more than there are, so without these the descent stays with
                // whichever degree it filled the devices with first.
                for (const auto& [i, j] : exchanges) {
                    const choice_map from = here.choices;
                    const std::int64_t a = from.at(params[i].name), b = from.at(params[j].name);
                    const std::vector<std::int64_t> as = values_of(i, from), bs = values_of(j, from);
                    for (std::int64_t u : as) {
                        if (u == a || u <= 0 || a <= 0) continue;
                        // i from a to u, j from b to b * a / u, where that is a whole candidate
                        if ((b * a) % u != 0) continue;
                        const std::int64_t v = b * a / u;
                        if (std::find(bs.begin(), bs.end(), v) == bs.end()) continue;
                        consider_exchange(moved(moved(from, i, u), j, v));
                    }
                }
                // Pairs only where no exchange or single move improves: a round of pairs
                // bounds thousands of assignments (at 1024 devices, minutes), a round of the
                // others a hundred or two.
                if (improved) continue;
                for (const auto& [i, j] : pairs) {
                    if (frozen(i) || frozen(j)) continue;
                    const choice_map from = here.choices;
                    for (std::int64_t u : values_of(i, from)) {
                        const choice_map first = moved(from, i, u);
                        for (std::int64_t v : values_of(j, first))
                            if (u != from.at(params[i].name) || v != from.at(params[j].name)) consider(moved(first, j, v));
                    }
                }
            }
            return here;
        };
        std::vector<point> starts;
        for (const leaf& l : leaves) starts.push_back({l.choices, {l.bound, l.memory}});
        std::stable_sort(starts.begin(), starts.end(),
                         [&](const point& a, const point& b) { return ahead(a.bounds, b.bounds, 0.0); });
        // From the best of each order (each_order_first), keeping its order, then from the
        // best, at least three in all, and under a time budget from the next ones while it
        // lasts.
        // The enumeration's first corner may hold one order only: the best start moved to
        // each other order stands for that order.
        if (!starts.empty())
            for (std::size_t i = 0; i < n; ++i) {
                if (!is_order(i)) continue;
                const choice_map from = starts.front().choices;
                for (std::int64_t v : values_of(i, from)) {
                    if (v == from.at(params[i].name)) continue;
                    const choice_map there = moved(from, i, v);
                    if (const std::optional<assignment_bounds> b = evaluate(there)) {
                        starts.push_back({there, *b});
                        join(there, *b);
                    }
                }
            }
        const std::size_t heads = each_order_first(starts, params, [](const point& p) -> const choice_map& { return p.choices; },
                                                   [&](const point&) { return true; });
        // The other orders start where the first order's descent ended, each moved to its
        // order, where that bounds better than its own start: their starts are the first's,
        // moved, so their descents would retrace its path. Under a time budget the first
        // descent has half of the descent's time and each other order an equal share of the
        // rest (what one leaves, the next takes): at 1024 GPUs one descent moves for a minute
        // and more, and the first, taking all of it, left the other orders to be priced from
        // their corner, or not at all.
        for (std::size_t k = 0; k < starts.size() && (k < std::max<std::size_t>(3, heads) || budgeted); ++k) {
            deadline = k == 0 && heads > 1 ? elapsed() + (descent_end - elapsed()) / 2
                       : k < heads          ? elapsed() + (descent_end - elapsed()) / static_cast<double>(heads - k)
                                            : descent_end;
            if (k > 0 && out_of_time()) break;
            const point reached = descend_from(starts[k], k < heads);
            if (k != 0 || heads < 2) continue;
            for (std::size_t h = 1; h < heads; ++h) {
                choice_map there = reached.choices;
                for (std::size_t i = 0; i < n; ++i)
                    if (is_order(i)) there = moved(there, i, starts[h].choices.at(params[i].name));
                if (const std::optional<assignment_bounds> b = evaluate(there); b && ahead(*b, starts[h].bounds, 0.0)) {
                    join(there, *b);
                    starts[h] = {there, *b};
                }
            }
        }
        // Every start descended with time to spare (a small space whose bounds are slow: an
        // AlphaFold2 of 621 assignments, bounded at a second each, stopped at 6 s of 20 with
        // nothing that fits): the enumeration resumes where it paused, until the descent's
        // end. One that ends bounds every assignment, and the search proves its answer.
        if (budgeted && o.max_bounded == 0 && paused > 0 && elapsed() < descent_end) {
            resumed_until = descent_end;
            run_odometer();
        }
    }
    std::stable_sort(leaves.begin(), leaves.end(), [](const leaf& a, const leaf& b) { return a.bound < b.bound; });
    // Under a budget that left assignments unbounded, the best-bounded leaf of each order
    // is priced first (these `head` leaves, in bound order), then the rest by bound (see
    // each_order_first).
    std::size_t head =
        stats.unbounded > 0
            ? each_order_first(leaves, params, [&](const leaf& l) -> const choice_map& { return l.choices; },
                               [&](const leaf& l) { return l.memory <= result.memory_limit; })
            : 0;
    // Under a budget that left assignments unbounded, the answer is unproven either way and
    // the budget may allow few prices, while one price at 1024 GPUs takes 0.6 s (2 stages)
    // to 24 s (8 interleaved stages of 64 micro-batches): a 5 s budget whose first price
    // went to the latter answered after 13.8 s. Bounds within 10% of one another say little
    // of which plan is faster (a bound lies 20 to 30% below its price there), so the first
    // leaves (the head and the next, 64 in all) are taken in bands of 10% of bound, and
    // within a band the cheapest to price first. The reordered leaves all count as the head
    // (not in bound order: none of them stops the loop below by its bound).
    if (stats.unbounded > 0 && cost_of && !leaves.empty()) {
        const std::size_t first = std::min<std::size_t>(leaves.size(), std::max<std::size_t>(head, 64));
        double least = 0;
        for (std::size_t k = 0; k < first; ++k)
            if (leaves[k].memory <= result.memory_limit && leaves[k].bound > 0)
                least = least > 0 ? std::min(least, leaves[k].bound) : leaves[k].bound;
        if (least > 0) {
            struct ranked {
                std::int64_t band = 0;
                double cost = 0;
                leaf l;
            };
            std::vector<ranked> ranks;
            for (std::size_t k = 0; k < first; ++k) {
                ranked r{0, std::numeric_limits<double>::infinity(), std::move(leaves[k])};
                r.band = r.l.bound > least ? static_cast<std::int64_t>(std::floor(std::log(r.l.bound / least) / std::log(1.1))) : 0;
                if (r.l.memory <= result.memory_limit) {
                    plan::plan_spec candidate = space;
                    candidate.choices = r.l.choices;
                    try {
                        r.cost = cost_of(candidate);
                    } catch (const plan_error&) {  // its price refuses it: priced (refused) last in its band
                    } catch (const shape_error&) {
                    }
                }
                ranks.push_back(std::move(r));
            }
            std::stable_sort(ranks.begin(), ranks.end(), [](const ranked& x, const ranked& y) {
                return x.band != y.band ? x.band < y.band : x.cost < y.cost;
            });
            for (std::size_t k = 0; k < first; ++k) leaves[k] = std::move(ranks[k].l);
            head = first;
        }
    }
    stats.bounding_seconds = elapsed();

    // 4: best first.
    std::optional<priced_assignment> best, second;
    // The least memory among those over the limit: priced (on a device), or a floor.
    struct over_limit {
        std::map<std::string, std::int64_t> choices;
        double bytes = 0;
        int device = -1;  // -1: the floor of an assignment not priced
    };
    std::optional<over_limit> smallest_over;
    auto over = [&](const std::map<std::string, std::int64_t>& choices, double bytes, int device) {
        ++stats.over_memory;
        if (!smallest_over || bytes < smallest_over->bytes) smallest_over = over_limit{choices, bytes, device};
    };
    // Prices are computed on several threads, ahead of their turn: the leaves the loop below
    // would price next if no price changed the runner-up, `width` of them in flight. They
    // are taken in order, each only if its turn comes, so the search is the serial one; a
    // price computed past the point where the search stops is dropped, not counted.
    struct priced_ahead {
        program_price price;
        std::string refusal;         // a plan_error or shape_error: refused, for this reason
        bool cancelled = false;      // stopped by `cancel`: the budget had passed
        std::exception_ptr failure;  // anything else: rethrown in its turn
    };
    // Set once the search will drop every price still running: past the time budget with a
    // plan in hand, or stopped. Folded prices then end at their next instance instead of
    // holding the answer back (at 1024 devices one price takes a minute and more).
    std::atomic<bool> cancel{false};
    const std::size_t width = o.threads > 0 ? static_cast<std::size_t>(o.threads)
                                                    : std::max(1u, std::thread::hardware_concurrency());
    auto price_leaf = [&space, &leaves, &price_of, &cancel](std::size_t k) {
        priced_ahead out;
        plan::plan_spec candidate = space;
        candidate.choices = leaves[k].choices;
        try {
            out.price = price_of(candidate, cancel);
        } catch (const price_cancelled&) {
            out.cancelled = true;
        } catch (const plan_error& e) {
            out.refusal = e.what();
        } catch (const shape_error& e) {
            out.refusal = e.what();
        } catch (...) {
            out.failure = std::current_exception();
        }
        return out;
    };
    std::map<std::size_t, std::future<priced_ahead>> in_flight;
    // However the loop below ends (an answer, the budget, an exception), the prices still in
    // flight are dropped: cancel them before their futures wait for them (this guard is
    // destroyed first).
    struct cancel_on_exit {
        std::atomic<bool>& flag;
        ~cancel_on_exit() { flag = true; }
    } cancel_rest{cancel};
    // Under a budget that leaves the space unbounded (the answer unproven either way), a leaf
    // whose memory floor times the least ratio of a priced plan's peak memory to its floor,
    // among the plans priced so far of its order and recompute choices, exceeds the limit is
    // passed over, unpriced (counted left by the budget): at 1024 GPUs five of the seven
    // prices of a 60 s budget went to plans whose floors fit in 80 GiB (84.4 GB) and whose
    // programs did not (100 to 114 GB). How far the floor lies below the programs depends on
    // the order (the activations in flight) and recomputation: 1.09 times the floor for
    // 1F1B without recomputation there, 1.19 to 1.35 with it. A space bounded in full prices
    // every leaf in its turn, as the proof needs.
    std::vector<std::size_t> memory_class_params;
    for (std::size_t i = 0; i < params.size(); ++i)
        if (params[i].what == open_parameter::kind::order || params[i].what == open_parameter::kind::recompute)
            memory_class_params.push_back(i);
    const auto memory_class = [&](const leaf& l) {
        std::vector<std::int64_t> key;
        for (std::size_t i : memory_class_params) key.push_back(l.choices.at(params[i].name));
        return key;
    };
    std::map<std::vector<std::int64_t>, double> least_memory_ratio;
    std::int64_t passed_over = 0;
    double passed_over_bound = std::numeric_limits<double>::infinity();  // the least bound among them
    const auto likely_over = [&](const leaf& l) {
        if (stats.unbounded == 0) return false;
        const auto ratio = least_memory_ratio.find(memory_class(l));
        return ratio != least_memory_ratio.end() && l.memory * ratio->second > result.memory_limit;
    };
    std::size_t launched = 0;  // leaves before this one were launched or passed over
    auto launch_from = [&](std::size_t first) {
        launched = std::max(launched, first);
        for (; launched < leaves.size() && in_flight.size() < width; ++launched) {
            const leaf& l = leaves[launched];
            if (second && l.bound >= second->price.step_seconds) {
                if (launched < head) continue;  // the head is not in bound order: a leaf after it may still be lower
                break;
            }
            if (o.max_priced > 0 && best && stats.priced + static_cast<std::int64_t>(in_flight.size()) >= o.max_priced) break;
            if (l.memory <= result.memory_limit && !likely_over(l))
                in_flight.emplace(launched, std::async(std::launch::async, price_leaf, launched));
        }
    };
    std::size_t next = 0;
    for (; next < leaves.size(); ++next) {
        const leaf& l = leaves[next];
        if (second && l.bound >= second->price.step_seconds) {
            if (next >= head) break;
            ++stats.pruned;  // a head leaf that cannot beat the runner-up; the rest are in bound order
            continue;
        }
        // Past the budget with a plan in hand, a price that has already finished (on
        // another thread, beside the one the search waited for) is still taken.
        const auto finished = [&] {
            const auto it = in_flight.find(next);
            return it != in_flight.end() && it->second.wait_for(std::chrono::seconds(0)) == std::future_status::ready;
        };
        if ((o.time_budget_seconds > 0 && elapsed() > o.time_budget_seconds && best && !finished()) ||
            (o.max_priced > 0 && stats.priced >= o.max_priced && best))
            break;
        if (l.memory > result.memory_limit) {  // its weights and optimizer state alone exceed the limit
            ++stats.over_memory_unpriced;
            over(l.choices, l.memory, -1);
            continue;
        }
        if (likely_over(l) && in_flight.find(next) == in_flight.end()) {
            ++passed_over;
            passed_over_bound = std::min(passed_over_bound, l.bound);
            continue;
        }
        launch_from(next);
        auto turn = in_flight.find(next);
        priced_ahead done;
        if (turn != in_flight.end()) {
            // With a plan in hand, a price still running when the budget ends is dropped.
            if (budgeted && best) {
                const double left = o.time_budget_seconds - elapsed();
                if (turn->second.wait_for(std::chrono::duration<double>(std::max(left, 0.0))) == std::future_status::timeout)
                    cancel = true;
            }
            done = turn->second.get();
            in_flight.erase(turn);
        } else {
            done = price_leaf(next);
        }
        if (done.cancelled) break;  // the budget passed (its leaf is counted unexplored below)
        if (!done.failure && done.refusal.empty() && l.memory > 0) {  // before the next launch
            const double ratio = done.price.peak_memory() / l.memory;
            auto [known, fresh] = least_memory_ratio.emplace(memory_class(l), ratio);
            if (!fresh) known->second = std::min(known->second, ratio);
        }
        launch_from(next + 1);
        if (done.failure) std::rethrow_exception(done.failure);
        if (!done.refusal.empty()) {
            refuse(done.refusal, l.choices);
            continue;
        }
        program_price price = std::move(done.price);
        ++stats.priced;
        priced_assignment pa{l.choices, l.bound, std::move(price)};
        if (pa.price.peak_memory() > result.memory_limit) {
            over(pa.choices, pa.price.peak_memory(), pa.price.peak_memory_device());
            continue;
        }
        // The runner-up is the best of the strictly slower plans: a plan that prices the
        // same as the best (ZeRO over one replica, an order of one stage) explains nothing.
        const auto same = [](double a, double b) { return std::abs(a - b) <= 1e-12 * std::max(a, b); };
        if (best && same(pa.price.step_seconds, best->price.step_seconds)) {
            ++stats.ties;
        } else if (!best || pa.price.step_seconds < best->price.step_seconds) {
            second = std::move(best);
            best = std::move(pa);
            stats.ties = 0;
        } else if (!second || pa.price.step_seconds < second->price.step_seconds) {
            second = std::move(pa);
        }
    }
    // Leaves after `next` were not priced: pruned when the bound stopped the search, else
    // left by the budget.
    const bool proven =
        stats.unbounded == 0 && (next == leaves.size() || (second && leaves[next].bound >= second->price.step_seconds));
    for (std::size_t k = next; k < leaves.size(); ++k) ++(proven ? stats.pruned : stats.unexplored);
    stats.unexplored += passed_over;
    stats.seconds = elapsed();

    if (!best) {
        const std::int64_t bounded = stats.assignments - stats.unbounded;
        std::string why = "search_plan: no plan in the space fits: ";
        if (stats.unbounded > 0)
            why = "search_plan: no plan found that fits: " + std::to_string(stats.unbounded) + " of the space's " +
                  std::to_string(stats.assignments) + " assignments were not bounded within the budget of " +
                  (o.max_bounded > 0 && !budgeted ? std::to_string(o.max_bounded) + " bounded"
                                                  : detail::seconds_text(o.time_budget_seconds)) +
                  " (raise it, or narrow the space); of the other " +
                  std::to_string(bounded) + ", ";
        if (bounded == stats.refused) {
            why += (stats.unbounded > 0 ? "every one is refused:"
                                        : "every one of its " + std::to_string(stats.assignments) + " assignments is refused:");
        } else {
            why += std::to_string(stats.refused) + " of " + std::to_string(bounded) + " assignments are refused";
            if (smallest_over)
                why += " and the other " + std::to_string(stats.over_memory) + " exceed " +
                       detail::gib_text(result.memory_limit) + " per device (the smallest, " +
                       choices_text(params, smallest_over->choices) + ", needs " +
                       (smallest_over->device >= 0 ? detail::gib_text(smallest_over->bytes) + " on device " +
                                                         std::to_string(smallest_over->device)
                                                   : "at least " + detail::gib_text(smallest_over->bytes) +
                                                         " for its weights, gradients, optimizer state and activations in flight") +
                       "; add devices, recompute, ZeRO or micro-batches to the space, or raise the memory limit)";
            if (stats.refused) why += "; refusals:";
        }
        std::vector<std::pair<std::int64_t, std::string>> reasons;
        for (const auto& [r, n] : stats.refusals) reasons.push_back({n, r});
        std::stable_sort(reasons.begin(), reasons.end(), [](const auto& a, const auto& b) { return a.first > b.first; });
        for (std::size_t k = 0; k < reasons.size() && k < 4; ++k)
            why += "\n  " + std::to_string(reasons[k].first) + " x " + reasons[k].second + " (for example " +
                   refusal_example[reasons[k].second] + ")";
        throw search_error(why);
    }
    result.best = std::move(*best);
    result.runner_up = std::move(second);
    result.plan = space;
    result.plan.choices = result.best.choices;
    concrete_boundaries(result.plan, params);
    // The gap: to the lowest bound of what was not priced and may fit. That is the leaves
    // from `next` on (the head moved to the front is not in bound order), those passed over
    // as likely over memory, and where assignments were left unbounded, the floor.
    if (!proven) {
        double lowest = passed_over_bound;
        for (std::size_t k = next; k < leaves.size(); ++k)
            if (leaves[k].memory <= result.memory_limit) lowest = std::min(lowest, leaves[k].bound);
        if (stats.unbounded > 0) lowest = std::min(lowest, floors.step);
        const double step = result.best.price.step_seconds;
        if (lowest < step) result.gap = std::min(1.0, (step - std::max(lowest, 0.0)) / step);
    }
    return result;
}

}  // namespace loom::search::detail
#endif  // LOOM_HEADER_DEFINITIONS
