#pragma once
// Calibration of the host backend as a cluster the searcher can plan for: n ranks on this
// machine (in-process, or MPI processes). It runs kernels and collectives, timed, and
// writes what it measured into a search profile, so it comes after runtime and search.
//
//   search::cluster hw = search::calibrate_host(4);               // about 1 s
//   search::price_options o = search::host_price_options(4);      // about 5 s
//   search::save_cluster(hw, "host.json");                        // or plan with it directly
//
// What is measured and what is assumed:
// - peak_flops_f32: float GEMMs of 512^3 on the whole thread pool, best of three, divided
//   by the ranks (the ranks share the cores); gemm_efficiency 1 since this is what loom's
//   kernels reach. No f16 peak: plan in precision::f32.
// - memory_bandwidth: a 64 MiB copy (read + write) on the thread pool, best of three,
//   divided by the ranks; elementwise_efficiency 1.
// - memory_bytes: the machine's available memory divided by the ranks.
// - the "intra-node links": latency per message and bandwidth of all-reduces, all-gathers,
//   reduce-scatters and sends, each solved from a small and a 1 MiB one over all ranks
//   (measure_host_links). One node, no NICs used.
// - the cost of every op kind (host_price_options): timed kernel by kernel on one rank
//   alone (its rate when the others wait), and scaled by how much longer a whole step
//   takes with all ranks running at once (their rates together).
#include <algorithm>
#include <optional>
#include <span>
#include <utility>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include <loom/core/error.hpp>
#include <loom/models/gpt.hpp>
#include <loom/runtime/comm/communicator.hpp>
#include <loom/runtime/comm/in_process.hpp>
#include <loom/runtime/compile.hpp>
#include <loom/runtime/host/bound_storage.hpp>
#include <loom/runtime/host/executor.hpp>
#include <loom/runtime/host/gemm.hpp>
#include <loom/runtime/host/op_profile.hpp>
#include <loom/runtime/host/thread_pool.hpp>
#include <loom/search/hardware.hpp>
#include <loom/search/program_price.hpp>

