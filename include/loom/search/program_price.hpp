#pragma once
// The price of a plan's programs on a cluster: what one training step of the per-device
// programs that partition::apply_plan produced costs, instruction by instruction.
//
//   partition::partitioned_graph pg = partition::apply_plan(model, plan);
//   search::program_price p = search::price_programs(pg, search::dgx_a100(2));
//   p.step_seconds, p.devices[d].memory.total(), p.explain()
//
// - Compute: every instruction of every device's program, from its FLOPs and the bytes it
//   reads and writes (op_def::flops and the tensors' shapes): a GEMM-like instruction runs
//   at the device's GEMM efficiency scaled by its shape (small dimensions run slower,
//   gemm_shape_factor below), the rest at the roofline of FLOPs and memory bandwidth.
// - Communication: every materialized transfer by its collective, its group's placement
//   over nodes, and its bytes (search/communication.hpp). Groups of the same transfer for
//   other ranks (the data-parallel all-reduce of each tensor-parallel rank) that cross the
//   same nodes are taken to run at once and share those nodes' NICs.
// - Time: an event-driven run of all devices' programs in their op-order. Each device has a
//   compute stream and a communication stream (or one stream, overlap = false, as the host
//   backend runs); an instruction starts when its stream is free and its inputs are ready;
//   a collective starts when every member has reached it. The step after the programs
//   follows, as the trainers run it: the gradients' global norm (each element read once
//   over the devices) and its all-reduce, the optimizer's update (which applies the
//   clipping coefficient as it reads each gradient), and under ZeRO-1/2 the all-gather of
//   every updated shard over its replicas.
// - Memory: what the host backend allocates for the program (runtime/compile.hpp): the
//   liveness-planned arena of intermediates plus the bound tensors (parameters, gradients,
//   inputs, loss), the optimizer's state for what the device updates (AdamW: two float
//   moments, ZeRO-1/2 sharding them over the replicas), and the runtime's fixed bytes.
#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <limits>
#include <map>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include <loom/core/dim.hpp>
#include <loom/core/error.hpp>
#include <loom/core/linkage.hpp>
#include <loom/partition/partitioned_graph.hpp>
#include <loom/runtime/compile.hpp>
#include <loom/search/communication.hpp>
#include <loom/search/hardware.hpp>
#include <loom/search/op_rate.hpp>

namespace loom::search {

// Replica folding (search/folded_price.hpp): the programs priced are those of an instance
// of the plan with fewer data-parallel replicas than the real one, and each instance device
// stands for a real device. A transfer within a replica runs over the real devices its
// members stand for; one that crosses replicas runs over the whole real replica families of
// its members (every real replica of the same piece), with the same bytes per member (the
// buffer convention of search/communication.hpp makes them independent of the group size).
// Optimizer state replicated over the instance's replicas is counted as replicated over the
// real ones (ZeRO-1 and ZeRO-2 shard it over them).
struct replica_fold {
    int instance_replicas = 1, real_replicas = 1;
    std::vector<int> real;                 // instance device -> the real device it is
    std::vector<int> replica;              // instance device -> its replica in the instance
    std::vector<std::vector<int>> family;  // instance device -> its piece's real device in every real replica

