// The CUDA kernels of the ops partitioned plans put into device programs (assemble, identity
// and the vocabulary-parallel cross-entropy) against their host twins: each op's host
// kernel run in float on the same inputs (bf16 inputs widened exactly), through the very
// table entries the executor launches (cuda::find_op_kernel) and with the node's own shapes
// and attributes. Inputs are fresh random values; every output buffer starts as NaN bytes (an
// element a kernel fails to write shows); every case runs with its buffers aligned and one
// element off, twice, and the two runs must agree bit for bit. add_region, the sum behind
// assemble, is also checked on its own for every element type pair it serves.
//
// Tolerances (|got - want| <= abs + rel |want|, want the host's float result rounded to the
// tensor's storage):
//   assemble, identity, pick_target(_grad), the dz of cross_entropy_from_chunks_grad: exact
//     (moves, and float sums in the host's order: 0 + x0 + x1 + ...);
//   chunk_logsumexp (float out): rel 1e-6, abs 1e-5 (sums of up to 25152 terms in another
//     order, expf and logf against the host's polynomial exp, on values up to ~20);
//   cross_entropy_from_chunks (float loss): rel 1e-5, abs 1e-6;
//   chunk_logsumexp_grad, the dlse of cross_entropy_from_chunks_grad: rel 1e-5 in f32, one
//     bf16 step (1/128) in bf16, abs 1e-9 (an exp of one argument, rounded once);
//   ragged_chunk_logsumexp and its gradient: as chunk_logsumexp and chunk_logsumexp_grad.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <type_traits>
#include <vector>

#include <loom/graph/builder.hpp>
#include <loom/ops/assemble.hpp>
#include <loom/ops/identity.hpp>
#include <loom/ops/vocab_parallel_cross_entropy.hpp>
#include <loom/partition/region_copy.hpp>
#include <loom/plan/op_partition.hpp>
#include <loom/runtime/cuda/op_kernels.hpp>
#include <loom/runtime/host/kernel_table.hpp>
#include <loom/runtime/program.hpp>

#include "support.hpp"

using namespace loom;
using namespace loom::cuda_test;

