// How long it takes to turn a large model and a plan into device programs: a 48-layer GPT
// (only the graph is built; nothing runs) partitioned over 64 devices by three plans, with
// the size of what comes out. Writes a JSON record.
//
//   plan_build [--layers 48] [--hidden 1024] [--heads 16] [--devices 64] [--tensor 8]
//              [--plan all|dp|tp|zero3|pipeline] [--out benchmarks/results/plan_build.json]
// Run from the repository root.
//
// Plans (batch 64, so every data-parallel degree divides it):
//   dp     every forward op split along Batch x devices
//   tp     Batch x (devices / tensor) outermost, then Heads or FFN x tensor where the op has
//          such a dim; other ops are replicated x tensor inside each batch slice
//   zero3  dp with parameters sharded over all devices (ZeRO-3)
//   pipeline  8 stages of devices / 8 data-parallel devices each, 8 micro-batches, ZeRO-3
//          within each stage's group and recompute of the MLPs; ordered by 1F1B (the
//          "deadlock s" column then counts the ordering, which ends with the same check)
#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <chrono>
#include <cstdio>
#include <ctime>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include <loom/models/gpt.hpp>
#include <loom/partition/apply.hpp>
#include <loom/partition/deadlock.hpp>
#include <loom/plan/presets.hpp>
#include <loom/runtime/explain_partition.hpp>

#include "support/machine.hpp"
#include "support/record.hpp"

using namespace loom;

namespace {

using clock_type = std::chrono::steady_clock;

double seconds_since(clock_type::time_point start) {
    return std::chrono::duration<double>(clock_type::now() - start).count();
}



plan::resolved_plan data_parallel(const graph& g, int devices) {
    plan::resolved_plan p;
    p.devices = devices;
    p.name = "data parallel x" + std::to_string(devices);
    for (std::size_t i = 0; i < g.nodes.size(); ++i) {
        plan::op_partition op;
        op.splits.push_back({Dim::Batch::id, "", devices});
        p.forward.push_back(op);
    }
    return p;
}

plan::resolved_plan tensor_in_data_parallel(const graph& g, int devices, int tensor) {
    const int batch = devices / tensor;
    plan::resolved_plan p;
    p.devices = devices;
    p.name = "data x" + std::to_string(batch) + " > tensor (heads, FFN) x" + std::to_string(tensor);
    for (const node& n : g.nodes) {
        plan::op_partition op;
        op.splits.push_back({Dim::Batch::id, "", batch});
        for (const auto& v : n.sig.vars)
            if (op.splits.size() == 1 && v.splittable && !v.frozen && (v.dim == Dim::Head::id || v.dim == Dim::FFN::id) &&
                v.extent % tensor == 0)
                op.splits.push_back({v.dim, v.label, tensor});
        if (op.splits.size() == 1) op.replicas = tensor;
        p.forward.push_back(op);
    }
    return p;
}

struct measurement {
    double graph_seconds = 0, apply_seconds = 0, deadlock_seconds = 0;
    std::size_t logical_nodes = 0, pieces = 0, device_nodes = 0, transfers = 0;
    std::map<std::string, std::size_t> transfers_by_kind;
    std::int64_t bytes_sent = 0;  // f32, all members of all transfers
};

measurement summarize(measurement m, const partition::partitioned_graph& pg);

measurement measure(const models::gpt_config& c, const std::string& plan_kind, int devices, int tensor) {
    measurement m;
    auto start = clock_type::now();
    auto model = models::gpt(c);
    const graph& forward = model.ir();
    m.graph_seconds = seconds_since(start);

    if (plan_kind == "pipeline") {
        const int stages = 8, micro = 8, group = devices / stages;
        plan::selector mlp;
        mlp.scope = "*.mlp*";
        plan::plan_spec inner = plan::presets::zero(3, group);
        inner.then(plan::presets::recompute(mlp));
        start = clock_type::now();
        // apply_plan orders the programs by the plan's 1F1B and checks them (deadlock included).
        partition::partitioned_graph pg =
            partition::apply_plan(forward, plan::presets::pipeline(stages, micro, {plan::schedule_kind::one_f_one_b}, inner));
        m.apply_seconds = seconds_since(start);
        start = clock_type::now();
        partition::check_deadlock_free(pg);
        m.deadlock_seconds = seconds_since(start);
        return summarize(m, pg);
    }
    plan::resolved_plan p = plan_kind == "tp" ? tensor_in_data_parallel(forward, devices, tensor) : data_parallel(forward, devices);
    if (plan_kind == "zero3") {
        p.zero = plan::zero_stage::parameters;
        p.name = "ZeRO-3 " + p.name;
    }
    start = clock_type::now();
    partition::partitioned_graph pg = partition::apply_plan(forward, p);
    m.apply_seconds = seconds_since(start);

    start = clock_type::now();
    partition::check_deadlock_free(pg);
    m.deadlock_seconds = seconds_since(start);

    return summarize(m, pg);
}

measurement summarize(measurement m, const partition::partitioned_graph& pg) {
    m.logical_nodes = pg.ir().nodes.size();
    for (const auto& layout : pg.layouts) m.pieces += layout.pieces.size();
    for (const auto& part : pg.devices) m.device_nodes += part.ir().nodes.size();
    m.transfers = pg.transfers.size();
    for (const auto& t : pg.transfers) {
        m.transfers_by_kind[std::string(partition::to_string(t.kind))] += 1;
        m.bytes_sent += partition::bytes_sent(t, precision::f32);
    }
    return m;
}

}  // namespace