namespace loom::search {

namespace detail {

template <class F>
double best_seconds(int repeats, F&& f) {
    double best = 1e300;
    for (int r = 0; r < repeats; ++r) {
        const auto start = std::chrono::steady_clock::now();
        f();
        best = std::min(best, std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
    }
    return best;
}

// MemAvailable from /proc/meminfo, in bytes (0 when unknown).
inline double available_memory_bytes() {
    std::ifstream in("/proc/meminfo");
    std::string key;
    double kib = 0;
    std::string unit;
    while (in >> key >> kib >> unit)
        if (key == "MemAvailable:") return kib * 1024.0;
    return 0;
}

}  // namespace detail

// The links between the ranks of `everyone` as calibrate_host's profile states them, one
// per collective the host's plans run: all-reduce, all-gather, reduce-scatter and
// point-to-point sends. Every member calls this at once. For each it times the collective
// on a small buffer (one float per rank) and on 1 MiB over the whole group (sends: between
// ranks 2i and 2i + 1, back and forth), the median of five rounds of 20 each, averaged
// over the members, and solves the collective's price for the latency per message and the
// bandwidth, in the profile's convention: price_programs divides transfer times by the
// ranks sharing the machine, so both are the measured times' ranks times over. They
// differ: on one host an all-reduce adds as it copies, and a send is one copy.
using collective_links = std::map<collective, link>;

inline collective_links measure_host_links(comm::communicator& c, const comm::group& everyone) {
    const int ranks = everyone.size();
    if (ranks < 2) throw usage_error("measure_host_links: a group of " + std::to_string(ranks) + " rank; pass at least 2");
    const int me = everyone.index_of(c.rank());
    // Seconds of one call of `once` (which runs `per_call` operations), the members' mean
    // over those that take part.
    const auto timed = [&](const std::function<void()>& once, double per_call, bool takes_part) {
        if (takes_part) once();  // warm up
        std::vector<double> rounds;
        for (int round = 0; round < 5; ++round) {
            c.barrier(everyone);
            const auto start = std::chrono::steady_clock::now();
            if (takes_part)
                for (int i = 0; i < 20; ++i) once();
            double taken[2] = {takes_part ? std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() / 20 / per_call : 0.0,
                               takes_part ? 1.0 : 0.0};
            c.all_reduce_sum(taken, 2, comm::dtype::f64, everyone);
            rounds.push_back(taken[0] / taken[1]);
        }
        std::sort(rounds.begin(), rounds.end());
        return rounds[rounds.size() / 2];
    };
    const std::size_t large_floats = (1u << 20) / 4, per_rank_large = large_floats / static_cast<std::size_t>(ranks);
    std::vector<float> buffer(large_floats, 1.0f), other(large_floats, 0.0f);
    const int partner = me % 2 == 0 ? me + 1 : me - 1;
    const bool paired = partner < ranks;
    const int partner_rank = paired ? everyone.ranks[static_cast<std::size_t>(partner)] : -1;
    // One operation of `kind` on `floats` floats (all_gather, reduce_scatter: per rank).
    const auto run = [&](collective kind, std::size_t floats) -> std::function<void()> {
        switch (kind) {
            case collective::all_reduce:
                return [&, floats] { c.all_reduce_sum(buffer.data(), floats, comm::dtype::f32, everyone); };
            case collective::all_gather:
                return [&, floats] { c.all_gather(buffer.data(), other.data(), floats, comm::dtype::f32, everyone); };
            case collective::reduce_scatter:
                return [&, floats] { c.reduce_scatter_sum(buffer.data(), other.data(), floats, comm::dtype::f32, everyone); };
            default:  // send_recv: there and back
                return [&, floats] {
                    constexpr int tag = 7;
                    if (me % 2 == 0) {
                        c.send(buffer.data(), floats, comm::dtype::f32, partner_rank, tag);
                        c.recv(other.data(), floats, comm::dtype::f32, partner_rank, tag);
                    } else {
                        c.recv(other.data(), floats, comm::dtype::f32, partner_rank, tag);
                        c.send(buffer.data(), floats, comm::dtype::f32, partner_rank, tag);
                    }
                };
        }
    };
    // The price's latency and transmission terms per unit of latency and per byte/s.
    cluster unit;
    unit.topo.devices_per_node = ranks;
    unit.topo.nodes = 1;
    unit.topo.intra_node = {1.0, 1.0};
    unit.topo.inter_node_per_nic = {1.0, 1.0};
    collective_links links;
    for (collective kind : {collective::all_reduce, collective::all_gather, collective::reduce_scatter, collective::send_recv}) {
        const bool p2p = kind == collective::send_recv;
        const bool per_rank = kind == collective::all_gather || kind == collective::reduce_scatter;
        const int members = p2p ? 2 : ranks;
        const double small_bytes = 4.0 * (per_rank ? ranks : 1);
        const double large_bytes = 4.0 * static_cast<double>(per_rank ? per_rank_large * static_cast<std::size_t>(ranks) : large_floats);
        const group_placement one_node = placement(unit.topo, device_group{.size = members, .stride = 1, .first = 0});
        const comm_time per_unit_small = collective_cost(unit, kind, small_bytes, members, one_node);
        const comm_time per_unit_large = collective_cost(unit, kind, large_bytes, members, one_node);
        // A busy machine (another program, a virtual machine's neighbours) can make the small
        // message as slow as the large one; such a pair says nothing, and is measured again.
        // Every member sees the same means, so all of them retry, or not, together.
        constexpr int attempts = 5;
        link l;
        double moving = 0, large = 0;
        for (int attempt = 1; moving <= 0; ++attempt) {
            const double small = timed(run(kind, 1), p2p ? 2 : 1, !p2p || paired);
            large = timed(run(kind, per_rank ? per_rank_large : large_floats), p2p ? 2 : 1, !p2p || paired);
            l.latency = small * ranks / per_unit_small.latency;  // a few bytes take no measurable transmission
            moving = large * ranks - l.latency * per_unit_large.latency;
            if (moving <= 0 && attempt == attempts)
                throw error("measure_host_links: a " + std::string(to_string(kind)) + " of 1 MiB took " +
                            std::to_string(large * 1e6) + " us, no longer than the latency of a small one, " +
                            std::to_string(attempts) +
                            " times over; the machine was too busy to measure: stop what else runs and try again");
        }
        l.bandwidth = per_unit_large.transmission / moving;
        links[kind] = l;
    }
    return links;
}

// `between_ranks`: the links measured by measure_host_links on the ranks themselves (MPI
// processes); not given, `ranks` in-process ranks measure them. The all-reduce's is the
// profile's intra-node link, the others its links per collective.
inline cluster calibrate_host(int ranks, std::optional<collective_links> between_ranks = std::nullopt) {
    if (ranks < 1)
        throw usage_error("calibrate_host: " + std::to_string(ranks) + " ranks; give the number of in-process ranks, at least 1");
    const std::int64_t n = 512;
    std::vector<float> a(static_cast<std::size_t>(n * n), 1.0f), b(a.size(), 0.5f), c(a.size(), 0.0f);
    const auto run_gemm = [&] {
        host::gemm<float>(host::transpose::no, host::transpose::no, n, n, n, 1.0f, a.data(), n, b.data(), n, 0.0f, c.data(), n);
    };
    run_gemm();  // warm up: pack buffers, thread pool
    const double gemm_seconds = detail::best_seconds(3, run_gemm);
    const double flops = 2.0 * static_cast<double>(n) * n * n / gemm_seconds;

    const std::size_t bytes = 64u << 20;
    std::vector<char> from(bytes, 1), to(bytes, 0);
    // On the thread pool, as the optimizer's update and the element-wise kernels run.
    const std::int64_t chunk = 1 << 20;
    const auto copy = [&] {
        host::parallel_for(0, static_cast<std::int64_t>(bytes) / chunk, 1, [&](std::int64_t lo, std::int64_t hi) {
            std::memcpy(to.data() + lo * chunk, from.data() + lo * chunk, static_cast<std::size_t>((hi - lo) * chunk));
        });
    };
    copy();  // fault the pages in
    const double copy_seconds = detail::best_seconds(3, copy);
    const double bandwidth = 2.0 * static_cast<double>(bytes) / copy_seconds;

    cluster hw;
    hw.name = "host x" + std::to_string(ranks) + " (calibrated)";
    hw.device.name = "host rank";
    hw.device.peak_flops_f32 = flops / ranks;
    hw.device.peak_flops_f16 = 0;
    hw.device.memory_bandwidth = bandwidth / ranks;
    const double memory = detail::available_memory_bytes();
    hw.device.memory_bytes = (memory > 0 ? memory : 8.0 * (1ull << 30)) / ranks;
    hw.device.gemm_efficiency = 1.0;
    hw.device.elementwise_efficiency = 1.0;
    hw.topo.devices_per_node = ranks;
    hw.topo.nodes = 1;
    if (!between_ranks && ranks > 1)
        comm::run_ranks(ranks, [&](comm::communicator& c) {
            collective_links measured = measure_host_links(c, c.world());
            if (c.rank() == 0) between_ranks = std::move(measured);
        });
    hw.topo.intra_node = link{bandwidth / 2.0 / ranks, 20e-6};  // one rank: no transfers
    if (between_ranks) {
        const auto all_reduce = between_ranks->find(collective::all_reduce);
        if (all_reduce == between_ranks->end())
            throw usage_error("calibrate_host: the links between ranks lack the all-reduce's; pass what measure_host_links returns");
        hw.topo.intra_node = all_reduce->second;
        for (const auto& [kind, l] : *between_ranks)
            if (kind != collective::all_reduce) hw.topo.intra_node_by_collective[kind] = l;
    }
    hw.topo.inter_node_per_nic = hw.topo.intra_node;
    hw.topo.nics_per_node = 1;
    return hw;
}

// What one rank measured: the training steps of a small GPT at the calibration batches
// (1, 2, 4, 8 and 16), each kernel timed.
struct host_op_costs {
    static constexpr std::int64_t batches[] = {1, 2, 4, 8, 16};
    // Per op kind: per calibration batch, the units of work (FLOPs for kinds that count
    // them, else bytes read and written) and the mean seconds of one instruction.
    struct point {
        int batch = 0;  // index into batches
        double units = 0, seconds = 0;
    };
    std::map<std::string, std::vector<point>, std::less<>> kinds;
    std::map<std::string, bool, std::less<>> per_flop;
    // Per calibration batch: the mean wall seconds of one whole step, alone.
    std::vector<double> step_seconds;
    // Per calibration batch: the slowest rank's mean step while every rank runs it at once
    // (empty when measured alone only).
    std::vector<double> steps_together;