namespace {

template <class T>
constexpr precision precision_of = std::is_same_v<T, float> ? precision::f32 : precision::bf16;

// Bytes per element of tensor t in a program of element type T.
template <class T>
std::size_t element_bytes(const graph& g, tensor_id t) {
    if (g.tensor(t).kind == value_kind::index) return 4;
    return storage_precision(g, t, precision_of<T>) == precision::f32 ? 4 : sizeof(T);
}

// A tensor's values on the host: reals as float (exactly what the device holds), token ids
// as int32.
struct values {
    std::vector<float> real;
    std::vector<std::int32_t> index;
};

std::vector<unsigned char> encode(const values& v, std::size_t bytes, bool index) {
    if (index) {
        std::vector<unsigned char> raw(v.index.size() * 4);
        std::memcpy(raw.data(), v.index.data(), raw.size());
        return raw;
    }
    std::vector<unsigned char> raw(v.real.size() * bytes);
    bool exact = true;  // bf16 inputs are generated in bf16: storing them loses nothing
    for (std::size_t i = 0; i < v.real.size(); ++i) {
        if (bytes == 4) {
            std::memcpy(raw.data() + 4 * i, &v.real[i], 4);
        } else {
            const loom::bfloat16 b(v.real[i]);
            exact = exact && static_cast<float>(b) == v.real[i];
            std::memcpy(raw.data() + 2 * i, &b.bits, 2);
        }
    }
    REQUIRE(exact);
    return raw;
}

values decode(const std::vector<unsigned char>& raw, std::size_t bytes, bool index) {
    values v;
    if (index) {
        v.index.resize(raw.size() / 4);
        std::memcpy(v.index.data(), raw.data(), raw.size());
        return v;
    }
    v.real.resize(raw.size() / bytes);
    for (std::size_t i = 0; i < v.real.size(); ++i) {
        if (bytes == 4) {
            std::memcpy(&v.real[i], raw.data() + 4 * i, 4);
        } else {
            std::uint16_t bits;
            std::memcpy(&bits, raw.data() + 2 * i, 2);
            v.real[i] = static_cast<float>(loom::bfloat16::from_bits(bits));
        }
    }
    return v;
}

// Random values for tensor t as the program of T stores it: reals in [lo, hi) rounded to their
// storage, token ids in [0, 50000).
template <class T>
values random_values(const graph& g, tensor_id t, std::uint64_t seed, float lo = -1.0f, float hi = 1.0f) {
    const auto n = static_cast<std::size_t>(g.tensor(t).dims.numel());
    values v;
    if (g.tensor(t).kind == value_kind::index) {
        std::mt19937_64 rng(seed);
        for (std::size_t i = 0; i < n; ++i) v.index.push_back(static_cast<std::int32_t>(rng() % 50000));
    } else if (element_bytes<T>(g, t) == 4) {
        v.real = random_vector<float>(n, seed, lo, hi);
    } else {
        v.real = widen(random_vector<T>(n, seed, lo, hi));
    }
    return v;
}

// The host twin: the op's host kernel in float.
std::vector<values> run_on_host(const graph& g, const node& n, std::vector<values> inputs) {
    std::vector<void*> ins, outs;
    for (std::size_t i = 0; i < inputs.size(); ++i)
        ins.push_back(g.tensor(n.inputs[i]).kind == value_kind::index ? static_cast<void*>(inputs[i].index.data())
                                                                       : static_cast<void*>(inputs[i].real.data()));
    std::vector<values> out(n.outputs.size());
    for (std::size_t o = 0; o < out.size(); ++o) {
        const tensor_desc& d = g.tensor(n.outputs[o]);
        const auto count = static_cast<std::size_t>(d.dims.numel());
        if (d.kind == value_kind::index) {
            out[o].index.resize(count);
            outs.push_back(out[o].index.data());
        } else {
            out[o].real.resize(count);
            outs.push_back(out[o].real.data());
        }
    }
    host::kernel_for<float>(*n.op)(host::kernel_call<float>{g, n, ins, outs, 0});
    return out;
}

struct device_result {
    std::vector<values> outputs;
    std::vector<std::vector<unsigned char>> raw;
};

// The op's CUDA table entry on device copies of `inputs`, each placed `misalign` elements
// into its buffer; the outputs start as 0xff bytes (NaN, or -1 for token ids).
template <class T>
device_result run_on_device(const graph& g, const node& n, const std::vector<values>& inputs, std::size_t misalign) {
    const cuda::op_kernel<T>* k = cuda::find_op_kernel<T>(n.op->name);
    REQUIRE(k != nullptr);
    std::vector<cuda::device_buffer> buffers;
    std::vector<void*> ins, outs;
    auto place = [&](tensor_id t, const std::vector<unsigned char>& raw) {
        const std::size_t bytes = element_bytes<T>(g, t);
        buffers.emplace_back(raw.size() + (misalign + 1) * bytes);
        void* at = static_cast<unsigned char*>(buffers.back().get()) + misalign * bytes;
        if (!raw.empty()) cuda::copy_to_device(at, raw.data(), raw.size());
        return at;
    };
    for (std::size_t i = 0; i < inputs.size(); ++i) {
        const tensor_id t = n.inputs[i];
        ins.push_back(place(t, encode(inputs[i], element_bytes<T>(g, t), g.tensor(t).kind == value_kind::index)));
    }
    for (const tensor_id t : n.outputs) {
        const auto count = static_cast<std::size_t>(g.tensor(t).dims.numel());
        outs.push_back(place(t, std::vector<unsigned char>(count * element_bytes<T>(g, t), 0xff)));
    }
    const std::vector<void*> none;
    const std::size_t wanted = k->workspace_bytes ? k->workspace_bytes(host::kernel_call<T>{g, n, none, none, 0}) : 0;
    cuda::device_buffer workspace(std::max<std::size_t>(wanted, 256));
    const cuda::launch_context context{nullptr, nullptr, workspace.get(), workspace.bytes()};
    k->launch(host::kernel_call<T>{g, n, ins, outs, 0}, context);
    cuda::synchronize_device();
    device_result r;
    for (std::size_t o = 0; o < n.outputs.size(); ++o) {
        const tensor_id t = n.outputs[o];
        const std::size_t bytes = element_bytes<T>(g, t);
        std::vector<unsigned char> raw(static_cast<std::size_t>(g.tensor(t).dims.numel()) * bytes);
        if (!raw.empty()) cuda::copy_to_host(raw.data(), outs[o], raw.size());
        r.outputs.push_back(decode(raw, bytes, g.tensor(t).kind == value_kind::index));
        r.raw.push_back(std::move(raw));
    }
    return r;
}

struct tolerance {
    double rel = 0, abs = 0;
};

// Runs node n on the device (aligned and misaligned, twice each) and on the host; compares
// output o under tolerances[o] (reals) or exactly (token ids).
template <class T>
void check_against_host(const graph& g, const node& n, const std::vector<values>& inputs,
                        const std::vector<tolerance>& tolerances, const std::string& what) {
    REQUIRE(tolerances.size() == n.outputs.size());
    const auto want = run_on_host(g, n, inputs);
    for (const std::size_t misalign : {0, 1}) {
        INFO(what << " (" << n.op->name << ", buffers " << misalign << " elements off alignment)");
        const auto got = run_on_device<T>(g, n, inputs, misalign);
        for (std::size_t o = 0; o < n.outputs.size(); ++o) {
            const tensor_id t = n.outputs[o];
            const std::string label = what + ": output '" + g.tensor(t).name + "'";
            if (g.tensor(t).kind == value_kind::index) {
                INFO(label);
                CHECK(got.outputs[o].index == want[o].index);
            } else if (element_bytes<T>(g, t) == 4) {
                require_close(got.outputs[o].real, want[o].real, tolerances[o].rel, tolerances[o].abs, label);
            } else {
                require_close(got.outputs[o].real, stored<T>(want[o].real), tolerances[o].rel, tolerances[o].abs, label);
            }
        }
        const auto again = run_on_device<T>(g, n, inputs, misalign);
        for (std::size_t o = 0; o < n.outputs.size(); ++o) {
            INFO("the same launch again gives the same bits: output " << o);
            CHECK(again.raw[o] == got.raw[o]);
        }
    }
}

// ---- assemble ---------------------------------------------------------------------------

const shape activations{{Dim::Batch::id, 8}, {Dim::Seq::id, 4}, {Dim::Hidden::id, 12}};
const shape chunk_lse{{Dim::Batch::id, 8}, {Dim::Seq::id, 4}, {Dim::Vocab::id, 4}};
const shape token_ids{{Dim::Batch::id, 8}, {Dim::Seq::id, 4}};
const shape scalar{};

partition::box whole(const shape& s) { return partition::box::whole(s); }

// Piece p of `s` split into n equal pieces along `axis`.
partition::box piece(const shape& s, std::size_t axis, std::int64_t n, std::int64_t p) {
    partition::box b = partition::box::whole(s);
    const std::int64_t size = s.extent(axis) / n;
    b.ranges[axis] = {p * size, (p + 1) * size};
    return b;
}

std::vector<partition::box> pieces(const shape& s, std::size_t axis, std::int64_t n) {
    std::vector<partition::box> all;
    for (std::int64_t p = 0; p < n; ++p) all.push_back(piece(s, axis, n, p));
    return all;
}

struct assemble_case {
    std::string what;
    shape logical;
    partition::box out;
    std::vector<partition::box> ins;
    bool accumulate = false, zero = false;
    bool keeps_float = false;  // pieces of a tensor bf16 programs keep in float (a loss, lse)
    value_kind kind = value_kind::real;
};

// The inputs are graph inputs, or for a float-kept tensor the outputs of identities marked
// keeps_float (so that the program stores them in float, as the partitioner's copies are);
// the assemble is the last node.
graph assemble_graph(const assemble_case& c) {
    graph_builder b;
    std::vector<tensor> ins;
    std::vector<std::int64_t> in_boxes;
    for (std::size_t i = 0; i < c.ins.size(); ++i) {
        tensor t = b.input("piece" + std::to_string(i), c.ins[i].shape_of(c.logical), c.kind);
        if (c.keeps_float)
            t = b.append_unchecked(op_def_of<ops::Identity>(), std::vector<tensor>{t}, {t.dims()},
                                   {{"keeps_float", std::int64_t{1}}}, "float_piece" + std::to_string(i), c.kind)
                    .at(0);
        ins.push_back(t);
        const auto flat = partition::encode_box(c.ins[i]);
        in_boxes.insert(in_boxes.end(), flat.begin(), flat.end());
    }
    attributes a{{"out_box", partition::encode_box(c.out)},
                 {"in_boxes", in_boxes},
                 {"accumulate", std::int64_t{c.accumulate ? 1 : 0}},
                 {"zero", std::int64_t{c.zero ? 1 : 0}}};
    if (c.keeps_float) a.set("keeps_float", std::int64_t{1});
    b.append_unchecked(op_def_of<ops::Assemble>(), ins, {c.out.shape_of(c.logical)}, std::move(a), "assembled", c.kind);
    return std::move(b).take();
}

std::vector<assemble_case> assemble_cases() {
    const shape& a = activations;
    std::vector<partition::box> overlapping{whole(a), piece(a, 0, 2, 0), piece(a, 0, 2, 1), piece(a, 2, 4, 3)};
    return {
        {"all-gather of 2 batch pieces", a, whole(a), pieces(a, 0, 2)},
        {"all-gather of 4 hidden pieces", a, whole(a), pieces(a, 2, 4)},
        {"chunk: sequence piece 2 of 4 from the whole", a, piece(a, 1, 4, 2), {whole(a)}},
        {"reshard: batch half 1 from 4 hidden pieces", a, piece(a, 0, 2, 1), pieces(a, 2, 4)},
        {"reshard: batch half 1 from 4 batch pieces, two of them outside it", a, piece(a, 0, 2, 1), pieces(a, 0, 4)},
        {"zeroed: hidden pieces 0 and 2 of 4 into the whole", a, whole(a), {piece(a, 2, 4, 0), piece(a, 2, 4, 2)},
         false, true},
        {"sum of 2 partial values", a, whole(a), {whole(a), whole(a)}, true},
        {"reduce-scatter: sum of 4 partial values into batch half 1", a, piece(a, 0, 2, 1),
         {whole(a), whole(a), whole(a), whole(a)}, true},
        {"sum of overlapping pieces (1 to 3 terms an element)", a, whole(a), overlapping, true},
        {"log-sum-exps gathered along 2 chunk pieces, kept in float", chunk_lse, whole(chunk_lse),
         pieces(chunk_lse, 2, 2), false, false, true},
        {"sum of 3 partial log-sum-exps, kept in float", chunk_lse, whole(chunk_lse),
         {whole(chunk_lse), whole(chunk_lse), whole(chunk_lse)}, true, false, true},
        {"loss: sum of 2 scalars, kept in float", scalar, whole(scalar), {whole(scalar), whole(scalar)}, true, false,
         true},
        {"loss: sum of 4 scalars, kept in float", scalar, whole(scalar),
         {whole(scalar), whole(scalar), whole(scalar), whole(scalar)}, true, false, true},
        {"token ids gathered along 2 batch pieces", token_ids, whole(token_ids), pieces(token_ids, 0, 2), false, false,
         false, value_kind::index},
        {"token ids: sequence piece 1 of 4 from the whole", token_ids, piece(token_ids, 1, 4, 1), {whole(token_ids)},
         false, false, false, value_kind::index},
    };
}

template <class T>
void check_assemble(const assemble_case& c, std::uint64_t seed) {
    const graph g = assemble_graph(c);
    const node& n = g.nodes.back();
    if (c.keeps_float) REQUIRE(element_bytes<T>(g, n.outputs[0]) == 4);
    std::vector<values> inputs;
    for (const tensor_id t : n.inputs) inputs.push_back(random_values<T>(g, t, seed++));
    check_against_host<T>(g, n, inputs, {tolerance{}}, c.what);
}

// ---- identity ---------------------------------------------------------------------------

// x -> identity -> y, where `from_float` makes x a float-kept copy and `to_float` marks the
// identity itself keeps_float (a bf16 program then converts between the two).
template <class T>
void check_identity(bool from_float, bool to_float, value_kind kind, std::uint64_t seed) {
    graph_builder b;
    const shape s{{Dim::Batch::id, 6}, {Dim::Hidden::id, 37}};
    tensor x = b.input("x", s, kind);
    auto copy = [&](tensor in, bool keeps_float, const std::string& name) {
        attributes a;
        if (keeps_float) a.set("keeps_float", std::int64_t{1});
        return b.append_unchecked(op_def_of<ops::Identity>(), std::vector<tensor>{in}, {s}, std::move(a), name, kind).at(0);
    };
    if (from_float) x = copy(x, true, "x_float");
    copy(x, to_float, "y");
    const graph g = std::move(b).take();
    const node& n = g.nodes.back();
    const std::string what = std::string("identity from ") + (from_float ? "float" : "the program's precision") +
                             " to " + (to_float ? "float" : "the program's precision") +
                             (kind == value_kind::index ? ", token ids" : "");
    check_against_host<T>(g, n, {random_values<T>(g, n.inputs[0], seed)}, {tolerance{}}, what);
}

// ---- vocabulary-parallel cross-entropy ----------------------------------------------------

// The piece of a vocabulary of `vocab` in `chunks` chunks that device `piece` of `devices`
// holds, at `rows` positions (batch x sequence).
struct vocab_case {
    std::int64_t batch, seq, vocab, chunks, devices, piece;
};

constexpr std::int64_t ignore = -100;

template <class T>
void check_vocab_parallel(const vocab_case& vc, std::uint64_t seed) {
    const std::int64_t rows = vc.batch * vc.seq;
    const std::int64_t chunks = vc.chunks / vc.devices;    // this piece's chunks
    const std::int64_t width = vc.vocab / vc.devices;      // this piece's logits per position
    const std::int64_t row_offset = vc.piece * width;
    const double normalizer = static_cast<double>(rows);  // the op's default: every position
    const std::string what = "vocabulary " + std::to_string(vc.vocab) + " in " + std::to_string(vc.chunks) +
                             " chunks, piece " + std::to_string(vc.piece) + " of " + std::to_string(vc.devices) +
                             ", " + std::to_string(rows) + " positions";
    INFO(what);

    graph_builder b;
    const tensor logits = b.input("logits", {{Dim::Batch::id, vc.batch}, {Dim::Seq::id, vc.seq}, {Dim::Vocab::id, width}});
    const tensor targets = b.input("targets", {{Dim::Batch::id, vc.batch}, {Dim::Seq::id, vc.seq}}, value_kind::index);
    const tensor lse = ops::chunk_logsumexp(logits, chunks);
    const tensor dlse = b.input("dlse", lse.dims());
    const tensor dlogits = ops::chunk_logsumexp_grad(dlse, logits, lse, chunks);
    const tensor z = b.apply1<ops::PickTarget>(
        {logits, targets}, {{"vocab", vc.vocab}, {"row_offset", row_offset}, {"ignore_index", ignore}});
    const tensor dz = b.input("dz", z.dims());
    const tensor dpick = ops::pick_target_grad(dz, targets, width, vc.vocab, row_offset, ignore);
    const tensor loss = ops::cross_entropy_from_chunks(lse, z, targets, ignore, normalizer);
    const tensor dloss = b.input("dloss", shape{});
    const auto grads = ops::cross_entropy_from_chunks_grad(dloss, lse, targets, ignore, normalizer);
    const graph g = std::move(b).take();
    auto producer = [&](const tensor& t) -> const node& { return g.at(g.tensor(t.id).producer); };
    // The log-sum-exps and the loss are float in every precision; the rest is T.
    REQUIRE(element_bytes<T>(g, lse.id) == 4);
    REQUIRE(element_bytes<T>(g, loss.id) == 4);
    REQUIRE(element_bytes<T>(g, dlogits.id) == sizeof(T));

    // Targets: every 7th ignored, every 3rd a class this piece holds, the rest anywhere in the
    // vocabulary (mostly held by other pieces when there are several).
    values t;
    for (std::int64_t r = 0; r < rows; ++r) {
        std::int64_t target = static_cast<std::int64_t>((static_cast<std::uint64_t>(r) * 7919u + seed) %
                                                        static_cast<std::uint64_t>(vc.vocab));
        if (r % 3 == 0) target = row_offset + (r * 13) % width;
        if (r % 7 == 5) target = ignore;
        t.index.push_back(static_cast<std::int32_t>(target));
    }
    std::vector<values> value(g.tensors.size());
    value[static_cast<std::size_t>(logits.id)] = random_values<T>(g, logits.id, seed + 1, -8.0f, 8.0f);
    value[static_cast<std::size_t>(targets.id)] = t;
    value[static_cast<std::size_t>(dlse.id)] = random_values<T>(g, dlse.id, seed + 2);
    value[static_cast<std::size_t>(dz.id)] = random_values<T>(g, dz.id, seed + 3);
    value[static_cast<std::size_t>(dloss.id)].real = {1.5f};
    auto inputs_of = [&](const node& n) {
        std::vector<values> in;
        for (const tensor_id i : n.inputs) in.push_back(value[static_cast<std::size_t>(i)]);
        return in;
    };
    // What the backward ops read of the forward: the host's log-sum-exps and picks (z holds
    // logits, so it is exact in T).
    value[static_cast<std::size_t>(lse.id)] = run_on_host(g, producer(lse), inputs_of(producer(lse)))[0];
    value[static_cast<std::size_t>(z.id)] = run_on_host(g, producer(z), inputs_of(producer(z)))[0];

    const tolerance exact{};
    const tolerance lse_tol{1e-6, 1e-5};
    const tolerance loss_tol{1e-5, 1e-6};
    const tolerance grad_tol{std::is_same_v<T, float> ? 1e-5 : bf16_ulp, 1e-9};
    check_against_host<T>(g, producer(lse), inputs_of(producer(lse)), {lse_tol}, what);
    check_against_host<T>(g, producer(dlogits), inputs_of(producer(dlogits)), {grad_tol}, what);
    check_against_host<T>(g, producer(z), inputs_of(producer(z)), {exact}, what);
    check_against_host<T>(g, producer(dpick), inputs_of(producer(dpick)), {exact}, what);
    check_against_host<T>(g, producer(loss), inputs_of(producer(loss)), {loss_tol}, what);
    check_against_host<T>(g, producer(grads.dlse), inputs_of(producer(grads.dlse)), {grad_tol, exact}, what);
}

const vocab_case vocab_cases[] = {
    {2, 5, 96, 4, 1, 0},        // unsplit: 4 chunks of 24
    {2, 5, 96, 4, 2, 1},        // the second of a 2-way split: 2 chunks, rows [48, 96)
    {2, 5, 96, 4, 4, 0},        // the first of a 4-way split: 1 chunk
    {2, 5, 96, 4, 4, 3},        // the last of a 4-way split
    {3, 11, 24, 8, 2, 0},       // chunks of 3 logits
    {1, 7, 50304, 2, 2, 1},     // GPT-2's padded vocabulary over 2 devices: chunks of 25152
    {2, 3, 50257, 1, 1, 0},     // an odd chunk: rows at every alignment
};

// ---- ragged chunks: a vocabulary the chunk count does not divide ----------------------------

// A vocabulary of `vocab` in `chunks` near-equal chunks (as plans cut it); the logits of
// chunk `piece` alone, or of all of them (piece < 0), at `rows` positions.
struct ragged_case {
    std::int64_t rows, vocab, chunks, piece;
};

template <class T>
void check_ragged(const ragged_case& rc, std::uint64_t seed) {
    std::vector<std::int64_t> bounds;
    for (std::int64_t k = 0; k <= rc.chunks; ++k) bounds.push_back(plan::piece_begin(rc.vocab, rc.chunks, k));
    const std::int64_t row_offset = rc.piece < 0 ? 0 : bounds[static_cast<std::size_t>(rc.piece)];
    const std::int64_t width = rc.piece < 0 ? rc.vocab : bounds[static_cast<std::size_t>(rc.piece) + 1] - row_offset;
    const std::string what = "vocabulary " + std::to_string(rc.vocab) + " in " + std::to_string(rc.chunks) +
                             " ragged chunks, " + (rc.piece < 0 ? std::string("all") : "chunk " + std::to_string(rc.piece)) +
                             ", " + std::to_string(rc.rows) + " positions";
    INFO(what);
    graph_builder b;
    const tensor logits = b.input("logits", {{Dim::Batch::id, rc.rows}, {Dim::Vocab::id, width}});
    const tensor lse = ops::ragged_chunk_logsumexp(logits, bounds, row_offset);
    const tensor dlse = b.input("dlse", lse.dims());
    const tensor dlogits = ops::ragged_chunk_logsumexp_grad(dlse, logits, lse, bounds, row_offset);
    const graph g = std::move(b).take();
    auto producer = [&](const tensor& t) -> const node& { return g.at(g.tensor(t.id).producer); };
    REQUIRE(element_bytes<T>(g, lse.id) == 4);
    std::vector<values> value(g.tensors.size());
    value[static_cast<std::size_t>(logits.id)] = random_values<T>(g, logits.id, seed + 1, -8.0f, 8.0f);
    value[static_cast<std::size_t>(dlse.id)] = random_values<T>(g, dlse.id, seed + 2);
    auto inputs_of = [&](const node& n) {
        std::vector<values> in;
        for (const tensor_id i : n.inputs) in.push_back(value[static_cast<std::size_t>(i)]);
        return in;
    };
    value[static_cast<std::size_t>(lse.id)] = run_on_host(g, producer(lse), inputs_of(producer(lse)))[0];
    const tolerance lse_tol{1e-6, 1e-5};
    const tolerance grad_tol{std::is_same_v<T, float> ? 1e-5 : bf16_ulp, 1e-9};
    check_against_host<T>(g, producer(lse), inputs_of(producer(lse)), {lse_tol}, what);
    check_against_host<T>(g, producer(dlogits), inputs_of(producer(dlogits)), {grad_tol}, what);
}

const ragged_case ragged_cases[] = {
    {10, 97, 2, -1},    // unsplit: chunks of 49 and 48
    {10, 97, 2, 1},     // the second of a 2-way split: 48 logits, its lse in column 1, 0 in column 0
    {6, 101, 4, 3},     // the last of a 4-way split: 25 logits
    {5, 23, 3, 1},      // a middle chunk
    {1, 50257, 2, 0},   // GPT-2's vocabulary over 2 devices: 25129 logits
};

}  // namespace

