#pragma once
// Hardware profiles for the plan searcher's cost model: what one device computes and holds,
// and how devices, nodes and NICs are wired.
//
//   cluster c = dgx_a100(4);                      32 A100s, 8 per node, 8 HDR NICs per node
//   c.device.peak_flops(precision::bf16)          312e12 (loom::precision, core/precision.hpp)
//   c.topo.inter_node_bandwidth_per_device()      8 * 25e9 / 8 = 25e9 bytes/s
//   save_cluster(c, "a100x4.json");               edit the file after calibrating, then
//   cluster d = load_cluster("a100x4.json");      load it back (a round trip is exact)
//
// Units are SI throughout: bytes, seconds, FLOP/s, bytes/s; a bandwidth is one direction
// of one device's (or one NIC's) link. The JSON keys carry the unit in their names.
#include <cmath>
#include <fstream>
#include <initializer_list>
#include <iterator>
#include <map>
#include <optional>
#include <sstream>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

#include <loom/core/error.hpp>
#include <loom/core/linkage.hpp>
#include <loom/core/precision.hpp>
#include <loom/search/op_rate.hpp>

namespace loom::search {

// A hardware profile that is incomplete or impossible: a missing or negative field, a
// precision the device lacks, a profile file that is not JSON.
struct profile_error : error {
    using error::error;
};

namespace detail {

// Numbers in messages: "1.25e+10", not std::to_string's "12500000000.000000".
inline std::string number_text(double x) {
    std::ostringstream s;
    s << x;
    return s.str();
}

}  // namespace detail

struct device_profile {
    std::string name;
    double peak_flops_f32 = 0;  // FLOP/s without tensor cores
    double peak_flops_f16 = 0;  // FLOP/s on tensor cores, f16 and bf16 alike; 0: the device has none
    double memory_bytes = 0;
    double memory_bandwidth = 0;  // bytes/s
    // Fractions of peak that real kernels reach; guesses until calibration overwrites them.
    double gemm_efficiency = 0.6;
    double elementwise_efficiency = 0.7;
    // What loom's kernels measured per op kind on this device, by storage precision
    // (cuda::calibrate_gpu fills bf16): the price of an instruction of such a kind, where
    // price_options::rates has none for it. Kinds without one are priced from the peaks and
    // efficiencies above.
    std::map<loom::precision, op_rates> rates;

    // bf16 shares the f16 figure because the tensor cores of A100 and H100 run both at one
    // rate. V100 has no bf16 tensor cores, so for V100 this figure is optimistic for bf16.
    // The profile keeps no f64 peak: plan in f32, f16 or bf16.
    double peak_flops(precision p) const {
        if (p == precision::f64)
            throw profile_error("device_profile::peak_flops: device '" + name +
                                "': profiles hold no f64 peak; plan in f32, f16 or bf16");
        const bool f32 = p == precision::f32;
        const double peak = f32 ? peak_flops_f32 : peak_flops_f16;
        if (!(peak > 0))
            throw profile_error("device_profile::peak_flops: device '" + name + "' has no " +
                                std::string(to_string(p)) + " peak (" + (f32 ? "peak_flops_f32" : "peak_flops_f16") +
                                " = " + detail::number_text(peak) + "); set it in the profile (" +
                                (f32 ? "peak_flops_fp32_per_s" : "peak_flops_fp16_per_s") +
                                " in its JSON) or plan in another precision");
        return peak;
    }

    friend bool operator==(const device_profile&, const device_profile&) = default;
};

struct link {
    double bandwidth = 0;  // bytes/s, one direction, per device (per NIC for inter_node_per_nic)
    double latency = 0;    // s, per message

    friend bool operator==(const link&, const link&) = default;
};

enum class collective { all_reduce, all_gather, reduce_scatter, all_to_all, broadcast, send_recv };

LOOM_INLINE std::string_view to_string(collective c);

struct topology {
    int devices_per_node = 1;
    int nodes = 1;
    link intra_node;
    link inter_node_per_nic;
    int nics_per_node = 1;
    // Links inside a node measured per collective, where a collective's cost differs from
    // the one intra_node states (ranks on one host: an all-gather copies, an all-reduce
    // adds too; search::calibrate_host measures each); the others run at intra_node.
    std::map<collective, link> intra_node_by_collective;