    // Whether a transfer over `group` crosses replicas. A point-to-point transfer between two
    // replicas (the loss's copies) stays a transfer between the two real devices.
    bool crosses(const partition::transfer& tr) const {
        if (tr.kind == partition::transfer_kind::send_recv) return false;
        const auto& group = tr.group;
        for (int d : group)
            if (replica.at(static_cast<std::size_t>(d)) != replica.at(static_cast<std::size_t>(group.front()))) return true;
        return false;
    }
    // How many real transfers one instance transfer over `group` stands for: one per real
    // replica when it stays inside its replica, else itself.
    double real_copies(const partition::transfer& tr) const {
        return crosses(tr) ? 1.0 : static_cast<double>(real_replicas) / instance_replicas;
    }
    // The real groups of every real copy of a transfer: itself when it crosses replicas, else
    // the same members in each real replica.
    std::vector<std::vector<int>> real_groups_of_copies(const partition::transfer& tr) const {
        if (crosses(tr)) return {real_group(tr)};
        std::vector<std::vector<int>> out;
        for (int r = 0; r < real_replicas; ++r) {
            std::vector<int> g;
            for (int d : tr.group) g.push_back(family.at(static_cast<std::size_t>(d)).at(static_cast<std::size_t>(r)));
            out.push_back(std::move(g));
        }
        return out;
    }
    // The real devices a transfer among instance devices runs over.
    std::vector<int> real_group(const partition::transfer& tr) const {
        const bool across = crosses(tr);
        std::vector<int> out;
        for (int d : tr.group) {
            if (!across) {
                out.push_back(real.at(static_cast<std::size_t>(d)));
                continue;
            }
            for (int r : family.at(static_cast<std::size_t>(d)))
                if (std::find(out.begin(), out.end(), r) == out.end()) out.push_back(r);
        }
        return out;
    }
};

struct price_options {
    loom::precision storage = loom::precision::f32;  // how tensors are stored (bytes per element)
    // true: communication overlaps computation (a separate stream, as NCCL on GPUs); false:
    // every device runs its program one instruction at a time (the host backend).
    bool overlap = true;
    // A GEMM dimension at which the GEMM runs at half of its large-shape efficiency along
    // that dimension (gemm_shape_factor). An assumption until calibration measures it.
    double gemm_half_dimension = 16;
    double instruction_overhead = 0;  // s per instruction (a kernel launch, a dispatch)
    // Optimizer state per element the device updates: AdamW's two float moments (8), plus a
    // float master copy when tensors are stored in bf16.
    double optimizer_bytes_per_element = 8;
    // What a runtime holds beside the program: context, communicator buffers, allocator
    // fragmentation. Stated, not measured: 0 for the host backend's arena, about 2 GiB on a
    // GPU with NCCL (context ~0.5 GiB, NCCL buffers ~1 GiB, caching allocator slack).
    double runtime_bytes = 0;
    algorithm collectives = algorithm::automatic;
    bool record_timeline = false;  // keep every instruction's predicted start and end
    // Devices that share one machine's compute (ranks on one host): how many. The
    // profile's rates are per device while all of them compute at once (calibrate_host(ranks)
    // states them so). The timeline runs each device at its rate alone (solo_rates, else
    // the machine's: the rates divided by this count), stretched toward its rate together by
    // the devices that compute during it (price_programs), and the step is at least all
    // devices' work spread over the machine: each instruction at its rate divided by this
    // count, or alone where that is faster. Ranks in processes of their own (MPI) do more
    // together than one at a time; threads that queue for one pool do less.
    int compute_shared_by = 1;
    // Calibrated rates by op kind (op_def::name); kinds without one use the device profile's
    // measured rates for `storage` (device_profile::rates), else its roofline.
    op_rates rates;
    // With compute_shared_by > 1: the same op kinds' rates of one device computing while the
    // others wait (calibrated apart, as search::calibrate_host_ops_alone measures them).
    // Empty: a device alone runs at the machine's rate. Ranks in processes of their own
    // (MPI) that each have the machine's threads do more together than one at a time, so
    // their rates together are not their rates alone times the count. Every kind here must
    // have a rate in `rates`.
    op_rates solo_rates;
    // Set: the programs are a replica-folded instance of the plan (not owned).
    const replica_fold* fold = nullptr;
    // Set (not owned): a folded price stops at its next instance, or at the next op of the
    // one it materializes (partition::apply_options::cancel), once this reads true, throwing
    // price_cancelled. A search past its time budget sets it for the prices whose
    // results it would drop, so it does not wait for them (at 1024 devices, a minute each).
    const std::atomic<bool>* cancel = nullptr;
    // A folded price refuses (plan_error) a plan whose largest instance would hold more op
    // pieces than this (every micro-batch's, Coshard's and each device's piece of every op),
    // before it materializes any: that takes 12 to 20 KB a piece and about as many
    // microseconds. A 96-layer GPT's largest instance under Megatron-LM's plan on 1024 GPUs
    // holds 0.1 million pieces (1.2 GiB, 3 s); under the interlaced pipeline of 16 stages of
    // TP 4 x DP 16 with Coshard 4, 1.46 million (half of them took 14 GiB and 133 s), with
    // Coshard 128, 43 million. The default keeps one price within about 12 GiB. 0: no limit.
    std::int64_t max_instance_pieces = 600'000;
};

// Thrown by a price whose price_options::cancel was set: no price, and nothing wrong with
// the plan.
struct price_cancelled : error {
    price_cancelled() : error("price cancelled: the search that asked for it stopped (its time budget)") {}
};

struct device_memory {
    double bound = 0;       // parameters, gradients, inputs and loss (bound before running)
    double arena = 0;       // intermediates, liveness-planned
    double optimizer = 0;   // AdamW moments for what this device updates
    double runtime = 0;     // price_options::runtime_bytes
    double total() const { return bound + arena + optimizer + runtime; }
};

struct device_price {
    double compute = 0;        // s the compute stream is busy
    double communication = 0;  // s the communication stream is busy
    double finish = 0;         // s when its last instruction ends
    double optimizer = 0;      // s of its passes over memory after the programs: the norm, the (clipped) update
    double gathers = 0;        // s of its collectives after them: the norm's all-reduce, ZeRO-1/2's shard gathers
    std::int64_t instructions = 0;
    device_memory memory;
};

// One instruction on the predicted timeline.
struct priced_instruction {
    int device = 0;
    node_id node = no_id;  // in the device's graph
    bool communication = false;
    double start = 0, end = 0;  // s
};

struct program_price {
    double step_seconds = 0;  // makespan of the programs, plus the slowest step after them
    double makespan = 0;
    std::vector<device_price> devices;
    std::int64_t transfers = 0;
    double transfer_seconds = 0;  // sum over transfers of their duration
    std::vector<priced_instruction> timeline;  // when price_options::record_timeline

