// How well the searcher's price of a plan's programs predicts the plan's measured step on
// this machine: about 20 plans of a small GPT on 4 in-process ranks (threads sharing the
// cores), each priced on a host profile calibrated for ranks that share cores
// (search::calibrate_host, and host_price_options: the cost of every op kind measured on
// all ranks at once and on one rank alone, one instruction at a time per rank, the ranks
// sharing one machine's cores) and then trained for a few steps. Under MPI the ranks'
// rates together are measured in the MPI processes themselves.
//
//   fidelity [--steps 10] [--warmup 2] [--rounds 3] [--layers 8] [--hidden 128] [--seq 64] [--batch 16]
//            [--out benchmarks/results/fidelity.json] [--trace benchmarks/results/fidelity_trace.json]
//            [--trace-plan "4 stages, 4 micro, 1F1B"]
//   mpirun -np 4 fidelity --mpi          the ranks as MPI processes (fidelity_mpi.json,
//                                        fidelity_mpi_trace.json)
// Run from the repository root.
//
// It reports, per plan, the predicted and the measured step (median over steps of the
// slowest rank, then the fastest of the rounds that measure every plan in turn) and the
// predicted and allocated memory (arena and bound tensors of rank 0),
// and over all plans the Spearman rank correlation of predicted and measured steps and
// whether the predicted best is the measured best. The trace file holds, for one plan
// (--trace-plan), the measured timeline of one step of every rank (the executor records each
// instruction's start and end) beside the predicted one, for Perfetto.
#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <mutex>
#include <numeric>
#include <optional>
#include <string>
#include <vector>

#include <loom/calibrate/host.hpp>
#include <loom/models/gpt.hpp>
#include <loom/partition/apply.hpp>
#include <loom/plan/presets.hpp>
#include <loom/runtime/comm/in_process.hpp>
#include <loom/search/program_price.hpp>
#include <loom/train/corpus.hpp>
#include <loom/train/data_loader.hpp>
#include <loom/train/distributed_trainer.hpp>
#include <loom/train/tokenizer.hpp>
#if LOOM_FIDELITY_MPI
#include <loom/runtime/comm/mpi.hpp>
#endif

#include "support/machine.hpp"
#include "support/rank_statistics.hpp"
#include "support/record.hpp"

using namespace loom;
using bench::median;
using bench::spearman;