    const link& intra_link(collective k) const {
        const auto it = intra_node_by_collective.find(k);
        return it == intra_node_by_collective.end() ? intra_node : it->second;
    }

    int devices() const { return devices_per_node * nodes; }
    // The share of the node's NICs each device gets when every device of the node sends at once.
    double inter_node_bandwidth_per_device() const {
        return nics_per_node * inter_node_per_nic.bandwidth / devices_per_node;
    }

    friend bool operator==(const topology&, const topology&) = default;
};

struct cluster {
    std::string name;
    device_profile device;
    topology topo;

    int devices() const { return topo.devices(); }

    friend bool operator==(const cluster&, const cluster&) = default;
};

// ---- presets -------------------------------------------------------------------------
// Figures from the vendors' public datasheets. Tensor-core peaks are dense (no 2:4
// sparsity). Memory sizes are the binary sizes of the HBM stacks (32 GB = 32 GiB).
// A bandwidth is per direction: NVIDIA quotes NVLink as the bidirectional total over all of
// a GPU's links, so 300 GB/s becomes 150e9 bytes/s. InfiniBand is quoted per direction in
// bits: EDR 100 Gb/s = 12.5e9, HDR 200 Gb/s = 25e9, NDR 400 Gb/s = 50e9 bytes/s.
// The latencies are assumptions, not datasheet figures: about what one NCCL ring step costs
// within a node (5 us) and across InfiniBand (10 us). Calibration should overwrite them.
namespace detail {

inline constexpr double gib = 1024.0 * 1024.0 * 1024.0;
inline constexpr double intra_node_latency = 5e-6;
inline constexpr double inter_node_latency = 10e-6;

LOOM_INLINE void check_preset(std::string_view preset, int nodes, int nics_per_node);

inline std::string preset_name(std::string_view machine, int nodes) {
    return std::string(machine) + " x" + std::to_string(nodes);
}

LOOM_INLINE device_profile v100_sxm2_32gb();

}  // namespace detail

// DGX-1 with V100: 8 GPUs per node. Each V100 has 6 NVLink2 links of 25 GB/s per direction
// (150e9 bytes/s, the datasheet's "300 GB/s"); in the hybrid cube-mesh not every pair is
// linked, so rings reach somewhat less, which calibration corrects. The machine has 4 EDR
// NICs; the NIC count is a parameter so that 1 and 8 NICs per node can be studied.
LOOM_INLINE cluster dgx1_v100(int nodes, int nics_per_node = 1);

// DGX-2: 16 V100 32GB behind NVSwitch, 300 GB/s bidirectional per GPU to any other GPU
// (150e9 per direction), and 8 EDR InfiniBand NICs per node.
LOOM_INLINE cluster dgx2_v100(int nodes);

// DGX A100 80GB: A100 SXM datasheet 19.5 TFLOP/s f32, 312 TFLOP/s bf16/f16 tensor,
// 2039 GB/s HBM2e; NVLink3 600 GB/s bidirectional (300e9 per direction) through NVSwitch;
// 8 HDR 200 Gb/s NICs for the compute fabric.
LOOM_INLINE cluster dgx_a100(int nodes);

// DGX H100: H100 SXM5 datasheet 67 TFLOP/s f32, 989 TFLOP/s bf16/f16 tensor (dense),
// 3.35 TB/s HBM3; NVLink4 900 GB/s bidirectional (450e9 per direction) through NVSwitch;
// 8 ConnectX-7 NDR 400 Gb/s NICs for the compute fabric.
LOOM_INLINE cluster dgx_h100(int nodes);

// ---- JSON ----------------------------------------------------------------------------
// {
//   "name": "DGX A100 x2",
//   "device": {"name": "A100-SXM4-80GB", "peak_flops_fp32_per_s": 1.95e13,
//              "peak_flops_fp16_per_s": 3.12e14, "memory_bytes": 85899345920,
//              "memory_bandwidth_bytes_per_s": 2.039e12,
//              "gemm_efficiency": 0.6, "elementwise_efficiency": 0.7,     (both optional)
//              "op_rates": {"bf16": {"linear": {"per_flop": true,         (optional)
//                                               "points": [[1e9, 2e-6], [8e9, 1.2e-5]]}}}},
//   "topology": {"devices_per_node": 8, "nodes": 2, "nics_per_node": 8,
//                "intra_node": {"bandwidth_bytes_per_s": 3e11, "latency_s": 5e-06},
//                "inter_node_per_nic": {"bandwidth_bytes_per_s": 2.5e10, "latency_s": 1e-05},
//                "intra_node_by_collective": {"all_gather": {...}, "send_recv": {...}}}  (optional)
// }
// The peaks are device_profile::peak_flops_f32 and peak_flops_f16; their keys keep the
// spelling of the profile files already written (fp32, fp16).
// Every field is required except the two efficiencies, the rates per op kind (by precision:
// f32, f16, bf16; points [units, seconds] by increasing units) and the links per collective
// (keys: all_reduce, all_gather, reduce_scatter, all_to_all, broadcast, send_recv). Peaks and
// latencies may be 0 (a device without tensor cores, an idealised link); every other
// number must be positive.
// Unknown keys are rejected so that a misspelt optional key does not go unnoticed.

inline nlohmann::json to_json(const link& l) {
    return {{"bandwidth_bytes_per_s", l.bandwidth}, {"latency_s", l.latency}};
}

LOOM_INLINE nlohmann::json to_json(const cluster& c);

namespace detail {

// Reads one JSON object and names every problem by its path from the root, e.g.
// "load_cluster: a100.json: topology.inter_node_per_nic.bandwidth_bytes_per_s is -1; ...".
class profile_reader {
public:
    profile_reader(const nlohmann::json& object, std::string where, std::string path)
        : object_(object), where_(std::move(where)), path_(std::move(path)) {
        if (!object_.is_object())
            fail(path_.empty() ? "the profile" : path_, "is not a JSON object", "write it as {...}");
    }