    double peak_memory() const {
        double m = 0;
        for (const auto& d : devices) m = std::max(m, d.memory.total());
        return m;
    }
    int peak_memory_device() const {
        int best = 0;
        for (std::size_t d = 0; d < devices.size(); ++d)
            if (devices[d].memory.total() > devices[static_cast<std::size_t>(best)].memory.total()) best = static_cast<int>(d);
        return best;
    }
    double max_compute() const {
        double m = 0;
        for (const auto& d : devices) m = std::max(m, d.compute);
        return m;
    }
    double max_communication() const {
        double m = 0;
        for (const auto& d : devices) m = std::max(m, d.communication);
        return m;
    }
    // Share of device time in [0, makespan] that computes nothing: bubbles and exposed
    // communication.
    double idle_fraction() const {
        if (devices.empty() || makespan <= 0) return 0;
        double busy = 0;
        for (const auto& d : devices) busy += d.compute;
        return 1.0 - busy / (makespan * static_cast<double>(devices.size()));
    }
};

// Seconds of one device's passes over memory after its programs: AdamW over `updated`
// elements (reading parameter, gradient and two float moments, writing three; it applies the
// clipping coefficient as it reads) and the norm's read of `norm_read` gradient elements, at
// the device's memory bandwidth, divided by the devices sharing one machine. The price and
// the search's bound (after_programs_lower_bound) both count it so.
inline double optimizer_pass_seconds(double updated, double norm_read, const cluster& c, const price_options& o) {
    const double element = static_cast<double>(real_bytes(o.storage));
    const double bytes = updated * (4.0 * element + 3.0 * 4.0) + norm_read * element;
    return bytes / (c.device.memory_bandwidth * c.device.elementwise_efficiency) / o.compute_shared_by;
}

// The share of a GEMM's large-shape efficiency that a dimension d reaches:
// (d / (d + h)) / (512 / (512 + h)), at most 1. Calibration runs 512^3 GEMMs, so shapes at
// least that large run at the calibrated efficiency.
inline double gemm_shape_factor(double d, double h) {
    if (h <= 0) return 1.0;
    constexpr double reference = 512.0;
    return std::min(1.0, (d / (d + h)) / (reference / (reference + h)));
}

// The (m, n, k) of a GEMM with these FLOPs (2mnk), elements read (mk + kn) and written
// (mn), the smaller of m, n first. Batched products and biases make it an estimate.
LOOM_INLINE std::tuple<double, double, double> gemm_shape(double flops, double read, double written);

// Peak FLOP/s for arithmetic in storage precision p. Double uses the device's float peak
// (no double figure is profiled: a host plan calibrates in float).
inline double peak_for(const device_profile& d, loom::precision p) {
    return d.peak_flops(p == loom::precision::f64 ? loom::precision::f32 : p);
}

namespace detail {

inline bool is_transfer(const node& n) { return n.attrs.has("transfer"); }

LOOM_INLINE double node_bytes(const graph& g, const node& n, loom::precision p);

// Seconds of one compute instruction.
LOOM_INLINE double instruction_seconds(const graph& g, const node& n, const device_profile& dev, const price_options& o);

// Seconds of instruction n of one device in the timeline, and its share of the machine's
// work: both instruction_seconds / compute_shared_by, unless a solo rate prices the first
// (the second is then the lesser of the two: the machine does it no slower than alone).
// `slowdown`: its cost with every device computing at once against its timeline cost (its
// rate together against its solo rate; 1 without a solo rate).
struct instruction_cost {
    double timeline = 0;
    double machine = 0;
    double slowdown = 1;
};
LOOM_INLINE instruction_cost shared_instruction_cost(const graph& g, const node& n, const device_profile& dev,
                                                     const price_options& o);

// Sets stretch[d][i] of each compute instruction (busy[d][i]: its interval in the last run,
// empty for transfers) to 1 + (k - 1) / (shared_by - 1) * (slowdown - 1), k the devices
// computing during it on average, itself included. Returns whether any stretch moved by
// more than 0.1%.
LOOM_INLINE bool stretch_by_overlap(const std::vector<std::vector<std::pair<double, double>>>& busy,
                                    const std::vector<std::vector<instruction_cost>>& costs, int shared_by,
                                    std::vector<std::vector<double>>& stretch);

LOOM_INLINE collective collective_of(partition::transfer_kind k);

// Bytes of a transfer in communication.hpp's convention: the whole buffer on one member
// (the output of an all_gather, the input of a reduce_scatter, ...), the largest member's.
LOOM_INLINE double transfer_bytes(const partition::partitioned_graph& pg, const partition::transfer& tr, loom::precision p);

// For every transfer, how many groups of its kind for the same tensor (its copies for
// other ranks) reach the node of its that most of them reach. Groups within one node never
// share NICs and count 1. copies[i]: the groups of devices transfer i stands for (its own
// group; under replica folding its copy in every real replica).
LOOM_INLINE std::vector<int> nic_sharing(const partition::partitioned_graph& pg,
                                         const std::vector<std::vector<std::vector<int>>>& copies, const topology& topo);

}  // namespace detail

// Seconds of each transfer of `pg` on cluster c.
LOOM_INLINE std::vector<double> transfer_seconds(const partition::partitioned_graph& pg, const cluster& c,
                                                 const price_options& o = {});

// The price of one training step of pg's programs on the first pg.world devices of c.
LOOM_INLINE program_price price_programs(const partition::partitioned_graph& pg, const cluster& c, const price_options& o = {});

}  // namespace loom::search

// Definitions: compiled here (header-only) or once in loom::compiled (core/linkage.hpp).
#if LOOM_HEADER_DEFINITIONS

namespace loom::search {

LOOM_INLINE std::tuple<double, double, double> gemm_shape(double flops, double read, double written) {
    const double k = flops / (2.0 * written);
    const double sum = read / k;  // m + n
    const double disc = sum * sum - 4.0 * written;
    double m = disc > 0 ? (sum - std::sqrt(disc)) / 2.0 : std::sqrt(written);
    m = std::max(m, 1.0);
    return {m, written / m, k};
}
}  // namespace loom::search