TEMPLATE_TEST_CASE("ragged chunk log-sum-exps match their host twins, whole and in pieces",
                   "[cuda][partition][vocab_parallel]", float, loom::bfloat16) {
    std::uint64_t seed = 1300;
    for (const auto& c : ragged_cases) check_ragged<TestType>(c, seed += 10);
}

TEMPLATE_TEST_CASE("assemble copies, gathers and sums pieces as the host kernel does", "[cuda][partition][assemble]",
                   float, loom::bfloat16) {
    std::uint64_t seed = 900;
    for (const auto& c : assemble_cases()) check_assemble<TestType>(c, seed += 10);
}

TEMPLATE_TEST_CASE("identity copies, and converts where one side is kept in float", "[cuda][partition][identity]",
                   float, loom::bfloat16) {
    check_identity<TestType>(false, false, value_kind::real, 700);
    check_identity<TestType>(true, false, value_kind::real, 701);
    check_identity<TestType>(false, true, value_kind::real, 702);
    check_identity<TestType>(false, false, value_kind::index, 703);
}

TEMPLATE_TEST_CASE("vocabulary-parallel cross-entropy ops match their host twins on 1-, 2- and 4-way pieces",
                   "[cuda][partition][vocab_parallel]", float, loom::bfloat16) {
    std::uint64_t seed = 800;
    for (const auto& c : vocab_cases) check_vocab_parallel<TestType>(c, seed += 10);
}