    profile_reader child(const std::string& key) const { return {required(key), where_, full(key)}; }

    std::string text(const std::string& key) const {
        const nlohmann::json& v = required(key);
        if (!v.is_string()) fail(full(key), "is " + v.dump() + ", not a string", "write it in double quotes");
        return v.get<std::string>();
    }

    // `unit` says what the number measures, for the fix: "bytes per second (per direction)".
    double number(const std::string& key, const std::string& unit, bool zero_allowed = false) const {
        return checked_number(key, required(key), unit, zero_allowed);
    }

    double number_or(const std::string& key, double fallback, const std::string& unit) const {
        const auto it = object_.find(key);
        return it == object_.end() ? fallback : checked_number(key, *it, unit, false);
    }

    int count(const std::string& key, const std::string& what) const {
        const nlohmann::json& v = required(key);
        if (!v.is_number_integer() || v.get<long long>() < 1 || v.get<long long>() > 1'000'000)
            fail(full(key), "is " + v.dump(), "give the number of " + what + " as a whole number of at least 1");
        return v.get<int>();
    }

    void only(std::initializer_list<std::string_view> keys) const {
        for (const auto& [key, value] : object_.items()) {
            bool known = false;
            for (std::string_view k : keys) known = known || k == key;
            if (known) continue;
            std::string expected;
            for (std::string_view k : keys) expected += (expected.empty() ? "" : ", ") + std::string(k);
            fail(full(key), "is not a known field",
                 "remove it or correct its spelling; the fields here are " + expected);
        }
    }

private:
    const nlohmann::json& object_;
    std::string where_;
    std::string path_;

    std::string full(const std::string& key) const { return path_.empty() ? key : path_ + "." + key; }

    [[noreturn]] void fail(const std::string& field, const std::string& problem, const std::string& fix) const {
        throw profile_error(where_ + ": " + field + " " + problem + "; " + fix);
    }

    const nlohmann::json& required(const std::string& key) const {
        const auto it = object_.find(key);
        if (it == object_.end()) fail(full(key), "is missing", "add it (see loom/search/hardware.hpp for the format)");
        return *it;
    }