namespace loom::search::detail {

LOOM_INLINE double node_bytes(const graph& g, const node& n, loom::precision p) {
    double bytes = 0;
    for (tensor_id t : n.inputs) bytes += static_cast<double>(tensor_bytes(g.tensor(t), storage_precision(g, t, p)));
    for (tensor_id t : n.outputs) bytes += static_cast<double>(tensor_bytes(g.tensor(t), storage_precision(g, t, p)));
    return bytes;
}

// The measured rate of an op kind: the options' (the host's calibration), else the device
// profile's for the storage precision (a GPU's calibration), else none (the roofline).
inline const op_rate* rate_for(const price_options& o, const device_profile& dev, std::string_view kind) {
    if (auto rate = o.rates.find(kind); rate != o.rates.end()) return &rate->second;
    const auto measured = dev.rates.find(o.storage);
    if (measured == dev.rates.end()) return nullptr;
    const auto rate = measured->second.find(kind);
    return rate == measured->second.end() ? nullptr : &rate->second;
}

LOOM_INLINE double instruction_seconds(const graph& g, const node& n, const device_profile& dev, const price_options& o) {
    const double flops = n.op->flops ? n.op->flops(g, n) : 0.0;
    double read = 0, written = 0;
    for (tensor_id t : n.inputs) read += static_cast<double>(g.tensor(t).dims.numel());
    for (tensor_id t : n.outputs) written += static_cast<double>(g.tensor(t).dims.numel());
    const double bytes = node_bytes(g, n, o.storage);
    if (const op_rate* rate = rate_for(o, dev, n.op->name)) return rate->seconds(rate->per_flop ? flops : bytes) + o.instruction_overhead;
    const double peak = peak_for(dev, o.storage);
    const double bandwidth = dev.memory_bandwidth * dev.elementwise_efficiency;
    double t = bytes / bandwidth;
    if (written > 0 && flops >= 16.0 * written) {
        const auto [m, nn, k] = gemm_shape(flops, read, written);
        const double efficiency = dev.gemm_efficiency * gemm_shape_factor(m, o.gemm_half_dimension) *
                                  gemm_shape_factor(nn, o.gemm_half_dimension) *
                                  gemm_shape_factor(k, o.gemm_half_dimension);
        t = std::max(t, flops / (peak * efficiency));
    } else {
        t = std::max(t, flops / (peak * dev.elementwise_efficiency));
    }
    return t + o.instruction_overhead;
}

LOOM_INLINE instruction_cost shared_instruction_cost(const graph& g, const node& n, const device_profile& dev,
                                                     const price_options& o) {
    const double machine = instruction_seconds(g, n, dev, o) / o.compute_shared_by;
    const auto solo = o.solo_rates.find(n.op->name);
    if (solo == o.solo_rates.end()) return {machine, machine};
    const double flops = n.op->flops ? n.op->flops(g, n) : 0.0;
    const double units = solo->second.per_flop ? flops : node_bytes(g, n, o.storage);
    const double alone = solo->second.seconds(units) + o.instruction_overhead;
    const double together = machine * o.compute_shared_by;
    return {alone, std::min(alone, machine), alone > 0 ? std::max(1.0, together / alone) : 1.0};
}

LOOM_INLINE bool stretch_by_overlap(const std::vector<std::vector<std::pair<double, double>>>& busy,
                                    const std::vector<std::vector<instruction_cost>>& costs, int shared_by,
                                    std::vector<std::vector<double>>& stretch) {
    // The count of devices computing, as a step function: +1 at each start, -1 at each end.
    std::vector<std::pair<double, int>> edges;
    for (const auto& device : busy)
        for (const auto& [start, end] : device)
            if (end > start) {
                edges.push_back({start, 1});
                edges.push_back({end, -1});
            }
    std::sort(edges.begin(), edges.end());
    // times[j] and area[j]: the j-th distinct edge and the integral of the count up to it.
    std::vector<double> times, area;
    int computing = 0;
    for (std::size_t j = 0; j < edges.size(); ++j) {
        if (times.empty() || edges[j].first > times.back()) {
            const double before = times.empty() ? 0.0 : area.back() + computing * (edges[j].first - times.back());
            times.push_back(edges[j].first);
            area.push_back(before);
        }
        computing += edges[j].second;
    }
    const auto area_at = [&](double t) {
        const auto at = std::lower_bound(times.begin(), times.end(), t);
        return area[static_cast<std::size_t>(at - times.begin())];  // every start and end is an edge
    };
    bool moved = false;
    for (std::size_t d = 0; d < busy.size(); ++d)
        for (std::size_t i = 0; i < busy[d].size(); ++i) {
            const auto [start, end] = busy[d][i];
            if (!(end > start)) continue;
            const double devices = (area_at(end) - area_at(start)) / (end - start);
            const double share = std::clamp((devices - 1.0) / (shared_by - 1.0), 0.0, 1.0);
            const double s = 1.0 + share * (costs[d][i].slowdown - 1.0);
            if (std::abs(s - stretch[d][i]) > 1e-3 * stretch[d][i]) moved = true;
            stretch[d][i] = s;
        }
    return moved;
}

LOOM_INLINE collective collective_of(partition::transfer_kind k) {
    switch (k) {
        case partition::transfer_kind::all_reduce: return collective::all_reduce;
        case partition::transfer_kind::all_gather: return collective::all_gather;
        case partition::transfer_kind::reduce_scatter: return collective::reduce_scatter;
        case partition::transfer_kind::all_to_all: return collective::all_to_all;
        case partition::transfer_kind::broadcast: return collective::broadcast;
        case partition::transfer_kind::send_recv: return collective::send_recv;
    }
    return collective::send_recv;
}

LOOM_INLINE double transfer_bytes(const partition::partitioned_graph& pg, const partition::transfer& tr, loom::precision p) {
    const graph& g = pg.ir();
    const tensor_desc& t = g.tensor(tr.logical);
    const double element = static_cast<double>(
        t.kind == value_kind::index ? 4 : real_bytes(storage_precision(g, tr.logical, p)));
    double elements = 0;
    for (std::size_t m = 0; m < tr.group.size(); ++m) {
        const bool uses_input = tr.kind == partition::transfer_kind::reduce_scatter ||
                                tr.kind == partition::transfer_kind::all_to_all ||
                                tr.kind == partition::transfer_kind::send_recv;
        if (uses_input && m < tr.inputs.size() && tr.has_input[m])
            elements = std::max(elements, static_cast<double>(tr.inputs[m].numel()));
        if (!uses_input && m < tr.outputs.size() && tr.has_output[m])
            elements = std::max(elements, static_cast<double>(tr.outputs[m].numel()));
    }
    return elements * element;
}

LOOM_INLINE std::vector<int> nic_sharing(const partition::partitioned_graph& pg,
                                         const std::vector<std::vector<std::vector<int>>>& copies, const topology& topo) {
    std::vector<int> sharing(pg.transfers.size(), 1);
    using key = std::tuple<tensor_id, int, bool, node_id>;
    std::map<key, std::vector<std::size_t>> siblings;
    for (std::size_t i = 0; i < pg.transfers.size(); ++i) {
        const auto& tr = pg.transfers[i];
        siblings[{tr.logical, static_cast<int>(tr.kind), tr.backward, tr.consumer}].push_back(i);
    }
    auto nodes_of = [&](const std::vector<int>& group) {
        std::vector<int> nodes;
        for (int r : group) nodes.push_back(r / topo.devices_per_node);
        std::sort(nodes.begin(), nodes.end());
        nodes.erase(std::unique(nodes.begin(), nodes.end()), nodes.end());
        return nodes;
    };
    for (const auto& [k, members] : siblings) {
        // Every group of the sibling set once (folded transfers of two instance replicas
        // stand for the same real groups), counted on each node it crosses.
        std::map<std::vector<int>, std::vector<int>> crossing;  // group -> its nodes, for groups over 2 or more nodes
        for (std::size_t m : members)
            for (const auto& group : copies[m])
                if (!crossing.count(group))
                    if (auto nodes = nodes_of(group); nodes.size() >= 2) crossing.emplace(group, std::move(nodes));
        std::map<int, int> groups_on_node;
        for (const auto& [group, nodes] : crossing)
            for (int nd : nodes) ++groups_on_node[nd];
        for (std::size_t m : members) {
            int most = 1;
            for (const auto& group : copies[m])
                if (auto it = crossing.find(group); it != crossing.end())
                    for (int nd : it->second) most = std::max(most, groups_on_node[nd]);
            sharing[m] = most;
        }
    }
    return sharing;
}
}  // namespace loom::search::detail