int main(int argc, char** argv) {
    CLI::App app{"Plan building time: a large GPT partitioned over many devices"};
    models::gpt_config c{.layers = 48, .hidden = 1024, .heads = 16, .vocab = 50304, .seq = 1024, .batch = 64};
    int devices = 64, tensor = 8;
    std::string which = "all", out = "benchmarks/results/plan_build.json";
    app.add_option("--layers", c.layers, "transformer blocks");
    app.add_option("--hidden", c.hidden, "hidden size (1024 or 2048)");
    app.add_option("--heads", c.heads, "attention heads");
    app.add_option("--devices", devices, "devices the plans partition over");
    app.add_option("--tensor", tensor, "tensor-parallel degree of the tp plan");
    app.add_option("--plan", which, "dp, tp, zero3, pipeline or all")->check(CLI::IsMember({"all", "dp", "tp", "zero3", "pipeline"}));
    app.add_option("--out", out, "JSON file to write");
    CLI11_PARSE(app, argc, argv);
    if (devices < 1 || c.batch % devices != 0) {
        std::fprintf(stderr, "plan_build: --devices %d does not divide the batch %lld; choose a divisor of %lld\n", devices,
                     static_cast<long long>(c.batch), static_cast<long long>(c.batch));
        return 2;
    }
    if (tensor < 1 || devices % tensor != 0) {
        std::fprintf(stderr, "plan_build: --tensor %d does not divide --devices %d; choose a divisor of %d\n", tensor,
                     devices, devices);
        return 2;
    }

    nlohmann::json record;
    std::time_t now = std::time(nullptr);
    char date[32];
    std::strftime(date, sizeof date, "%Y-%m-%d", std::gmtime(&now));
    record["date"] = date;
    record["cpu"] = bench::cpu_model();
    record["commit"] = bench::git_revision();
    record["model"] = {{"layers", c.layers}, {"hidden", c.hidden},  {"heads", c.heads},
                       {"vocab", c.vocab},   {"seq", c.seq},        {"batch", c.batch},
                       {"parameters", c.parameter_count()}};
    record["devices"] = devices;

    std::printf("GPT %lld layers, hidden %lld, %lld parameters; %d devices\n", static_cast<long long>(c.layers),
                static_cast<long long>(c.hidden), static_cast<long long>(c.parameter_count()), devices);
    std::printf("%-8s %9s %8s %10s %8s %9s %10s %10s %10s  %s\n", "plan", "graph ms", "apply s", "deadlock s", "logical",
                "pieces", "dev nodes", "transfers", "sent GiB", "by kind");
    if ((which == "all" || which == "pipeline") && (devices % 8 != 0 || c.layers < 8)) {
        std::fprintf(stderr, "plan_build: the pipeline plan needs --devices divisible by 8 and at least 8 layers\n");
        return 2;
    }
    for (const std::string kind : {"dp", "tp", "zero3", "pipeline"}) {
        if (which != "all" && which != kind) continue;
        const measurement m = measure(c, kind, devices, tensor);
        std::string kinds;
        for (const auto& [k, n] : m.transfers_by_kind) kinds += (kinds.empty() ? "" : ", ") + k + " " + std::to_string(n);
        std::printf("%-8s %9.1f %8.2f %10.2f %8zu %9zu %10zu %10zu %10.2f  %s\n", kind.c_str(), 1e3 * m.graph_seconds,
                    m.apply_seconds, m.deadlock_seconds, m.logical_nodes, m.pieces, m.device_nodes, m.transfers,
                    static_cast<double>(m.bytes_sent) / (1024.0 * 1024.0 * 1024.0), kinds.c_str());
        std::fflush(stdout);
        record["results"].push_back({{"plan", kind},
                                     {"graph_seconds", m.graph_seconds},
                                     {"apply_plan_seconds", m.apply_seconds},
                                     {"check_deadlock_free_seconds", m.deadlock_seconds},
                                     {"logical_nodes", m.logical_nodes},
                                     {"pieces", m.pieces},
                                     {"device_nodes", m.device_nodes},
                                     {"transfers", m.transfers},
                                     {"transfers_by_kind", m.transfers_by_kind},
                                     {"bytes_sent_f32", m.bytes_sent}});
    }
    try {
        bench::write_record(record, out);
    } catch (const std::exception& e) {
        std::fprintf(stderr, "plan_build: %s\n", e.what());
        return 1;
    }
    std::printf("wrote %s\n", out.c_str());
}