    // The curves, each point's seconds times scale[its batch] (empty: 1). Points of equal
    // work merge into one, their mean. A kind whose work did not grow with the batch (the
    // loss's seed gradient, a small parameter's gradient sum) has no slope to extrapolate:
    // its one point, a fill of one element in a quarter of a microsecond, would price a
    // fill of a million elements at a quarter of a second. Its curve stays flat beyond
    // that point instead (a second point a million times the work at the same time): what
    // it measured is a call's cost, not a rate.
    op_rates rates(const std::vector<double>& scale = {}) const {
        op_rates out;
        for (const auto& [kind, points] : kinds) {
            op_rate& r = out[kind];
            r.per_flop = per_flop.at(kind);
            std::vector<std::pair<double, double>> sorted;
            for (const point& p : points)
                sorted.push_back({p.units, p.seconds * (scale.empty() ? 1.0 : scale.at(static_cast<std::size_t>(p.batch)))});
            std::sort(sorted.begin(), sorted.end());
            int same = 0;
            for (const auto& [u, t] : sorted) {
                if (!r.points.empty() && u <= r.points.back().first * (1 + 1e-9)) {
                    r.points.back().second = (r.points.back().second * same + t) / (same + 1);
                    ++same;
                } else {
                    r.points.push_back({u, t});
                    same = 1;
                }
            }
            if (r.points.size() == 1) r.points.push_back({r.points.front().first * 1e6, r.points.front().second});
        }
        return out;
    }
};

namespace detail {

// One member's part of a calibration: every batch's step once to warm up, then five
// rounds over the batches, each a block of timed steps by the first member alone (the
// others wait at `barrier`) and, with more than one member, a block by every member at once
// (16 steps a block at batch 1, 3 at batches 8 and 16: about the same time at the small
// batches, so their short kernels are timed often enough, and never one step alone). A
// batch's step is the fastest of its blocks' means, since what else the machine runs only
// adds time. On a 2-vCPU virtual machine one step a block and the median of the blocks moved
// the step alone by 25% between runs, and priced the fidelity benchmark's plans at a
// Spearman rank correlation of 0.54 to 0.83 against 0.94 with three steps and the fastest
// block (benchmarks/RESULTS.md). The machine stays slow for a second or two at a time, so a
// batch's blocks lie in rounds apart, not one after another (that run of blocks measured one
// batch's step alone at 1.6 to 1.8 times its usual one in one calibration of six), and its
// blocks alone and together alternate, so that both see the machine in the same state:
// their ratio is what the price reads, and measured all alone and then all together it moved
// from 2.7 to 5.4 between runs. Together, the members meet at `barrier` after every step, as
// ranks of a plan meet at its collectives: a step then takes its slowest member's time, not
// each member's mean over a block (5 to 8% more on a 2-vCPU VM, where 4 in-process ranks
// share the pool unevenly). The first member's costs per op kind come from its blocks
// alone; steps_together holds this member's own steps.
template <class Barrier>
host_op_costs measure_host_ops(bool first, int members, Barrier&& barrier) {
    struct calibration_step {
        graph g;
        program prog;
        host::executor<float> exec;
        host::bound_storage<float> storage;
        host::op_profile profile;
        int runs = 0;
        std::vector<double> alone, together;
        explicit calibration_step(std::int64_t batch)
            : g(models::gpt({.layers = 2, .hidden = 128, .heads = 8, .vocab = 256, .seq = 64, .batch = batch})
                    .training_graph()),
              prog(compile_program(g, {.prec = loom::precision::f32})),
              exec(prog),
              storage(prog) {}
        double block_seconds(const std::function<void()>& after_step) {
            const auto start = std::chrono::steady_clock::now();
            for (int r = 0; r < runs; ++r) {
                exec.run();
                after_step();
            }
            return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() / runs;
        }
    };
    constexpr int blocks = 5;
    std::vector<std::unique_ptr<calibration_step>> steps;
    for (std::int64_t batch : host_op_costs::batches) {
        auto& step = *steps.emplace_back(std::make_unique<calibration_step>(batch));
        step.storage.bind_to(step.exec);
        for (tensor_id t : step.g.parameters)
            for (float& x : step.storage.real(t)) x = 0.01f;
        step.runs = std::max(3, static_cast<int>(80 / batch) / blocks);
        step.exec.run();  // warm up
    }
    for (int block = 0; block < blocks; ++block)
        for (auto& step : steps) {
            if (members > 1) barrier();
            if (first) {
                step->exec.set_profile(&step->profile);
                step->alone.push_back(step->block_seconds([] {}));
                step->exec.set_profile(nullptr);
            }
            if (members > 1) {
                barrier();
                step->together.push_back(step->block_seconds(barrier));
            }
        }
    host_op_costs costs;
    for (std::size_t b = 0; b < steps.size(); ++b) {
        const calibration_step& step = *steps[b];
        if (members > 1) costs.steps_together.push_back(*std::min_element(step.together.begin(), step.together.end()));
        if (!first) continue;
        costs.step_seconds.push_back(*std::min_element(step.alone.begin(), step.alone.end()));
        std::map<std::string, double, std::less<>> bytes;
        for (const instruction& i : step.prog.steps) {
            const node& n = step.g.at(i.node);
            bytes[std::string(n.op->name)] += node_bytes(step.g, n, loom::precision::f32);
        }
        for (const auto& e : step.profile.by_time()) {
            if (e.calls == 0) continue;
            const bool per_flop = e.flops > 0;
            const double calls = static_cast<double>(e.calls);
            const double units = (per_flop ? e.flops : bytes[e.kind] * step.runs * blocks) / calls;
            if (units <= 0) continue;
            costs.per_flop[e.kind] = per_flop;
            costs.kinds[e.kind].push_back({static_cast<int>(b), units, e.seconds / calls});
        }
    }
    return costs;
}

}  // namespace detail

// One host rank computing alone, with the machine's threads: the cost of every op kind
// (its solo_rates, host_op_costs::rates()) and of the calibration steps. About a second.
inline host_op_costs calibrate_host_ops_alone() {
    return detail::measure_host_ops(true, 1, [] {});
}

// Per batch, the slowest member's step of `mine` (every member of `everyone` calls this at
// once). A training step ends when its slowest rank does, and ranks that share the cores
// do not get equal shares of them: a mean over the ranks priced the machine's work
// together up to 12% below the slowest rank's.
inline std::vector<double> slowest_rank_steps(comm::communicator& c, const comm::group& everyone,
                                              const std::vector<double>& mine) {
    std::vector<double> all(mine.size() * static_cast<std::size_t>(everyone.size()));
    c.all_gather(mine.data(), all.data(), mine.size(), comm::dtype::f64, everyone);
    std::vector<double> slowest(mine.size(), 0.0);
    for (std::size_t r = 0; r < static_cast<std::size_t>(everyone.size()); ++r)
        for (std::size_t b = 0; b < mine.size(); ++b) slowest[b] = std::max(slowest[b], all[r * mine.size() + b]);
    return slowest;
}

// The ranks of `everyone` calibrated where they run (MPI processes, or threads of this
// process): every member calls this at once. The first member's op costs and steps alone,
// measured while the others wait, and on every member the slowest member's steps with all
// of them running at once (steps_together), in alternating blocks. Only the first member's
// result holds the costs alone; pass it to host_price_options. About 5 s for 4 ranks.
inline host_op_costs calibrate_host_ops_shared(comm::communicator& c, const comm::group& everyone) {
    const bool first = everyone.index_of(c.rank()) == 0;
    host_op_costs costs = detail::measure_host_ops(first, everyone.size(), [&] { c.barrier(everyone); });
    if (everyone.size() > 1) costs.steps_together = slowest_rank_steps(c, everyone, costs.steps_together);
    return costs;
}

// calibrate_host_ops_shared on `ranks` threads of this process, one executor each: the
// first rank's result.
inline host_op_costs calibrate_host_ops_in_process(int ranks) {
    if (ranks < 1)
        throw usage_error("calibrate_host_ops_in_process: " + std::to_string(ranks) + " ranks; give at least 1");
    host_op_costs first;
    comm::run_ranks(ranks, [&](comm::communicator& c) {
        host_op_costs mine = calibrate_host_ops_shared(c, c.world());
        if (c.rank() == 0) first = std::move(mine);
    });
    return first;
}

// The op rates of ranks computing together (price_options::rates): each kind's cost alone
// times how much longer the whole calibration step of its batch took with every rank
// running it at once (steps_together) than alone. Kernels that queue for a shared thread
// pool charge their wait to whichever kernel waited, so the kinds keep their costs alone
// and share the slowdown of the step.
inline op_rates rates_together(const host_op_costs& costs) {
    const std::vector<double>& together = costs.steps_together;
    if (together.size() != costs.step_seconds.size())
        throw usage_error("rates_together: " + std::to_string(together.size()) + " steps together for " +
                          std::to_string(costs.step_seconds.size()) +
                          " calibration batches alone; pass what calibrate_host_ops_shared returned on the first rank");
    std::vector<double> scale(together.size());
    for (std::size_t b = 0; b < scale.size(); ++b) {
        if (!(together[b] > 0) || !(costs.step_seconds[b] > 0))
            throw usage_error("rates_together: calibration step " + std::to_string(b) + " took " +
                              std::to_string(together[b]) + " s together and " + std::to_string(costs.step_seconds[b]) +
                              " s alone; both must be positive");
        scale[b] = together[b] / costs.step_seconds[b];
    }
    return costs.rates(scale);
}

// How to price plans for `ranks` ranks of this host, in float: one instruction at a time
// per rank, the ranks sharing the machine's cores, every op kind at its measured cost
// alone (solo_rates) and together (rates). `measured`: what calibrate_host_ops_shared
// returned on the first of the ranks where they run (MPI processes); not given, `ranks`
// in-process ranks are calibrated. Pair it with calibrate_host(ranks).
inline price_options host_price_options(int ranks, std::optional<host_op_costs> measured = std::nullopt) {
    if (ranks < 1) throw usage_error("host_price_options: " + std::to_string(ranks) + " ranks; give at least 1");
    price_options o;
    o.storage = loom::precision::f32;
    o.overlap = false;
    o.compute_shared_by = ranks;
    if (ranks == 1) {
        o.rates = (measured ? *measured : calibrate_host_ops_alone()).rates();
        return o;
    }
    const host_op_costs costs = measured ? std::move(*measured) : calibrate_host_ops_in_process(ranks);
    o.rates = rates_together(costs);
    o.solo_rates = costs.rates();
    return o;
}

}  // namespace loom::search