namespace {

struct named_plan {
    std::string name;
    plan::plan_spec plan;
};

std::vector<named_plan> plans_on_4() {
    using plan::schedule_kind;
    namespace presets = plan::presets;
    plan::selector blocks;
    blocks.repeat = "blocks";
    auto with = [](plan::plan_spec p, const plan::plan_spec& more) { return p.then(more); };
    return {
        {"data parallel x4", presets::data_parallel(4)},
        {"megatron TP 4", presets::megatron(4)},
        {"megatron TP 2 x DP 2", presets::megatron(2, 2)},
        {"sequence parallel 2 x DP 2", presets::sequence_parallel(2, 2)},
        {"ZeRO-1 x4", presets::zero(1, 4)},
        {"ZeRO-2 x4", presets::zero(2, 4)},
        {"ZeRO-3 x4", presets::zero(3, 4)},
        {"ZeRO-3 x4, recompute", with(presets::zero(3, 4), presets::recompute(blocks))},
        {"megatron TP 4, recompute", with(presets::megatron(4), presets::recompute(blocks))},
        {"coshard 2 per device x4", presets::coshard(4, 2)},
        {"2 stages of DP 2, 2 micro, 1F1B", presets::pipeline(2, 2, {schedule_kind::one_f_one_b}, presets::data_parallel(2))},
        {"2 stages of DP 2, 4 micro, 1F1B", presets::pipeline(2, 4, {schedule_kind::one_f_one_b}, presets::data_parallel(2))},
        {"2 stages of TP 2, 4 micro, GPipe", presets::pipeline(2, 4, {schedule_kind::gpipe}, presets::megatron(2))},
        {"2 stages of TP 2, 8 micro, 1F1B", presets::pipeline(2, 8, {schedule_kind::one_f_one_b}, presets::megatron(2))},
        {"2 stages of ZeRO-1 x2, 4 micro", presets::pipeline(2, 4, {schedule_kind::one_f_one_b}, presets::zero(1, 2))},
        {"4 stages, 1 micro", presets::pipeline(4, 1)},
        {"4 stages, 4 micro, 1F1B", presets::pipeline(4, 4)},
        {"4 stages, 8 micro, GPipe", presets::pipeline(4, 8, {schedule_kind::gpipe})},
        {"4 stages, 8 micro, interleaved 2", presets::pipeline(4, 8, {schedule_kind::interleaved, 2})},
        {"4 stages, 16 micro, 1F1B", presets::pipeline(4, 16)},
    };
}

struct measured {
    double step = 0;              // median over steps of the slowest rank
    double arena = 0, bound = 0;  // rank 0's allocation
    std::vector<host::instruction_trace> traces;  // the last step, per rank (when asked)
};

// One rank's part: warm-up and timed steps of `pg` on communicator `comm`; the seconds of
// each timed step, and rank 0's allocation into m.
std::vector<double> rank_steps(const partition::partitioned_graph& pg, comm::communicator& comm,
                               const models::gpt_config& config, int warmup, int steps, host::instruction_trace* trace,
                               measured& m) {
    const std::vector<std::int32_t> tokens = train::byte_tokenizer{}.encode(train::make_corpus());
    train::data_loader data(tokens, {.batch = config.batch, .seq = config.seq, .seed = 1});
    const std::vector<std::int32_t> positions = models::gpt_positions(config);
    train::distributed_trainer<float> rank(pg, comm, {});
    std::vector<double> seconds;
    for (int step = 0; step < warmup + steps; ++step) {
        const train::batch b = data.next();
        train::input_feed feed;
        feed.index["tokens"] = b.inputs;
        feed.index["targets"] = b.targets;
        feed.index["positions"] = positions;
        const bool last = step == warmup + steps - 1;
        if (last && trace) trace->origin = std::chrono::steady_clock::now();
        const train::step_result res = rank.step(feed, last ? trace : nullptr);
        if (step >= warmup) seconds.push_back(res.seconds);
    }
    if (comm.rank() == 0) {
        m.arena = static_cast<double>(rank.compiled().arena_bytes);
        for (tensor_id t : rank.compiled().bound) m.bound += static_cast<double>(rank.compiled().bytes_of(t));
    }
    return seconds;
}

double median_of_slowest(const std::vector<std::vector<double>>& seconds, int steps) {
    std::vector<double> slowest(static_cast<std::size_t>(steps), 0.0);
    for (const auto& per_rank : seconds)
        for (std::size_t s = 0; s < per_rank.size() && s < slowest.size(); ++s)
            slowest[s] = std::max(slowest[s], per_rank[s]);
    return median(slowest);
}

// All ranks as threads of this process.
measured train_in_process(const partition::partitioned_graph& pg, const models::gpt_config& config, int warmup,
                          int steps, bool trace) {
    measured m;
    m.traces.resize(static_cast<std::size_t>(pg.world));
    std::vector<std::vector<double>> seconds(static_cast<std::size_t>(pg.world));
    comm::run_ranks(pg.world, [&](comm::communicator& comm) {
        const auto r = static_cast<std::size_t>(comm.rank());
        seconds[r] = rank_steps(pg, comm, config, warmup, steps, trace ? &m.traces[r] : nullptr, m);
    });
    m.step = median_of_slowest(seconds, steps);
    return m;
}

#if LOOM_FIDELITY_MPI
// Every process's calibration (search::calibrate_host_ops_shared): rank 0's op costs
// alone, the slowest process's steps with all of them at once.
search::host_op_costs calibrate_all_ranks(comm::mpi_communicator& world, int ranks, int me) {
    if (me == 0) std::printf("timing the calibration steps of %d processes, alone and at once...\n", ranks);
    return search::calibrate_host_ops_shared(world, comm::group::world(ranks));
}

// Every process's trace of the traced step, gathered on every process. The processes share
// one machine, so their steady clocks share one origin (CLOCK_MONOTONIC): each entry is
// shifted onto rank 0's origin.
std::vector<host::instruction_trace> gather_traces(comm::mpi_communicator& world, int ranks,
                                                   const host::instruction_trace& mine) {
    const comm::group everyone = comm::group::world(ranks);
    double count = static_cast<double>(mine.entries.size());
    std::vector<double> counts(static_cast<std::size_t>(ranks));
    world.all_gather(&count, counts.data(), 1, comm::dtype::f64, everyone);
    const auto most = static_cast<std::size_t>(*std::max_element(counts.begin(), counts.end()));
    // (node, start, end) per entry, starts and ends in seconds since the clock's epoch.
    const double origin = std::chrono::duration<double>(mine.origin.time_since_epoch()).count();
    std::vector<double> packed(3 * most, 0.0), all(3 * most * static_cast<std::size_t>(ranks));
    for (std::size_t i = 0; i < mine.entries.size(); ++i) {
        packed[3 * i] = static_cast<double>(mine.entries[i].node);
        packed[3 * i + 1] = origin + mine.entries[i].start;
        packed[3 * i + 2] = origin + mine.entries[i].end;
    }
    world.all_gather(packed.data(), all.data(), packed.size(), comm::dtype::f64, everyone);
    std::vector<host::instruction_trace> traces(static_cast<std::size_t>(ranks));
    for (int r = 0; r < ranks; ++r) {
        host::instruction_trace& t = traces[static_cast<std::size_t>(r)];
        t.origin = mine.origin;
        const double* from = all.data() + 3 * most * static_cast<std::size_t>(r);
        for (std::size_t i = 0; i < static_cast<std::size_t>(counts[static_cast<std::size_t>(r)]); ++i)
            t.entries.push_back({static_cast<node_id>(from[3 * i]), from[3 * i + 1] - origin, from[3 * i + 2] - origin});
    }
    return traces;
}
#endif

// Chrome trace events: `measured` (pid 0..world-1) and `predicted` (pid world..2 world-1).
nlohmann::json trace_json(const partition::partitioned_graph& pg, const std::vector<host::instruction_trace>& measured,
                          const search::program_price& predicted) {
    nlohmann::json events = nlohmann::json::array();
    const int world = pg.world;
    for (int r = 0; r < world; ++r) {
        events.push_back({{"ph", "M"}, {"name", "process_name"}, {"pid", r}, {"args", {{"name", "measured rank " + std::to_string(r)}}}});
        events.push_back({{"ph", "M"}, {"name", "process_name"}, {"pid", world + r},
                          {"args", {{"name", "predicted rank " + std::to_string(r)}}}});
    }
    // Measured ranks share one origin: the earliest start of the traced step.
    double origin = 1e300;
    for (const auto& t : measured)
        for (const auto& e : t.entries) origin = std::min(origin, e.start + std::chrono::duration<double>(t.origin - measured.front().origin).count());
    for (int r = 0; r < world; ++r) {
        const auto& t = measured[static_cast<std::size_t>(r)];
        const graph& g = pg.devices[static_cast<std::size_t>(r)].ir();
        const double shift = std::chrono::duration<double>(t.origin - measured.front().origin).count() - origin;
        for (const auto& e : t.entries) {
            const node& n = g.at(e.node);
            const bool comm = n.attrs.has("transfer");
            events.push_back({{"ph", "X"}, {"name", n.name}, {"pid", r}, {"tid", comm ? 1 : 0},
                              {"ts", (e.start + shift) * 1e6}, {"dur", (e.end - e.start) * 1e6}});
        }
    }
    for (const auto& e : predicted.timeline) {
        const graph& g = pg.devices[static_cast<std::size_t>(e.device)].ir();
        events.push_back({{"ph", "X"}, {"name", g.at(e.node).name}, {"pid", world + e.device},
                          {"tid", e.communication ? 1 : 0}, {"ts", e.start * 1e6}, {"dur", (e.end - e.start) * 1e6}});
    }
    return {{"traceEvents", events}, {"displayTimeUnit", "ms"}};
}

}  // namespace

