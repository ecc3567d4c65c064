#pragma once
// The CUDA launchers of the ops that partitioned plans put into device programs: assemble
// (ops/assemble.hpp: a local chunk, concat or sum of pieces), identity (ZeRO's split points)
// and the vocabulary-parallel cross-entropy (ops/vocab_parallel_cross_entropy.hpp, Megatron's
// LM head). Like the entries of op_kernels.hpp, each reads the node's shapes and attributes
// exactly as the op's host kernel does; the table there lists them.
//
// In bf16 programs some real tensors are stored in float: the outputs ops mark float_outputs
// (the loss, the per-chunk log-sum-exps) and the partitioner's copies of them (marked
// "keeps_float"). Assemble and identity move whatever element size the program gives each
// tensor (runtime/program.hpp, storage_precision); the other kernels read their float
// tensors as float. Each op's check, run when the executor is built, refuses a program that
// stores a tensor otherwise than its kernel reads it.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <string>
#include <type_traits>
#include <vector>

#include <loom/core/bfloat16.hpp>
#include <loom/core/error.hpp>
#include <loom/partition/region_copy.hpp>
#include <loom/runtime/cuda/device.hpp>
#include <loom/runtime/cuda/elementwise.hpp>
#include <loom/runtime/cuda/region_copy.hpp>
#include <loom/runtime/cuda/vocab_parallel_cross_entropy.hpp>
#include <loom/runtime/host/kernel_call.hpp>
#include <loom/runtime/program.hpp>

namespace loom::cuda {

struct launch_context;  // op_kernels.hpp: the launchers below take it as their default Context

namespace op_kernels {

template <class T>
inline constexpr precision program_precision = std::is_same_v<T, float> ? precision::f32 : precision::bf16;

// Bytes per element of tensor t in a program of element type T: 4 for token ids, else those
// of the precision the program stores it in.
template <class T>
std::size_t stored_bytes(const graph& g, tensor_id t) {
    if (g.tensor(t).kind == value_kind::index) return sizeof(std::int32_t);
    return real_bytes(storage_precision(g, t, program_precision<T>));
}

inline std::string stored_name(std::size_t bytes, value_kind kind) {
    if (kind == value_kind::index) return "int32";
    return bytes == 2 ? "bf16" : bytes == 4 ? "float" : std::to_string(bytes) + "-byte elements";
}

// Refuses a program that stores the node's tensors otherwise than the kernel reads them:
// `inputs` and `outputs` give the bytes per element the kernel expects, in order.
template <class T>
void expect_stored(const host::kernel_call<T>& c, std::initializer_list<std::size_t> inputs,
                   std::initializer_list<std::size_t> outputs) {
    auto check = [&](const std::vector<tensor_id>& tensors, std::initializer_list<std::size_t> want, const char* role) {
        std::size_t i = 0;
        for (std::size_t bytes : want) {
            if (i >= tensors.size()) break;
            const tensor_id t = tensors[i];
            const value_kind kind = c.g.tensor(t).kind;
            if (const std::size_t have = stored_bytes<T>(c.g, t); have != bytes)
                throw usage_error("cuda " + std::string(c.n.op->name) + " (node '" + c.n.name + "'): " + role + " " +
                                  std::to_string(i) + " '" + c.g.tensor(t).name + "' is stored as " +
                                  stored_name(have, kind) + " but the kernel reads " + stored_name(bytes, kind) +
                                  "; a tensor the op keeps in float must come from the op that makes it (its "
                                  "float_outputs) or from copies marked keeps_float (partition/materialize.hpp)");
            ++i;
        }
    };
    check(c.n.inputs, inputs, "input");
    check(c.n.outputs, outputs, "output");
}

// ---- assemble ---------------------------------------------------------------------------

// The op's attributes decoded as the host kernel decodes them: per input its box and its
// intersection with the output box (an empty one, for rank > 0, contributes nothing).
struct assemble_layout {
    partition::box out;
    std::vector<partition::box> inputs, regions;
    std::vector<bool> active;
    bool accumulate = false, zero = false;