TEST_CASE("pick_target: a target outside the vocabulary gives NaN where the host throws",
          "[cuda][partition][vocab_parallel]") {
    graph_builder b;
    const std::int64_t width = 8, vocab = 16;
    const tensor logits = b.input("logits", {{Dim::Batch::id, 4}, {Dim::Vocab::id, width}});
    const tensor targets = b.input("targets", shape{axis{Dim::Batch::id, 4}}, value_kind::index);
    const tensor z =
        b.apply1<ops::PickTarget>({logits, targets}, {{"vocab", vocab}, {"row_offset", width}, {"ignore_index", ignore}});
    const tensor dz = b.input("dz", z.dims());
    const tensor dpick = ops::pick_target_grad(dz, targets, width, vocab, width, ignore);
    const graph g = std::move(b).take();
    // Held (column 1), ignored, out of range, held by the other piece.
    values t;
    t.index = {9, static_cast<std::int32_t>(ignore), 16, 3};
    values x, d;
    x.real = random_vector<float>(32, 11);
    d.real = {0.5f, 0.25f, 2.0f, 4.0f};
    const node& pick = g.at(g.tensor(z.id).producer);
    const node& grad = g.at(g.tensor(dpick.id).producer);
    CHECK_THROWS_WITH(run_on_host(g, pick, {x, t}), Catch::Contains("target 16"));

    const auto got = run_on_device<float>(g, pick, {x, t}, 0).outputs[0].real;
    CHECK(got[0] == x.real[1]);  // row 0, column 9 - row_offset
    CHECK(got[1] == 0.0f);
    CHECK(std::isnan(got[2]));
    CHECK(got[3] == 0.0f);
    const auto rows = run_on_device<float>(g, grad, {d, t}, 0).outputs[0].real;
    for (std::int64_t i = 0; i < width; ++i) {
        CHECK(rows[static_cast<std::size_t>(i)] == (i == 1 ? 0.5f : 0.0f));
        CHECK(rows[static_cast<std::size_t>(width + i)] == 0.0f);
        CHECK(std::isnan(rows[static_cast<std::size_t>(2 * width + i)]));
        CHECK(rows[static_cast<std::size_t>(3 * width + i)] == 0.0f);
    }
}