    double checked_number(const std::string& key, const nlohmann::json& v, const std::string& unit,
                          bool zero_allowed) const {
        const std::string fix =
            "give a " + std::string(zero_allowed ? "non-negative" : "positive") + " number of " + unit;
        if (!v.is_number()) fail(full(key), "is " + v.dump() + ", not a number", fix);
        const double x = v.get<double>();
        if (!std::isfinite(x) || x < 0 || (x == 0 && !zero_allowed)) fail(full(key), "is " + number_text(x), fix);
        return x;
    }
};

inline link link_from_json(const profile_reader& r) {
    r.only({"bandwidth_bytes_per_s", "latency_s"});
    return {.bandwidth = r.number("bandwidth_bytes_per_s", "bytes per second, one direction"),
            .latency = r.number("latency_s", "seconds", true)};
}

LOOM_INLINE cluster cluster_from_json(const nlohmann::json& j, const std::string& where);

}  // namespace detail

inline cluster cluster_from_json(const nlohmann::json& j) { return detail::cluster_from_json(j, "cluster_from_json"); }

LOOM_INLINE cluster load_cluster(const std::string& path);

LOOM_INLINE void save_cluster(const cluster& c, const std::string& path);

}  // namespace loom::search

// Definitions: compiled here (header-only) or once in loom::compiled (core/linkage.hpp).
#if LOOM_HEADER_DEFINITIONS

namespace loom::search::detail {

LOOM_INLINE void check_preset(std::string_view preset, int nodes, int nics_per_node) {
    if (nodes < 1)
        throw profile_error(std::string(preset) + ": nodes is " + std::to_string(nodes) + "; give at least 1 node");
    if (nics_per_node < 1)
        throw profile_error(std::string(preset) + ": nics_per_node is " + std::to_string(nics_per_node) +
                            "; give at least 1 NIC per node");
}

LOOM_INLINE device_profile v100_sxm2_32gb() {
    // V100 SXM2 datasheet: 15.7 TFLOP/s f32, 125 TFLOP/s tensor (f16), 900 GB/s HBM2.
    return {.name = "V100-SXM2-32GB",
            .peak_flops_f32 = 15.7e12,
            .peak_flops_f16 = 125e12,
            .memory_bytes = 32 * gib,
            .memory_bandwidth = 900e9};
}
}  // namespace loom::search::detail