int main(int argc, char** argv) {
    bool mpi = false;
    for (int a = 1; a < argc; ++a) mpi = mpi || std::string(argv[a]) == "--mpi";
#if LOOM_FIDELITY_MPI
    std::optional<comm::mpi_environment> environment;
    if (mpi) environment.emplace(argc, argv);
#endif
    CLI::App app{"Predicted against measured step time and memory of ~20 plans on 4 ranks"};
    int steps = 10, warmup = 2, rounds = 3;
    models::gpt_config config{.layers = 8, .hidden = 128, .heads = 8, .vocab = 256, .seq = 64, .batch = 16};
    std::string out, trace_out, traced = "4 stages, 4 micro, 1F1B";
    app.add_option("--steps", steps, "timed steps per plan")->check(CLI::PositiveNumber);
    app.add_option("--warmup", warmup, "untimed steps first")->check(CLI::NonNegativeNumber);
    app.add_option("--rounds", rounds, "rounds over all plans; a plan's step is the fastest of its rounds'")
        ->check(CLI::PositiveNumber);
    app.add_option("--layers", config.layers, "GPT blocks")->check(CLI::PositiveNumber);
    app.add_option("--hidden", config.hidden, "hidden size")->check(CLI::PositiveNumber);
    app.add_option("--seq", config.seq, "sequence length")->check(CLI::PositiveNumber);
    app.add_option("--batch", config.batch, "batch, in sequences")->check(CLI::PositiveNumber);
    app.add_option("--out", out, "the JSON record (default benchmarks/results/fidelity[_mpi].json)");
    app.add_option("--trace", trace_out,
                   "measured and predicted timelines of one plan (Chrome trace JSON; default "
                   "benchmarks/results/fidelity[_mpi]_trace.json, \"\" for none)");
    app.add_option("--trace-plan", traced, "the plan whose timelines --trace writes");
    std::vector<std::string> only;
    app.add_option("--only", only, "run only the plans of these names (repeat it; the default: all)");
    app.add_flag("--mpi", mpi, "ranks are MPI processes: run under mpirun -np 4");
    CLI11_PARSE(app, argc, argv);
    if (out.empty()) out = mpi ? "benchmarks/results/fidelity_mpi.json" : "benchmarks/results/fidelity.json";
    if (!app.count("--trace"))
        trace_out = mpi ? "benchmarks/results/fidelity_mpi_trace.json" : "benchmarks/results/fidelity_trace.json";
    try {
        const int ranks = 4;
#if LOOM_FIDELITY_MPI
        std::optional<comm::mpi_communicator> world;
        if (mpi) {
            world.emplace();
            if (world->size() != ranks)
                throw usage_error("fidelity --mpi: " + std::to_string(world->size()) + " processes; run it as mpirun -np " +
                                  std::to_string(ranks));
        }
#else
        if (mpi) throw usage_error("fidelity --mpi: this build has no MPI (loom::mpi was not found when it was configured)");
#endif
        const int me = mpi ?
#if LOOM_FIDELITY_MPI
                           world->rank()
#else
                           0
#endif
                           : 0;
        auto model = models::gpt(config);
        // The ranks calibrate where they run, since processes share the cores otherwise
        // than threads sharing one pool: the first rank's op costs alone (the others wait)
        // in blocks that alternate with blocks of every rank at once; under MPI the link
        // between the ranks is measured on them too. Then rank 0 measures the machine's
        // GEMM and copy speed.
        std::optional<search::host_op_costs> op_costs;
        std::optional<search::collective_links> between_ranks;
#if LOOM_FIDELITY_MPI
        if (mpi) {
            op_costs = calibrate_all_ranks(*world, ranks, me);
            between_ranks = search::measure_host_links(*world, comm::group::world(ranks));
        }
#endif
        search::cluster hw;
        search::price_options po;
        nlohmann::json calibration;
        if (me == 0) {
            std::printf("calibrating the host for %d ranks that share its cores...\n", ranks);
            hw = search::calibrate_host(ranks, between_ranks);
            std::vector<search::collective> kinds{search::collective::all_reduce};  // the intra-node link
            for (const auto& [kind, l] : hw.topo.intra_node_by_collective) kinds.push_back(kind);
            for (search::collective kind : kinds)
                std::printf("%-15s between ranks: %.1f us per message, %.2f GB/s (the profile's convention)\n",
                            std::string(search::to_string(kind)).c_str(), hw.topo.intra_link(kind).latency * 1e6,
                            hw.topo.intra_link(kind).bandwidth / 1e9);
            if (!op_costs) op_costs = search::calibrate_host_ops_in_process(ranks);
            std::printf("calibration steps together / alone, per batch:");
            for (std::size_t b = 0; b < op_costs->step_seconds.size(); ++b)
                std::printf(" %ld: %.2f", static_cast<long>(search::host_op_costs::batches[b]),
                            op_costs->steps_together[b] / op_costs->step_seconds[b]);
            std::printf("\n");
            calibration = {{"batches", search::host_op_costs::batches},
                           {"alone_step_s", op_costs->step_seconds},
                           {"together_step_s", op_costs->steps_together}};
            po = search::host_price_options(ranks, op_costs);
            std::printf("%-36s %12s %12s %8s %14s %14s\n", "plan", "predicted", "measured", "ratio", "memory pred",
                        "memory alloc");
        }
#if LOOM_FIDELITY_MPI
        if (mpi) world->barrier(comm::group::world(ranks));
#endif
        std::vector<double> predicted, measured_steps;
        nlohmann::json rows = nlohmann::json::array();
        std::vector<named_plan> plans = plans_on_4();
        for (const std::string& name : only)
            if (std::none_of(plans.begin(), plans.end(), [&](const named_plan& p) { return p.name == name; }))
                throw usage_error("fidelity --only: no plan named '" + name + "'; give one of the names it prints");
        if (!only.empty())
            std::erase_if(plans, [&](const named_plan& p) { return std::find(only.begin(), only.end(), p.name) == only.end(); });
        if (!trace_out.empty() && std::none_of(plans.begin(), plans.end(), [&](const named_plan& p) { return p.name == traced; }))
            throw usage_error("fidelity --trace-plan: no plan named '" + traced + "'; give one of the names it prints");
        if (trace_out.empty()) traced.clear();
        nlohmann::json trace;
        // Rounds: every plan once per round, in turn, so that a drift of the machine's speed
        // (this VM's moves by 10% within minutes) falls on every plan alike; a plan's
        // measured step is the fastest of its rounds'. What else the machine runs only adds
        // time (on a 2-vCPU VM one plan's rounds spread by up to 37%), and the calibration
        // takes the fastest of its blocks in the same way, so both state the quiet machine.
        std::vector<partition::partitioned_graph> graphs;
        for (const auto& named : plans) graphs.push_back(partition::apply_plan(model.ir(), named.plan));
        std::vector<std::vector<double>> by_round(plans.size());
        std::vector<measured> last(plans.size());
        for (int round = 0; round < rounds; ++round) {
            if (me == 0 && rounds > 1) std::printf("round %d of %d...\n", round + 1, rounds);
            for (std::size_t i = 0; i < plans.size(); ++i) {
                const std::string& name = plans[i].name;
                const partition::partitioned_graph& pg = graphs[i];
                const bool tracing = name == traced && round == rounds - 1;
                measured m;
                if (!mpi) {
                    m = train_in_process(pg, config, warmup, steps, tracing);
                } else {
#if LOOM_FIDELITY_MPI
                    host::instruction_trace my_trace;
                    const std::vector<double> mine =
                        rank_steps(pg, *world, config, warmup, steps, tracing ? &my_trace : nullptr, m);
                    if (tracing) m.traces = gather_traces(*world, ranks, my_trace);
                    std::vector<double> all(mine.size() * static_cast<std::size_t>(ranks));
                    world->all_gather(mine.data(), all.data(), mine.size(), comm::dtype::f64, comm::group::world(ranks));
                    std::vector<std::vector<double>> seconds(static_cast<std::size_t>(ranks));
                    for (int r = 0; r < ranks; ++r)
                        seconds[static_cast<std::size_t>(r)].assign(all.begin() + r * steps, all.begin() + (r + 1) * steps);
                    m.step = median_of_slowest(seconds, steps);
#endif
                }
                by_round[i].push_back(m.step);
                last[i] = std::move(m);
            }
        }
        for (std::size_t i = 0; i < plans.size() && me == 0; ++i) {
            const std::string& name = plans[i].name;
            const partition::partitioned_graph& pg = graphs[i];
            const measured& m = last[i];
            const double step = *std::min_element(by_round[i].begin(), by_round[i].end());
            search::price_options this_po = po;
            this_po.record_timeline = name == traced;
            const search::program_price price = search::price_programs(pg, hw, this_po);
            const double memory_predicted = price.devices[0].memory.arena + price.devices[0].memory.bound;
            const double memory_allocated = m.arena + m.bound;
            std::printf("%-36s %10.2f ms %10.2f ms %8.2f %11.2f MiB %11.2f MiB\n", name.c_str(), price.step_seconds * 1e3,
                        step * 1e3, price.step_seconds / step, memory_predicted / (1 << 20),
                        memory_allocated / (1 << 20));
            std::fflush(stdout);
            predicted.push_back(price.step_seconds);
            measured_steps.push_back(step);
            rows.push_back({{"plan", name},
                            {"predicted_step_s", price.step_seconds},
                            {"measured_step_s", step},
                            {"measured_step_s_per_round", by_round[i]},
                            {"predicted_idle_fraction", price.idle_fraction()},
                            {"predicted_memory_bytes_rank0", memory_predicted},
                            {"allocated_memory_bytes_rank0", memory_allocated},
                            {"predicted_optimizer_bytes_rank0", price.devices[0].memory.optimizer}});
            if (name == traced) trace = trace_json(pg, m.traces, price);
        }
        if (me != 0) return 0;
        const double rho = spearman(predicted, measured_steps);
        const auto best_predicted = std::min_element(predicted.begin(), predicted.end()) - predicted.begin();
        const auto best_measured = std::min_element(measured_steps.begin(), measured_steps.end()) - measured_steps.begin();
        std::printf("Spearman rank correlation: %.3f over %zu plans\n", rho, plans.size());
        std::printf("predicted best: %s; measured best: %s\n", plans[static_cast<std::size_t>(best_predicted)].name.c_str(),
                    plans[static_cast<std::size_t>(best_measured)].name.c_str());

        nlohmann::json record;
        record["benchmark"] = "fidelity";
        record["ranks"] = mpi ? "MPI processes" : "in-process threads";
        record["model"] = {{"layers", config.layers}, {"hidden", config.hidden}, {"heads", config.heads},
                           {"vocab", config.vocab}, {"seq", config.seq}, {"batch", config.batch}};
        record["world"] = ranks;
        record["steps"] = steps;
        record["rounds"] = rounds;
        record["warmup"] = warmup;
        record["profile"] = search::to_json(hw);
        record["calibration"] = calibration;
        record["plans"] = rows;
        record["spearman"] = rho;
        record["predicted_best"] = plans[static_cast<std::size_t>(best_predicted)].name;
        record["measured_best"] = plans[static_cast<std::size_t>(best_measured)].name;
        record["cpu"] = bench::cpu_model();
        record["load_average"] = bench::load_average();
        record["commit"] = bench::git_revision();
        record["date_utc"] = bench::utc_now();
        bench::write_record(record, out);
        if (!trace_out.empty() && !trace.is_null()) {
            bench::write_record(trace, trace_out, -1);
            std::printf("timelines of '%s' written to %s (open in Perfetto)\n", traced.c_str(), trace_out.c_str());
        }
        std::printf("record written to %s\n", out.c_str());
    } catch (const loom::error& e) {
        std::fprintf(stderr, "error: %s\n", e.what());
        return 2;
    }
    return 0;
}