namespace {

// add_region<E, A> on its own against partition::add_region, the host twin, run in A (float
// for reals): a region of a 3-d piece added into another piece of a different box.
template <class E, class A>
void check_add_region(std::uint64_t seed) {
    using partition::box;
    const box src_box{{{0, 6}, {2, 7}, {0, 9}}}, dst_box{{{1, 8}, {0, 5}, {3, 9}}};
    const box region = partition::intersect(src_box, dst_box);
    std::vector<E> src(static_cast<std::size_t>(src_box.numel())), dst(static_cast<std::size_t>(dst_box.numel()));
    std::vector<float> want(dst.size());
    std::mt19937_64 rng(seed);
    std::uniform_real_distribution<float> u(-1.0f, 1.0f);
    auto draw = [&] {
        if constexpr (std::is_same_v<E, std::int32_t>) return static_cast<E>(rng() % 1000);
        else return E(u(rng));
    };
    for (auto& x : src) x = draw();
    for (std::size_t i = 0; i < dst.size(); ++i) {
        dst[i] = draw();
        want[i] = static_cast<float>(dst[i]);
    }
    std::vector<float> src_wide(src.size());
    for (std::size_t i = 0; i < src.size(); ++i) src_wide[i] = static_cast<float>(src[i]);
    std::vector<A> start(dst.size());
    for (std::size_t i = 0; i < dst.size(); ++i) start[i] = static_cast<A>(static_cast<float>(dst[i]));
    partition::add_region(src_wide.data(), src_box, want.data(), dst_box, region);
    if constexpr (!std::is_same_v<A, float> && !std::is_same_v<A, std::int32_t>) want = stored<A>(want);

    const device_vector<E> d_src(src);
    device_vector<A> d_dst(start);
    cuda::add_region(d_src.get(), src_box, d_dst.get(), dst_box, region, nullptr);
    const auto got = d_dst.download();
    std::vector<float> got_wide(got.size());
    for (std::size_t i = 0; i < got.size(); ++i) got_wide[i] = static_cast<float>(got[i]);
    // One float add per element, rounded once: exact against the host's.
    require_close(got_wide, want, 0.0, 0.0, "add_region");

    // Rank 0: one element.
    const box point{};
    device_vector<A> d_one(std::vector<A>{start[0]});
    cuda::add_region(d_src.get(), point, d_one.get(), point, point, nullptr);
    std::vector<float> one{static_cast<float>(start[0])};
    partition::add_region(src_wide.data(), point, one.data(), point, point);
    if constexpr (!std::is_same_v<A, float> && !std::is_same_v<A, std::int32_t>) one = stored<A>(one);
    const auto got_one = d_one.download();
    CHECK(static_cast<float>(got_one[0]) == one[0]);
}

}  // namespace

TEST_CASE("add_region adds a box region in float (int32 for token ids), rounded once", "[cuda][partition][region]") {
    check_add_region<float, float>(31);
    check_add_region<loom::bfloat16, loom::bfloat16>(32);
    check_add_region<loom::bfloat16, float>(33);
    check_add_region<std::int32_t, std::int32_t>(34);
    using partition::box;
    const device_vector<float> a(std::vector<float>(16, 1.0f));
    device_vector<float> b(16);
    const box piece{{{0, 4}, {0, 4}}};
    CHECK_THROWS_WITH(cuda::add_region(a.get(), piece, b.get(), piece, box{{{2, 6}, {0, 4}}}, nullptr),
                      Catch::Contains("add only the intersection"));
}