namespace loom::search {

LOOM_INLINE std::string_view to_string(collective c) {
    switch (c) {
        case collective::all_reduce: return "all_reduce";
        case collective::all_gather: return "all_gather";
        case collective::reduce_scatter: return "reduce_scatter";
        case collective::all_to_all: return "all_to_all";
        case collective::broadcast: return "broadcast";
        case collective::send_recv: return "send_recv";
    }
    return "?";
}

LOOM_INLINE cluster dgx1_v100(int nodes, int nics_per_node) {
    detail::check_preset("dgx1_v100", nodes, nics_per_node);
    return {.name = detail::preset_name("DGX-1 V100", nodes) + ", " + std::to_string(nics_per_node) +
                    (nics_per_node == 1 ? " NIC" : " NICs") + " per node",
            .device = detail::v100_sxm2_32gb(),
            .topo = {.devices_per_node = 8,
                     .nodes = nodes,
                     .intra_node = {150e9, detail::intra_node_latency},
                     .inter_node_per_nic = {12.5e9, detail::inter_node_latency},
                     .nics_per_node = nics_per_node}};
}

LOOM_INLINE cluster dgx2_v100(int nodes) {
    detail::check_preset("dgx2_v100", nodes, 8);
    return {.name = detail::preset_name("DGX-2 V100", nodes),
            .device = detail::v100_sxm2_32gb(),
            .topo = {.devices_per_node = 16,
                     .nodes = nodes,
                     .intra_node = {150e9, detail::intra_node_latency},
                     .inter_node_per_nic = {12.5e9, detail::inter_node_latency},
                     .nics_per_node = 8}};
}

LOOM_INLINE cluster dgx_a100(int nodes) {
    detail::check_preset("dgx_a100", nodes, 8);
    return {.name = detail::preset_name("DGX A100", nodes),
            .device = {.name = "A100-SXM4-80GB",
                       .peak_flops_f32 = 19.5e12,
                       .peak_flops_f16 = 312e12,
                       .memory_bytes = 80 * detail::gib,
                       .memory_bandwidth = 2039e9},
            .topo = {.devices_per_node = 8,
                     .nodes = nodes,
                     .intra_node = {300e9, detail::intra_node_latency},
                     .inter_node_per_nic = {25e9, detail::inter_node_latency},
                     .nics_per_node = 8}};
}

LOOM_INLINE cluster dgx_h100(int nodes) {
    detail::check_preset("dgx_h100", nodes, 8);
    return {.name = detail::preset_name("DGX H100", nodes),
            .device = {.name = "H100-SXM5-80GB",
                       .peak_flops_f32 = 67e12,
                       .peak_flops_f16 = 989e12,
                       .memory_bytes = 80 * detail::gib,
                       .memory_bandwidth = 3.35e12},
            .topo = {.devices_per_node = 8,
                     .nodes = nodes,
                     .intra_node = {450e9, detail::intra_node_latency},
                     .inter_node_per_nic = {50e9, detail::inter_node_latency},
                     .nics_per_node = 8}};
}

LOOM_INLINE nlohmann::json to_json(const cluster& c) {
    const device_profile& d = c.device;
    const topology& t = c.topo;
    nlohmann::json out = {{"name", c.name},
            {"device",
             {{"name", d.name},
              {"peak_flops_fp32_per_s", d.peak_flops_f32},
              {"peak_flops_fp16_per_s", d.peak_flops_f16},
              {"memory_bytes", d.memory_bytes},
              {"memory_bandwidth_bytes_per_s", d.memory_bandwidth},
              {"gemm_efficiency", d.gemm_efficiency},
              {"elementwise_efficiency", d.elementwise_efficiency}}},
            {"topology",
             {{"devices_per_node", t.devices_per_node},
              {"nodes", t.nodes},
              {"nics_per_node", t.nics_per_node},
              {"intra_node", to_json(t.intra_node)},
              {"inter_node_per_nic", to_json(t.inter_node_per_nic)}}}};
    for (const auto& [p, by_kind] : d.rates)
        for (const auto& [kind, r] : by_kind)
            out["device"]["op_rates"][std::string(to_string(p))][kind] = {{"per_flop", r.per_flop}, {"points", r.points}};
    if (!t.intra_node_by_collective.empty()) {
        nlohmann::json& by = out["topology"]["intra_node_by_collective"];
        for (const auto& [kind, l] : t.intra_node_by_collective) by[std::string(to_string(kind))] = to_json(l);
    }
    return out;
}
}  // namespace loom::search