    std::size_t active_count() const { return static_cast<std::size_t>(std::count(active.begin(), active.end(), true)); }
};

template <class T>
assemble_layout assemble_layout_of(const host::kernel_call<T>& c) {
    const auto& out_flat = c.attrs().template get<std::vector<std::int64_t>>("out_box");
    const auto& in_flat = c.attrs().template get<std::vector<std::int64_t>>("in_boxes");
    const std::size_t rank = out_flat.size() / 2;
    if (out_flat.size() % 2 != 0 || in_flat.size() != 2 * rank * c.n.inputs.size())
        throw usage_error("cuda assemble (node '" + c.n.name + "'): out_box has " + std::to_string(out_flat.size()) +
                          " entries and in_boxes " + std::to_string(in_flat.size()) + " for " +
                          std::to_string(c.n.inputs.size()) +
                          " inputs; give begin and end per axis (partition::encode_box) for the output and each input");
    assemble_layout a;
    a.accumulate = c.attrs().template get<std::int64_t>("accumulate") != 0;
    a.zero = a.accumulate || c.attrs().template get<std::int64_t>("zero") != 0;
    a.out = partition::decode_box(out_flat, 0, rank);
    for (std::size_t i = 0; i < c.n.inputs.size(); ++i) {
        a.inputs.push_back(partition::decode_box(in_flat, 2 * rank * i, rank));
        a.regions.push_back(partition::intersect(a.inputs.back(), a.out));
        a.active.push_back(rank == 0 || !a.regions.back().empty());
    }
    return a;
}

// Whether a bf16 sum goes through a float buffer: with three or more inputs, so that it is
// rounded once, as the host's float sum is when stored. Two need no buffer: the first add
// into zeros is exact, and the second rounds once.
inline bool sums_through_float(const assemble_layout& a, std::size_t element_bytes) {
    return a.accumulate && element_bytes == sizeof(bfloat16) && a.active_count() >= 3;
}

// Checks the inputs are stored like the output (pieces of one tensor) and asks for the float
// buffer of a bf16 sum.
template <class T>
std::size_t assemble_workspace(const host::kernel_call<T>& c) {
    const assemble_layout a = assemble_layout_of(c);
    const std::size_t bytes = stored_bytes<T>(c.g, c.n.outputs[0]);
    const value_kind kind = c.g.tensor(c.n.outputs[0]).kind;
    for (std::size_t i = 0; i < c.n.inputs.size(); ++i)
        if (const std::size_t have = stored_bytes<T>(c.g, c.n.inputs[i]); have != bytes)
            throw usage_error("cuda assemble (node '" + c.n.name + "'): input " + std::to_string(i) + " '" +
                              c.g.tensor(c.n.inputs[i]).name + "' is stored as " +
                              stored_name(have, c.g.tensor(c.n.inputs[i]).kind) + " but the output as " +
                              stored_name(bytes, kind) +
                              "; pieces of one tensor are stored alike (mark the assemble keeps_float exactly when "
                              "its inputs are float)");
    return sums_through_float(a, bytes) ? static_cast<std::size_t>(c.output_numel(0)) * sizeof(float) : 0;
}

// Copies or adds each input's intersection with the output box, in input order; the output
// is zeroed first when the inputs are summed or do not cover it. Sums are in float (integer
// for token ids), in input order: deterministic.
template <class T, class Context = launch_context>
void assemble(const host::kernel_call<T>& c, const Context& x) {
    const assemble_layout a = assemble_layout_of(c);
    const std::size_t bytes = stored_bytes<T>(c.g, c.n.outputs[0]);
    const std::int64_t n = c.output_numel(0);
    void* y = c.out[0];
    if (n == 0) return;
    if (a.zero) cuda::fill_zero(y, static_cast<std::size_t>(n) * bytes, x.stream);
    auto each_input = [&](auto&& f) {
        for (std::size_t i = 0; i < a.inputs.size(); ++i)
            if (a.active[i]) f(c.in[i], a.inputs[i], a.regions[i]);
    };
    if (!a.accumulate) {
        each_input([&](const void* in, const partition::box& box, const partition::box& region) {
            cuda::copy_region(in, box, y, a.out, region, bytes, x.stream);
        });
        return;
    }
    if (c.g.tensor(c.n.outputs[0]).kind == value_kind::index) {
        each_input([&](const void* in, const partition::box& box, const partition::box& region) {
            cuda::add_region(static_cast<const std::int32_t*>(in), box, static_cast<std::int32_t*>(y), a.out, region,
                             x.stream);
        });
    } else if (bytes == sizeof(float)) {
        each_input([&](const void* in, const partition::box& box, const partition::box& region) {
            cuda::add_region(static_cast<const float*>(in), box, static_cast<float*>(y), a.out, region, x.stream);
        });
    } else if (sums_through_float(a, bytes)) {
        auto* sum = static_cast<float*>(x.workspace);
        cuda::fill_zero(sum, static_cast<std::size_t>(n) * sizeof(float), x.stream);
        each_input([&](const void* in, const partition::box& box, const partition::box& region) {
            cuda::add_region(static_cast<const bfloat16*>(in), box, sum, a.out, region, x.stream);
        });
        cuda::cast(sum, static_cast<bfloat16*>(y), n, x.stream);
    } else {
        each_input([&](const void* in, const partition::box& box, const partition::box& region) {
            cuda::add_region(static_cast<const bfloat16*>(in), box, static_cast<bfloat16*>(y), a.out, region, x.stream);
        });
    }
}

// ---- identity ---------------------------------------------------------------------------

template <class T>
std::size_t identity_check(const host::kernel_call<T>& c) {
    const tensor_id in = c.n.inputs.at(0), out = c.n.outputs.at(0);
    if (c.g.tensor(in).kind != c.g.tensor(out).kind)
        throw usage_error("cuda identity (node '" + c.n.name + "'): input '" + c.g.tensor(in).name + "' and output '" +
                          c.g.tensor(out).name + "' differ in kind (token ids and reals); an identity keeps its "
                          "input's kind");
    return 0;
}

// y = x, converted where the program stores the two in different precisions (a float
// tensor given a second role in bf16, or the reverse).
template <class T, class Context = launch_context>
void identity(const host::kernel_call<T>& c, const Context& x) {
    const std::int64_t n = c.output_numel(0);
    if (n == 0) return;
    const std::size_t from = stored_bytes<T>(c.g, c.n.inputs[0]), to = stored_bytes<T>(c.g, c.n.outputs[0]);
    if (from == to) {
        if (c.in[0] != c.out[0]) cuda::copy_on_device(c.out[0], c.in[0], static_cast<std::size_t>(n) * to, x.stream);
    } else if (from == sizeof(float)) {
        cuda::cast(static_cast<const float*>(c.in[0]), static_cast<bfloat16*>(c.out[0]), n, x.stream);
    } else {
        cuda::cast(static_cast<const bfloat16*>(c.in[0]), static_cast<float*>(c.out[0]), n, x.stream);
    }
}

// ---- vocabulary-parallel cross-entropy ----------------------------------------------------
// The log-sum-exps (chunk_logsumexp's output) and the loss are float in every precision;
// everything else real is T.

// logits -> lse
template <class T, class Context = launch_context>
void chunk_logsumexp(const host::kernel_call<T>& c, const Context& x) {
    const std::int64_t chunks = c.extent("c"), v = c.extent("v");
    const std::int64_t rows = c.output_numel(0) / std::max<std::int64_t>(chunks, 1);
    cuda::chunk_logsumexp(c.input(0), static_cast<float*>(c.out[0]), rows, chunks, v, x.stream);
}
template <class T>
std::size_t chunk_logsumexp_check(const host::kernel_call<T>& c) {
    expect_stored(c, {sizeof(T)}, {sizeof(float)});
    return 0;
}

// (dlse, logits, lse) -> dlogits
template <class T, class Context = launch_context>
void chunk_logsumexp_grad(const host::kernel_call<T>& c, const Context& x) {
    const std::int64_t chunks = c.extent("c"), v = c.extent("v");
    const std::int64_t rows = c.input_numel(0) / std::max<std::int64_t>(chunks, 1);
    cuda::chunk_logsumexp_backward(c.input(0), c.input(1), static_cast<const float*>(c.in[2]), c.output(0), rows, chunks,
                                   v, x.stream);
}
template <class T>
std::size_t chunk_logsumexp_grad_check(const host::kernel_call<T>& c) {
    expect_stored(c, {sizeof(T), sizeof(T), sizeof(float)}, {sizeof(T)});
    return 0;
}

// logits -> lse over ragged chunks (a vocabulary the chunk count does not divide)
template <class T, class Context = launch_context>
void ragged_chunk_logsumexp(const host::kernel_call<T>& c, const Context& x) {
    const auto bounds = c.attrs().template get<std::vector<std::int64_t>>("boundaries");
    const std::int64_t chunks = c.extent("c"), v = c.extent("v");
    const std::int64_t rows = c.output_numel(0) / std::max<std::int64_t>(chunks, 1);
    cuda::ragged_chunk_logsumexp(c.input(0), static_cast<float*>(c.out[0]), rows, v, bounds.data(), chunks,
                                 c.attrs().template get_or<std::int64_t>("row_offset", 0), x.stream);
}
template <class T>
std::size_t ragged_chunk_logsumexp_check(const host::kernel_call<T>& c) {
    expect_stored(c, {sizeof(T)}, {sizeof(float)});
    return 0;
}

// (dlse, logits, lse) -> dlogits over ragged chunks
template <class T, class Context = launch_context>
void ragged_chunk_logsumexp_grad(const host::kernel_call<T>& c, const Context& x) {
    const auto bounds = c.attrs().template get<std::vector<std::int64_t>>("boundaries");
    const std::int64_t chunks = c.extent("c"), v = c.extent("v");
    const std::int64_t rows = c.input_numel(0) / std::max<std::int64_t>(chunks, 1);
    cuda::ragged_chunk_logsumexp_backward(c.input(0), c.input(1), static_cast<const float*>(c.in[2]), c.output(0), rows,
                                          v, bounds.data(), chunks,
                                          c.attrs().template get_or<std::int64_t>("row_offset", 0), x.stream);
}
template <class T>
std::size_t ragged_chunk_logsumexp_grad_check(const host::kernel_call<T>& c) {
    expect_stored(c, {sizeof(T), sizeof(T), sizeof(float)}, {sizeof(T)});
    return 0;
}

// (logits, targets) -> z; a target outside the vocabulary gives NaN (the kernel cannot throw).
template <class T, class Context = launch_context>
void pick_target(const host::kernel_call<T>& c, const Context& x) {
    cuda::pick_target(c.input(0), c.index_input(1), c.output(0), c.input_numel(1), c.extent("v"),
                      c.attrs().template get<std::int64_t>("vocab"),
                      c.attrs().template get_or<std::int64_t>("row_offset", 0),
                      c.attrs().template get<std::int64_t>("ignore_index"), x.stream);
}
template <class T>
std::size_t pick_target_check(const host::kernel_call<T>& c) {
    expect_stored(c, {sizeof(T), sizeof(std::int32_t)}, {sizeof(T)});
    return 0;
}

// (dz, targets) -> dlogits
template <class T, class Context = launch_context>
void pick_target_grad(const host::kernel_call<T>& c, const Context& x) {
    cuda::pick_target_backward(c.input(0), c.index_input(1), c.output(0), c.input_numel(1), c.extent("v"),
                               c.attrs().template get<std::int64_t>("vocab"),
                               c.attrs().template get_or<std::int64_t>("row_offset", 0),
                               c.attrs().template get<std::int64_t>("ignore_index"), x.stream);
}
template <class T>
std::size_t pick_target_grad_check(const host::kernel_call<T>& c) {
    expect_stored(c, {sizeof(T), sizeof(std::int32_t)}, {sizeof(T)});
    return 0;
}

// (lse, z, targets) -> loss
template <class T, class Context = launch_context>
void cross_entropy_from_chunks(const host::kernel_call<T>& c, const Context& x) {
    cuda::cross_entropy_from_chunks(static_cast<const float*>(c.in[0]), c.input(1), c.index_input(2),
                                    static_cast<float*>(c.out[0]), c.input_numel(2), c.extent("c"),
                                    c.attrs().template get<std::int64_t>("ignore_index"),
                                    c.attrs().template get<double>("normalizer"), x.stream);
}
template <class T>
std::size_t cross_entropy_from_chunks_check(const host::kernel_call<T>& c) {
    expect_stored(c, {sizeof(float), sizeof(T), sizeof(std::int32_t)}, {sizeof(float)});
    return 0;
}

// (dloss, lse, targets) -> (dlse, dz)
template <class T, class Context = launch_context>
void cross_entropy_from_chunks_grad(const host::kernel_call<T>& c, const Context& x) {
    cuda::cross_entropy_from_chunks_backward(c.input(0), static_cast<const float*>(c.in[1]), c.index_input(2),
                                             c.output(0), c.output(1), c.input_numel(2), c.extent("c"),
                                             c.attrs().template get<std::int64_t>("ignore_index"),
                                             c.attrs().template get<double>("normalizer"), x.stream);
}
template <class T>
std::size_t cross_entropy_from_chunks_grad_check(const host::kernel_call<T>& c) {
    expect_stored(c, {sizeof(T), sizeof(float), sizeof(std::int32_t)}, {sizeof(T), sizeof(T)});
    return 0;
}

}  // namespace op_kernels
}  // namespace loom::cuda