namespace loom::search {

LOOM_INLINE std::vector<double> transfer_seconds(const partition::partitioned_graph& pg, const cluster& c,
                                                 const price_options& o) {
    if (pg.world > c.devices())
        throw usage_error("price_programs: the plan runs on " + std::to_string(pg.world) + " devices but cluster '" +
                          c.name + "' has " + std::to_string(c.devices()) + "; plan for the cluster's devices or give a larger cluster");
    // The devices each transfer runs over: its group, or under replica folding the real devices.
    std::vector<std::vector<int>> groups;
    std::vector<std::vector<std::vector<int>>> copies;
    groups.reserve(pg.transfers.size());
    copies.reserve(pg.transfers.size());
    for (const auto& tr : pg.transfers) {
        groups.push_back(o.fold ? o.fold->real_group(tr) : tr.group);
        copies.push_back(o.fold ? o.fold->real_groups_of_copies(tr) : std::vector<std::vector<int>>{tr.group});
    }
    const std::vector<int> sharing = detail::nic_sharing(pg, copies, c.topo);
    std::vector<double> seconds(pg.transfers.size(), 0.0);
    for (std::size_t i = 0; i < pg.transfers.size(); ++i) {
        const auto& tr = pg.transfers[i];
        const group_placement p = placement(c.topo, groups[i]);
        seconds[i] = collective_cost(c, detail::collective_of(tr.kind), detail::transfer_bytes(pg, tr, o.storage),
                                     static_cast<int>(groups[i].size()), p, o.collectives, sharing[i])
                         .total();
    }
    return seconds;
}

LOOM_INLINE program_price price_programs(const partition::partitioned_graph& pg, const cluster& c, const price_options& o) {
    if (o.compute_shared_by < 1)
        throw usage_error("price_programs: compute_shared_by = " + std::to_string(o.compute_shared_by) +
                          "; give the number of devices that share one machine's compute (1: none share)");
    if (!o.solo_rates.empty() && o.compute_shared_by == 1)
        throw usage_error("price_programs: solo_rates given but compute_shared_by = 1; solo rates are for devices that "
                          "share one machine: set compute_shared_by to their count, or leave solo_rates empty");
    for (const auto& [kind, rate] : o.solo_rates) {
        const auto shared = o.rates.find(kind);
        if (shared == o.rates.end() || shared->second.per_flop != rate.per_flop)
            throw usage_error("price_programs: op kind '" + kind +
                              "' has a solo rate but no rate together in the same units; calibrate both in one run "
                              "(search::host_price_options) or leave solo_rates empty");
    }
    std::vector<double> transfer_time = transfer_seconds(pg, c, o);
    for (double& t : transfer_time) t /= o.compute_shared_by;
    const int world = pg.world;
    program_price out;
    out.devices.resize(static_cast<std::size_t>(world));
    double transfers = 0;
    for (std::size_t i = 0; i < pg.transfers.size(); ++i) {
        const double copies = o.fold ? o.fold->real_copies(pg.transfers[i]) : 1.0;
        transfers += copies;
        out.transfer_seconds += copies * transfer_time[i];
    }
    out.transfers = std::llround(transfers);

    // Programs as the host trainer compiles them: memory, and the instruction order.
    struct device_run {
        std::vector<node_id> compute, communication;  // one stream each (overlap), or all in `compute`
        std::size_t next_compute = 0, next_communication = 0;
        double compute_free = 0, communication_free = 0;
        std::vector<double> ready;  // per tensor of the device graph; < 0: not produced yet
    };
    std::vector<device_run> runs(static_cast<std::size_t>(world));
    for (int d = 0; d < world; ++d) {
        const auto& part = pg.devices[static_cast<std::size_t>(d)];
        const graph& g = part.ir();
        compile_options co{.prec = o.storage, .outputs = {part.loss}, .keep_every_node = true};
        if (!pg.order.empty()) co.order = pg.order.at(static_cast<std::size_t>(d));
        const program prog = compile_program(g, co);
        device_price& price = out.devices[static_cast<std::size_t>(d)];
        price.memory.arena = static_cast<double>(prog.arena_bytes);
        for (tensor_id t : prog.bound) price.memory.bound += static_cast<double>(prog.bytes_of(t));
        price.memory.runtime = o.runtime_bytes;
        price.instructions = static_cast<std::int64_t>(prog.steps.size());

        device_run& run = runs[static_cast<std::size_t>(d)];
        run.ready.assign(g.tensors.size(), -1.0);
        for (std::size_t t = 0; t < g.tensors.size(); ++t)
            if (g.tensors[t].producer == no_id) run.ready[t] = 0.0;
        for (const instruction& step : prog.steps) {
            const node& n = g.at(step.node);
            (o.overlap && detail::is_transfer(n) ? run.communication : run.compute).push_back(step.node);
        }
    }

    // Optimizer state and step: what each device updates. A piece stored on r devices is
    // updated by each of them, or by 1/r of each under ZeRO-1 (ZeRO-3 stores shards
    // already). Under ZeRO-2 each device updates its gradient shards, cut from its stored
    // pieces over their data-parallel group (train::update_group: a layer norm that every
    // tensor-parallel rank stores whole keeps one set of shards per rank).
    {
        std::map<std::pair<tensor_id, std::string>, double> copies;
        std::map<std::pair<tensor_id, std::string>, int> replica_seen;  // under folding: the first replica holding it, or -1: several
        std::map<std::pair<tensor_id, std::string>, std::vector<int>> holders;  // the devices storing it
        auto key_of = [](const partition::stored_piece& s) {
            std::string k;
            for (const auto& r : s.region.ranges) k += std::to_string(r.begin) + ":" + std::to_string(r.end) + ",";
            return std::pair<tensor_id, std::string>{s.logical, k};
        };
        for (std::size_t d = 0; d < pg.devices.size(); ++d)
            for (const auto& s : pg.devices[d].parameters) {
                const auto key = key_of(s);
                ++copies[key];
                holders[key].push_back(static_cast<int>(d));
                if (!o.fold) continue;
                const int r = o.fold->replica.at(d);
                auto [it, first] = replica_seen.try_emplace(key, r);
                if (!first && it->second != r) it->second = -1;
            }
        if (o.fold)  // a piece on several instance replicas is on every real one
            for (auto& [key, n] : copies)
                if (replica_seen[key] == -1) n *= static_cast<double>(o.fold->real_replicas) / o.fold->instance_replicas;
        const bool sharded = pg.zero == plan::zero_stage::optimizer;
        for (int d = 0; d < world; ++d) {
            double elements = 0;
            const partition::device_part& part = pg.devices[static_cast<std::size_t>(d)];
            if (pg.zero == plan::zero_stage::gradients) {
                for (const auto& gp : part.gradients) {
                    double n = static_cast<double>(gp.region.numel());
                    // Under folding, the shards of a piece on several instance replicas are
                    // cut over the real replicas.
                    for (const auto& s : part.parameters)
                        if (o.fold && s.logical == gp.logical && s.region.contains(gp.region) && !(s.region == gp.region) &&
                            replica_seen[key_of(s)] == -1)
                            n *= static_cast<double>(o.fold->instance_replicas) / o.fold->real_replicas;
                    elements += n;
                }
            }
            // The norm reads each gradient element once over the devices (`owned`). Under
            // ZeRO-2 the gradient shards are both what it reads and what the device updates;
            // otherwise the stored pieces, of which ZeRO-1 updates the owned share and the
            // others all.
            double owned = elements;
            if (pg.zero != plan::zero_stage::gradients) {
                double stored = 0;
                owned = 0;
                for (const auto& s : part.parameters) {
                    const double n = static_cast<double>(s.region.numel());
                    owned += n / copies[key_of(s)];
                    stored += n;
                }
                elements = sharded ? owned : stored;
            }
            device_price& price = out.devices[static_cast<std::size_t>(d)];
            price.memory.optimizer = elements * o.optimizer_bytes_per_element;
            const double element = static_cast<double>(real_bytes(o.storage));
            price.optimizer = optimizer_pass_seconds(elements, owned, c, o);
            // The norm's all-reduce of one number over every (real) device.
            const int real_world = o.fold ? world / o.fold->instance_replicas * o.fold->real_replicas : world;
            if (real_world > 1)
                price.gathers = collective_cost(c, collective::all_reduce, 8.0, real_world,
                                                placement(c.topo, device_group{.size = real_world}), o.collectives)
                                    .total();
            // ZeRO-1/2: each piece stored on several devices is gathered whole again after
            // each updates its shard (train::distributed_trainer::synchronize_shards), over
            // the devices that store it (under folding, every real replica of it).
            const bool gathered = pg.zero == plan::zero_stage::optimizer || pg.zero == plan::zero_stage::gradients;
            if (gathered)
                for (const auto& s : part.parameters) {
                    const double n = copies[key_of(s)];
                    if (n <= 1) continue;
                    const std::vector<int>& group = o.fold ? o.fold->family.at(static_cast<std::size_t>(d)) : holders[key_of(s)];
                    price.gathers += collective_cost(c, collective::all_gather, static_cast<double>(s.region.numel()) * element,
                                                     static_cast<int>(std::llround(n)), placement(c.topo, group), o.collectives)
                                         .total();
                }
            price.gathers /= o.compute_shared_by;  // as every transfer's time (the profile's convention)
        }
    }

    // Each compute instruction's cost, by its position in its device's compute queue, and
    // how much it stretches when other devices compute at the same time (shared compute).
    std::vector<std::vector<detail::instruction_cost>> costs(static_cast<std::size_t>(world));
    std::vector<std::vector<double>> stretch(static_cast<std::size_t>(world));
    std::vector<std::vector<double>> initial_ready(static_cast<std::size_t>(world));
    for (int d = 0; d < world; ++d) {
        const device_run& run = runs[static_cast<std::size_t>(d)];
        const graph& g = pg.devices[static_cast<std::size_t>(d)].ir();
        auto& mine = costs[static_cast<std::size_t>(d)];
        mine.resize(run.compute.size());
        for (std::size_t i = 0; i < run.compute.size(); ++i) {
            const node& n = g.at(run.compute[i]);
            if (!detail::is_transfer(n)) mine[i] = detail::shared_instruction_cost(g, n, c.device, o);
        }
        stretch[static_cast<std::size_t>(d)].assign(run.compute.size(), 1.0);
        initial_ready[static_cast<std::size_t>(d)] = run.ready;
    }

    // The event-driven run. A collective starts once every member's stream has reached it
    // with its input ready. Each compute instruction takes its timeline cost times its
    // stretch; `busy` gets the interval of each.
    double machine_work = 0;  // shared compute: every device's work, spread over the machine
    std::vector<std::vector<std::pair<double, double>>> busy(static_cast<std::size_t>(world));
    const auto simulate = [&] {
        machine_work = 0;
        std::vector<int> arrived(pg.transfers.size(), 0);
        std::vector<double> earliest(pg.transfers.size(), 0.0);
        std::vector<double> sent_at(pg.transfers.size(), -1.0);  // send_recv: when the send was posted
        std::vector<std::vector<bool>> registered(static_cast<std::size_t>(world));
        out.timeline.clear();
        for (int d = 0; d < world; ++d) {
            registered[static_cast<std::size_t>(d)].assign(pg.transfers.size(), false);
            device_run& run = runs[static_cast<std::size_t>(d)];
            run.next_compute = run.next_communication = 0;
            run.compute_free = run.communication_free = 0;
            run.ready = initial_ready[static_cast<std::size_t>(d)];
            out.devices[static_cast<std::size_t>(d)].compute = 0;
            out.devices[static_cast<std::size_t>(d)].communication = 0;
            busy[static_cast<std::size_t>(d)].assign(run.compute.size(), {0.0, 0.0});
        }

        auto inputs_ready = [&](const device_run& run, const node& n) {
            double t = 0;
            for (tensor_id in : n.inputs) {
                const double r = run.ready[static_cast<std::size_t>(in)];
                if (r < 0) return -1.0;
                t = std::max(t, r);
            }
            return t;
        };
        // Stream `queue` of device d: run what can run; return whether anything did.
        auto advance = [&](int d, bool communication_queue) {
            device_run& run = runs[static_cast<std::size_t>(d)];
            const graph& g = pg.devices[static_cast<std::size_t>(d)].ir();
            auto& queue = communication_queue ? run.communication : run.compute;
            auto& next = communication_queue ? run.next_communication : run.next_compute;
            auto& free = communication_queue ? run.communication_free : run.compute_free;
            bool progressed = false;
            while (next < queue.size()) {
                const node& n = g.at(queue[next]);
                const double ready = inputs_ready(run, n);
                if (ready < 0) break;
                if (!detail::is_transfer(n)) {
                    const double start = std::max(free, ready);
                    const detail::instruction_cost& cost = costs[static_cast<std::size_t>(d)][next];
                    const double seconds = cost.timeline * stretch[static_cast<std::size_t>(d)][next];
                    free = start + seconds;
                    busy[static_cast<std::size_t>(d)][next] = {start, free};
                    if (o.record_timeline) out.timeline.push_back({d, queue[next], false, start, free});
                    out.devices[static_cast<std::size_t>(d)].compute += seconds;
                    machine_work += cost.machine;
                    for (tensor_id t : n.outputs) run.ready[static_cast<std::size_t>(t)] = free;
                    ++next;
                    progressed = true;
                    continue;
                }
                const auto id = static_cast<std::size_t>(n.attrs.get<std::int64_t>("transfer"));
                const auto& tr = pg.transfers[id];
                if (tr.kind == partition::transfer_kind::send_recv) {
                    // Point to point: the send is posted and the sender goes on (the backends
                    // buffer it); the receiver has the data one transfer time after both the
                    // send and its own receive are posted.
                    const double posted = std::max(free, ready);
                    const bool source = tr.group.front() == d;
                    if (!source && sent_at[id] < 0) break;
                    const double end = source ? posted + transfer_time[id] : std::max(sent_at[id], posted) + transfer_time[id];
                    if (source) sent_at[id] = posted;
                    if (o.record_timeline) out.timeline.push_back({d, queue[next], true, end - transfer_time[id], end});
                    for (tensor_id t : n.outputs) run.ready[static_cast<std::size_t>(t)] = end;
                    free = end;
                    out.devices[static_cast<std::size_t>(d)].communication += transfer_time[id];
                    ++next;
                    progressed = true;
                    continue;
                }
                auto& mine = registered[static_cast<std::size_t>(d)];
                if (!mine[id]) {
                    mine[id] = true;
                    earliest[id] = std::max(earliest[id], std::max(free, ready));
                    ++arrived[id];
                    progressed = true;
                }
                if (arrived[id] < static_cast<int>(tr.group.size())) break;
                // Everyone is here: run it on every member, which moves past it.
                const double end = earliest[id] + transfer_time[id];
                for (int member : tr.group) {
                    device_run& other = runs[static_cast<std::size_t>(member)];
                    const graph& og = pg.devices[static_cast<std::size_t>(member)].ir();
                    auto& other_queue = (o.overlap ? other.communication : other.compute);
                    auto& other_next = (o.overlap ? other.next_communication : other.next_compute);
                    auto& other_free = (o.overlap ? other.communication_free : other.compute_free);
                    const node& on = og.at(other_queue.at(other_next));
                    if (o.record_timeline) out.timeline.push_back({member, other_queue[other_next], true, earliest[id], end});
                    for (tensor_id t : on.outputs) other.ready[static_cast<std::size_t>(t)] = end;
                    other_free = end;
                    out.devices[static_cast<std::size_t>(member)].communication += transfer_time[id];
                    ++other_next;
                }
                progressed = true;
            }
            return progressed;
        };
        for (bool progressed = true; progressed;) {
            progressed = false;
            for (int d = 0; d < world; ++d) {
                progressed = advance(d, false) || progressed;
                if (o.overlap) progressed = advance(d, true) || progressed;
            }
        }
    };
    simulate();
    // Devices that share one machine's compute slow one another down while they compute at
    // once: alone, an instruction takes its solo cost; with every device computing, its cost
    // together (rates), `slowdown` times that. In between, it stretches by the devices that
    // compute during it, linearly from 1 alone to `slowdown` with all of them (the machine's
    // threads split among the ranks that ask for them). Which instructions overlap depends on
    // the stretches, so the run is repeated twice with the overlaps of the run before. Only
    // stretching, never shrinking, so the searcher's bounds (solo costs) stay below.
    if (o.compute_shared_by > 1 && !o.solo_rates.empty()) {
        for (int pass = 0; pass < 2; ++pass) {
            if (!detail::stretch_by_overlap(busy, costs, o.compute_shared_by, stretch)) break;
            simulate();
        }
    }

    double makespan = 0, after = 0, gathers = 0;
    for (int d = 0; d < world; ++d) {
        device_run& run = runs[static_cast<std::size_t>(d)];
        if (run.next_compute < run.compute.size() || run.next_communication < run.communication.size()) {
            const graph& g = pg.devices[static_cast<std::size_t>(d)].ir();
            const bool in_compute = run.next_compute < run.compute.size();
            const node& stuck = g.at(in_compute ? run.compute[run.next_compute] : run.communication[run.next_communication]);
            throw error("price_programs: device " + std::to_string(d) + " cannot run '" + stuck.name +
                                 "': its inputs never arrive or a member of its collective never reaches it; the "
                                 "programs were not checked (partition::check_programs)");
        }
        device_price& price = out.devices[static_cast<std::size_t>(d)];
        price.finish = std::max(run.compute_free, run.communication_free);
        makespan = std::max(makespan, price.finish);
        after = std::max(after, price.optimizer + price.gathers);
        gathers = std::max(gathers, price.gathers);
    }
    out.makespan = makespan;
    out.step_seconds = makespan + after;
    if (o.compute_shared_by > 1) {
        // One machine does all devices' work; each collective after the programs runs once
        // for all its members.
        double work = out.transfer_seconds + machine_work, optimizers = 0;  // transfer times are the machine's already
        for (const auto& d : out.devices) optimizers += d.optimizer;
        out.step_seconds = std::max(makespan, work) + optimizers + gathers;
    }
    return out;
}

}  // namespace loom::search
#endif  // LOOM_HEADER_DEFINITIONS