namespace loom::search::detail {

// device.op_rates: {"bf16": {"<op kind>": {"per_flop": true, "points": [[units, seconds], ...]}}},
// points by increasing units, each units > 0 and seconds >= 0.
LOOM_INLINE std::map<loom::precision, op_rates> op_rates_from_json(const nlohmann::json& j, const std::string& where) {
    auto fail = [&](const std::string& field, const std::string& problem, const std::string& fix) {
        throw profile_error(where + ": device.op_rates" + field + " " + problem + "; " + fix);
    };
    if (!j.is_object()) fail("", "is not a JSON object", "write it as {\"bf16\": {\"<op kind>\": {...}}}");
    std::map<loom::precision, op_rates> out;
    for (const auto& [name, kinds] : j.items()) {
        std::optional<loom::precision> p;
        for (loom::precision q : {loom::precision::f32, loom::precision::f16, loom::precision::bf16})
            if (to_string(q) == name) p = q;
        if (!p) fail("." + name, "is not a precision", "name f32, f16 or bf16");
        if (!kinds.is_object()) fail("." + name, "is not a JSON object", "map op kinds to their rates");
        for (const auto& [kind, rate] : kinds.items()) {
            const std::string field = "." + name + "." + kind;
            if (!rate.is_object() || !rate.contains("per_flop") || !rate.contains("points") || rate.size() != 2 ||
                !rate.at("per_flop").is_boolean() || !rate.at("points").is_array() || rate.at("points").empty())
                fail(field, "is " + rate.dump(), "give {\"per_flop\": true or false, \"points\": [[units, seconds], ...]}");
            op_rate r;
            r.per_flop = rate.at("per_flop").get<bool>();
            for (const auto& point : rate.at("points")) {
                const bool pair = point.is_array() && point.size() == 2 && point[0].is_number() && point[1].is_number();
                const double units = pair ? point[0].get<double>() : 0, seconds = pair ? point[1].get<double>() : -1;
                if (!(units > 0) || !(seconds >= 0) || !std::isfinite(units) || !std::isfinite(seconds) ||
                    (!r.points.empty() && units <= r.points.back().first))
                    fail(field + ".points", "has the point " + point.dump(),
                         "give [units, seconds] with units > 0 and increasing, seconds >= 0");
                r.points.push_back({units, seconds});
            }
            out[*p][kind] = std::move(r);
        }
    }
    return out;
}

LOOM_INLINE cluster cluster_from_json(const nlohmann::json& j, const std::string& where) {
    const profile_reader root(j, where, "");
    root.only({"name", "device", "topology"});
    const profile_reader d = root.child("device");
    d.only({"name", "peak_flops_fp32_per_s", "peak_flops_fp16_per_s", "memory_bytes", "memory_bandwidth_bytes_per_s",
            "gemm_efficiency", "elementwise_efficiency", "op_rates"});
    const profile_reader t = root.child("topology");
    t.only({"devices_per_node", "nodes", "nics_per_node", "intra_node", "inter_node_per_nic", "intra_node_by_collective"});
    cluster c{.name = root.text("name"),
              .device = {.name = d.text("name"),
                         .peak_flops_f32 = d.number("peak_flops_fp32_per_s", "FLOP/s", true),
                         .peak_flops_f16 = d.number("peak_flops_fp16_per_s", "FLOP/s (0 if none)", true),
                         .memory_bytes = d.number("memory_bytes", "bytes"),
                         .memory_bandwidth = d.number("memory_bandwidth_bytes_per_s", "bytes per second"),
                         .gemm_efficiency = d.number_or("gemm_efficiency", device_profile{}.gemm_efficiency,
                                                        "the fraction of peak reached, e.g. 0.6"),
                         .elementwise_efficiency =
                             d.number_or("elementwise_efficiency", device_profile{}.elementwise_efficiency,
                                         "the fraction of peak reached, e.g. 0.7")},
              .topo = {.devices_per_node = t.count("devices_per_node", "devices in a node"),
                       .nodes = t.count("nodes", "nodes"),
                       .intra_node = link_from_json(t.child("intra_node")),
                       .inter_node_per_nic = link_from_json(t.child("inter_node_per_nic")),
                       .nics_per_node = t.count("nics_per_node", "NICs in a node")}};
    if (j.at("device").contains("op_rates")) c.device.rates = op_rates_from_json(j.at("device").at("op_rates"), where);
    if (j.at("topology").contains("intra_node_by_collective")) {
        const profile_reader by = t.child("intra_node_by_collective");
        const collective kinds[] = {collective::all_reduce, collective::all_gather, collective::reduce_scatter,
                                    collective::all_to_all, collective::broadcast, collective::send_recv};
        by.only({"all_reduce", "all_gather", "reduce_scatter", "all_to_all", "broadcast", "send_recv"});
        for (collective kind : kinds)
            if (j.at("topology").at("intra_node_by_collective").contains(std::string(to_string(kind))))
                c.topo.intra_node_by_collective[kind] = link_from_json(by.child(std::string(to_string(kind))));
    }
    return c;
}
}  // namespace loom::search::detail

namespace loom::search {

LOOM_INLINE cluster load_cluster(const std::string& path) {
    std::ifstream file(path);
    if (!file)
        throw profile_error("load_cluster: cannot open '" + path +
                            "'; check the path (save_cluster writes such files)");
    const std::string where = "load_cluster: " + path;
    nlohmann::json j;
    try {
        j = nlohmann::json::parse(std::string(std::istreambuf_iterator<char>(file), {}));
    } catch (const nlohmann::json::parse_error& e) {
        throw profile_error(where + " is not valid JSON (" + e.what() +
                            "); write a cluster profile as save_cluster does (format in loom/search/hardware.hpp)");
    }
    return detail::cluster_from_json(j, where);
}

LOOM_INLINE void save_cluster(const cluster& c, const std::string& path) {
    std::ofstream file(path);
    file << to_json(c).dump(2) << '\n';
    file.close();
    if (!file)
        throw profile_error("save_cluster: cannot write '" + path + "'; check that its folder exists and is writable");
}

}  // namespace loom::search
#endif  // LOOM_HEADER_DEFINITIONS
