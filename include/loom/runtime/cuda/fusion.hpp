#pragma once
// GEMM-epilogue fusion for the CUDA executor: which steps of a program run as one cuBLASLt
// product with a fused epilogue (gemm.hpp), decided on the host from the program alone, so
// the decision is testable without a GPU. Two patterns, the MLP of a transformer block
// (fc, GELU, proj) forward and backward:
//
//   forward   pre = linear_bias(x, W, b);  act = gelu(pre)
//             -> {A = x, B = W, transpose_b, bias_gelu, bias = b}: C = act, aux = pre
//   backward  dact = linear_grad_input(dy, W2);  dpre = gelu_grad(dact, pre);
//             db = sum_leading(dpre)
//             -> {A = dy, B = W2, dgelu_bgrad, aux = pre}: C = dpre, bias_grad = db
//
// The forward GEMM still writes the pre-activation (as aux), which the backward reads; the
// backward one never writes dact, the gradient of the GELU's output. A fused group runs at
// one of its steps (its launch); its other steps are absorbed and run nothing. For a GPT
// block the backward group is linear_grad_input, gelu_grad and, three steps later, the
// sum_leading of fc's bias; fc's two other gradient GEMMs read dpre between them, so the
// group launches at the gelu_grad and the bias gradient is computed early.
//
//   fusion_plan plan = plan_gemm_fusion(program);
//   plan.description();  // "2 bias+GELU forward GEMMs, 2 dGELU+bias-grad backward GEMMs fused (6 steps absorbed)"
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include <loom/core/error.hpp>
#include <loom/graph/graph.hpp>
#include <loom/graph/op.hpp>
#include <loom/runtime/cuda/gemm.hpp>
#include <loom/runtime/program.hpp>

namespace loom::cuda {

enum class step_role : std::uint8_t {
    alone,     // runs its own kernel at its own position
    launch,    // queues its fused group's one GEMM
    absorbed,  // its work is part of its group's GEMM; nothing runs at its position
};

struct step_fusion {
    step_role role = step_role::alone;
    std::int32_t group = -1;  // index into fusion_plan::groups, -1 when alone
};

// One fused GEMM: C [m, n] = A [m, k] op(B) with an epilogue, over the program's packed
// row-major tensors (leading dimensions k, n or k, and n; aux rows n apart).
struct fused_gemm {
    gemm_epilogue epilogue = gemm_epilogue::none;  // bias_gelu or dgelu_bgrad
    std::vector<std::size_t> steps;                // the group's program steps, ascending
    std::size_t launch = 0;                        // the one of `steps` where the GEMM is queued
    std::int64_t m = 0, n = 0, k = 0;
    bool transpose_b = false;
    tensor_id a = no_id, b = no_id, c = no_id, aux = no_id;
    tensor_id bias = no_id;           // bias_gelu: the linear's bias
    tensor_id bias_grad = no_id;      // dgelu_bgrad: the first linear's bias gradient
    std::vector<tensor_id> absorbed;  // intermediates the fused GEMM never writes
};

struct fusion_plan {
    bool enabled = true;
    std::vector<step_fusion> steps;  // one per program step
    std::vector<fused_gemm> groups;
    // Places that looked like one of the patterns but were left unfused, each with the
    // condition that failed ("node 'blocks.0.mlp.fc/linear_bias': ...").
    std::vector<std::string> declined;

    bool empty() const { return groups.empty(); }
    std::size_t count(gemm_epilogue e) const {
        return static_cast<std::size_t>(
            std::count_if(groups.begin(), groups.end(), [&](const fused_gemm& f) { return f.epilogue == e; }));
    }
    std::size_t absorbed_steps() const {
        return static_cast<std::size_t>(std::count_if(
            steps.begin(), steps.end(), [](const step_fusion& s) { return s.role == step_role::absorbed; }));
    }
    std::string description() const {
        if (!enabled) return "GEMM epilogue fusion off";
        std::string out = empty() ? std::string("no GEMM epilogue fused")
                                  : std::to_string(count(gemm_epilogue::bias_gelu)) + " bias+GELU forward GEMMs, " +
                                        std::to_string(count(gemm_epilogue::dgelu_bgrad)) +
                                        " dGELU+bias-grad backward GEMMs fused (" + std::to_string(absorbed_steps()) +
                                        " steps absorbed)";
        if (!declined.empty()) out += "; " + std::to_string(declined.size()) + " declined";
        return out;
    }
};

struct fusion_options {
    bool fuse = true;           // false: every step alone
    bool fuse_backward = true;  // false: the forward groups only (bias_gelu)
};

namespace fusion_detail {

// A step's reads and writes as the fused GEMM performs them: without the intermediates it
// absorbs (never written, never read) and without what another step of the group produces
// (computed inside the GEMM).
struct accesses {
    std::vector<tensor_id> reads, writes;
};

class planner {
public:
    explicit planner(const program& p) : p_(p), g_(*p.source) {
        const std::size_t tensors = g_.tensors.size();
        readers_.resize(tensors);
        first_.assign(tensors, -1);
        last_.assign(tensors, -1);
        for (std::size_t s = 0; s < p_.steps.size(); ++s) {
            const node& n = node_of(s);
            for (tensor_id t : n.inputs) {
                auto& r = readers_[index(t)];
                if (r.empty() || r.back() != s) r.push_back(s);
                last_[index(t)] = static_cast<std::int64_t>(s);
            }
            for (tensor_id t : n.outputs) {
                first_[index(t)] = static_cast<std::int64_t>(s);
                last_[index(t)] = std::max(last_[index(t)], static_cast<std::int64_t>(s));
            }
        }
    }

    fusion_plan plan(const fusion_options& options) {
        fusion_plan out;
        out.enabled = options.fuse;
        out.steps.assign(p_.steps.size(), {});
        if (!options.fuse) return out;
        // The epilogues read and write every matrix and vector in the GEMM's one element
        // type; the GPU runs f32 and bf16 programs only.
        if (p_.prec != precision::f32 && p_.prec != precision::bf16) {
            out.declined.push_back(std::string("the program is ") + std::string(to_string(p_.prec)) +
                                   "; the CUDA executor runs f32 and bf16 programs");
            return out;
        }
        std::vector<fused_gemm> candidates;
        for (std::size_t s = 0; s < p_.steps.size(); ++s) {
            const node& n = node_of(s);
            if (n.op->communication) continue;
            std::optional<fused_gemm> found;
            if (n.op->name == "linear_bias") found = forward_group(s, out.declined);
            else if (n.op->name == "linear_grad_input" && options.fuse_backward) found = backward_group(s, out.declined);
            if (found) candidates.push_back(std::move(*found));
        }
        std::sort(candidates.begin(), candidates.end(),
                  [](const fused_gemm& x, const fused_gemm& y) { return x.steps.front() < y.steps.front(); });
        // Accepted groups start no later than the candidate (sorted), so it interleaves with
        // one of them exactly when it starts before the furthest any of them reaches.
        std::optional<std::size_t> reach;
        for (fused_gemm& f : candidates) {
            // Groups must not interleave: the ordering check below treats every step between
            // a group's first and last as running where the program puts it, which a second
            // group moving its own steps would falsify.
            if (reach && f.steps.front() <= *reach) {
                out.declined.push_back(name_of(f) + ": its steps interleave with another fused group's");
                continue;
            }
            std::string why;
            if (!place(f, why)) {
                out.declined.push_back(name_of(f) + ": " + why);
                continue;
            }
            const auto g = static_cast<std::int32_t>(out.groups.size());
            for (std::size_t s : f.steps)
                out.steps[s] = {s == f.launch ? step_role::launch : step_role::absorbed, g};
            reach = std::max(reach.value_or(0), f.steps.back());
            out.groups.push_back(std::move(f));
        }
        return out;
    }

private:
    const program& p_;
    const graph& g_;
    std::vector<std::vector<std::size_t>> readers_;  // per tensor: the steps that read it, ascending
    std::vector<std::int64_t> first_, last_;         // per tensor: the step writing it, the last touching it

    static std::size_t index(tensor_id t) { return static_cast<std::size_t>(t); }
    const node& node_of(std::size_t s) const { return g_.at(p_.steps[s].node); }
    const std::string& tensor_name(tensor_id t) const { return g_.tensor(t).name; }
    std::string step_name(std::size_t s) const {
        const node& n = node_of(s);
        return "'" + n.name + "' (" + std::string(n.op->name) + ", step " + std::to_string(s) + ")";
    }
    std::string name_of(const fused_gemm& f) const { return "node '" + node_of(f.steps.front()).name + "'"; }
    const std::vector<std::size_t>& readers(tensor_id t) const { return readers_[index(t)]; }

    static std::int64_t extent(const node& n, std::string_view label) {
        auto v = n.sig.find(label);
        return v ? n.sig.vars[static_cast<std::size_t>(*v)].extent : 0;
    }
    std::int64_t numel(tensor_id t) const { return g_.tensor(t).dims.numel(); }

    // Every operand of the GEMM is a real tensor stored in the program's element type: the
    // epilogue has no per-operand types (a float output of a bf16 program would not do).
    std::optional<std::string> wrong_type(std::initializer_list<tensor_id> ts) const {
        for (tensor_id t : ts) {
            if (g_.tensor(t).kind != value_kind::real)
                return "'" + tensor_name(t) + "' holds indices, not reals";
            if (storage_precision(g_, t, p_.prec) != p_.prec)
                return "'" + tensor_name(t) + "' is kept in " +
                       std::string(to_string(storage_precision(g_, t, p_.prec))) +
                       " in this " + std::string(to_string(p_.prec)) + " program";
        }
        return std::nullopt;
    }

    // cuBLASLt reads and writes the pre-activation with rows ldaux apart, ldaux a multiple of
    // 8 (gemm.hpp); the program stores it packed, rows n apart, so n itself must be one.
    static std::optional<std::string> wrong_aux_rows(std::int64_t n) {
        if (n % 8 == 0) return std::nullopt;
        return "the pre-activation's rows are " + std::to_string(n) +
               " elements long; cuBLASLt's GELU epilogues need a multiple of 8";
    }

    // pre = linear_bias(x, W, b) read by one gelu (and, in training, by gelu_grad).
    std::optional<fused_gemm> forward_group(std::size_t f, std::vector<std::string>& declined) const {
        const node& lin = node_of(f);
        const tensor_id pre = lin.outputs[0];
        const std::vector<std::size_t>& pre_readers = readers(pre);
        std::vector<std::size_t> gelus;
        for (std::size_t r : pre_readers)
            if (node_of(r).op->name == "gelu") gelus.push_back(r);
        if (gelus.empty()) return std::nullopt;  // not the pattern: no GELU follows this linear
        const std::string where = "node '" + lin.name + "'";
        auto decline = [&](const std::string& why) {
            declined.push_back(where + ": " + why);
            return std::nullopt;
        };
        // A row-parallel piece leaves the bias to piece 0 (attribute bias = 0), and its
        // output is a partial sum no GELU may see before the all-reduce anyway.
        if (lin.attrs.get_or<std::int64_t>("bias", 1) == 0) return decline("the linear adds no bias (bias = 0)");
        // One GEMM writes one GELU output.
        if (gelus.size() != 1)
            return decline("the pre-activation '" + tensor_name(pre) + "' feeds " + std::to_string(gelus.size()) +
                           " GELUs");
        // The readers the fusion is for: the GELU, and the GELU gradients of the backward pass,
        // which read the pre-activation the epilogue writes as aux. All of them run at or after
        // the GELU, where the fused GEMM has written it. Any other reader could sit between the
        // linear and the GELU and find the pre-activation not yet written; rather than accept
        // some readers by position, a graph that reads the pre-activation elsewhere keeps its
        // separate bias GEMM and GELU.
        for (std::size_t r : pre_readers) {
            const node& n = node_of(r);
            const bool gelu = r == gelus.front();
            const bool gelu_grad_of_pre =
                n.op->name == "gelu_grad" && n.inputs.size() == 2 && n.inputs[1] == pre && n.inputs[0] != pre;
            if (!gelu && !gelu_grad_of_pre)
                return decline("the pre-activation '" + tensor_name(pre) + "' is also read by " + step_name(r) +
                               "; only its GELU and GELU gradients may read it");
        }
        const node& gelu = node_of(gelus.front());
        const tensor_id x = lin.inputs[0], w = lin.inputs[1], b = lin.inputs[2], act = gelu.outputs[0];
        if (auto why = wrong_type({x, w, b, pre, act})) return decline(*why);
        const std::int64_t k = extent(lin, "k"), n = extent(lin, "n");
        if (k <= 0 || n <= 0 || numel(x) % k != 0 || numel(x) == 0)
            return decline("the product is empty (k = " + std::to_string(k) + ", n = " + std::to_string(n) + ")");
        const std::int64_t m = numel(x) / k;
        // What the GEMM reads and writes must be what the ops read and write, element for
        // element (the GELU is elementwise over the flattened tensor).
        if (numel(w) != n * k || numel(b) != n || numel(pre) != m * n || numel(act) != m * n)
            return decline("the operands' sizes do not make a [" + std::to_string(m) + " x " + std::to_string(k) +
                           "] x [" + std::to_string(k) + " x " + std::to_string(n) + "] product");
        if (auto why = wrong_aux_rows(n)) return decline(*why);

        fused_gemm out;
        out.epilogue = gemm_epilogue::bias_gelu;
        out.steps = {f, gelus.front()};
        out.m = m;
        out.n = n;
        out.k = k;
        out.transpose_b = true;  // y = x W^T, W stored [n, k]: the layout gemm.hpp names for this epilogue
        out.a = x;
        out.b = w;
        out.c = act;
        out.aux = pre;
        out.bias = b;
        return out;
    }

    // dact = linear_grad_input(dy, W2) read only by gelu_grad(dact, pre), whose output a
    // sum_leading reduces into a bias gradient.
    std::optional<fused_gemm> backward_group(std::size_t a, std::vector<std::string>& declined) const {
        const node& grad_input = node_of(a);
        const tensor_id dact = grad_input.outputs[0];
        const std::vector<std::size_t>& dact_readers = readers(dact);
        const auto is_gelu_grad_of_dact = [&](std::size_t r) {
            const node& n = node_of(r);
            return n.op->name == "gelu_grad" && n.inputs.size() == 2 && n.inputs[0] == dact;
        };
        const auto gg = std::find_if(dact_readers.begin(), dact_readers.end(), is_gelu_grad_of_dact);
        if (gg == dact_readers.end()) return std::nullopt;  // not the pattern: no GELU gradient follows
        const std::string where = "node '" + grad_input.name + "'";
        auto decline = [&](const std::string& why) {
            declined.push_back(where + ": " + why);
            return std::nullopt;
        };
        // dact is never written by the fused GEMM, so nothing else may read it: not another
        // step, not the caller (a bound tensor is an output or a gradient someone reads).
        for (std::size_t r : dact_readers)
            if (r != *gg)
                return decline("the GELU's output gradient '" + tensor_name(dact) + "' is also read by " +
                               step_name(r) + "; the fused GEMM never writes it");
        const node& gelu_grad = node_of(*gg);
        if (gelu_grad.inputs[1] == dact)
            return decline("'" + tensor_name(dact) + "' is also the GELU gradient's pre-activation");
        if (p_.buffers[index(dact)].where != buffer::place::arena)
            return decline("the GELU's output gradient '" + tensor_name(dact) +
                           "' is bound (the caller reads it); the fused GEMM never writes it");
        const tensor_id pre = gelu_grad.inputs[1], dpre = gelu_grad.outputs[0];
        // The epilogue computes the bias gradient with the GELU gradient; there has to be a
        // bias gradient to take (dgelu_bgrad always writes one).
        const std::int64_t cols = extent(grad_input, "k"), inner = extent(grad_input, "n");
        std::optional<std::size_t> sum;
        for (std::size_t r : readers(dpre)) {
            const node& n = node_of(r);
            if (n.op->name == "sum_leading" && extent(n, "n") == cols && numel(n.outputs[0]) == cols) {
                sum = r;
                break;
            }
        }
        if (!sum)
            return decline("no sum_leading reduces '" + tensor_name(dpre) +
                           "' to a bias gradient; dgelu_bgrad computes one with the GELU gradient");
        const node& reduce = node_of(*sum);
        const tensor_id dy = grad_input.inputs[0], w = grad_input.inputs[1], db = reduce.outputs[0];
        if (auto why = wrong_type({dy, w, pre, dpre, db})) return decline(*why);
        if (cols <= 0 || inner <= 0 || numel(dy) % inner != 0 || numel(dy) == 0)
            return decline("the product is empty (n = " + std::to_string(inner) + ", k = " + std::to_string(cols) +
                           ")");
        const std::int64_t m = numel(dy) / inner;
        if (numel(w) != inner * cols || numel(dact) != m * cols || numel(pre) != m * cols ||
            numel(dpre) != m * cols)
            return decline("the operands' sizes do not make a [" + std::to_string(m) + " x " +
                           std::to_string(inner) + "] x [" + std::to_string(inner) + " x " + std::to_string(cols) +
                           "] product with a pre-activation of its shape");
        if (auto why = wrong_aux_rows(cols)) return decline(*why);

        fused_gemm out;
        out.epilogue = gemm_epilogue::dgelu_bgrad;
        out.steps = {a, *gg, *sum};
        std::sort(out.steps.begin(), out.steps.end());
        out.m = m;
        out.n = cols;
        out.k = inner;
        out.transpose_b = false;  // dx = dy W, W stored [n, k]: the layout gemm.hpp names for this epilogue
        out.a = dy;
        out.b = w;
        out.c = dpre;
        out.aux = pre;
        out.bias_grad = db;
        out.absorbed = {dact};
        return out;
    }

    bool member(const fused_gemm& f, std::size_t s) const {
        return std::find(f.steps.begin(), f.steps.end(), s) != f.steps.end();
    }

    accesses effective(const fused_gemm& f, std::size_t s) const {
        const node& n = node_of(s);
        auto absorbed = [&](tensor_id t) {
            return std::find(f.absorbed.begin(), f.absorbed.end(), t) != f.absorbed.end();
        };
        auto internal = [&](tensor_id t) {
            const std::int64_t producer = first_[index(t)];
            return producer >= 0 && member(f, static_cast<std::size_t>(producer));
        };
        accesses out;
        for (tensor_id t : n.inputs)
            if (!absorbed(t) && !internal(t)) out.reads.push_back(t);
        for (tensor_id t : n.outputs)
            if (!absorbed(t)) out.writes.push_back(t);
        return out;
    }

    // Whether two tensors may share bytes while the program runs: the same tensor, or two
    // arena tensors whose ranges overlap (the liveness plan reuses a dead tensor's bytes).
    // Bound tensors are each the caller's own storage.
    bool share_storage(tensor_id x, tensor_id y) const {
        if (x == y) return true;
        const buffer& bx = p_.buffers[index(x)];
        const buffer& by = p_.buffers[index(y)];
        if (bx.where != buffer::place::arena || by.where != buffer::place::arena) return false;
        return bx.offset < by.offset + by.bytes && by.offset < bx.offset + bx.bytes;
    }

    // The first conflict between a group step's accesses and a step t it moves across, if
    // any: t reads or writes storage the group step writes, or writes storage it reads.
    // Either way swapping their order changes what someone reads.
    std::optional<std::string> conflict(const accesses& moved, std::size_t t) const {
        const node& n = node_of(t);
        for (tensor_id w : moved.writes) {
            for (tensor_id r : n.inputs)
                if (share_storage(w, r))
                    return step_name(t) + " reads '" + tensor_name(r) + "'" +
                           (r == w ? "" : ", whose bytes the liveness plan shares with '" + tensor_name(w) + "',") +
                           " which the group writes";
            for (tensor_id o : n.outputs)
                if (share_storage(w, o))
                    return step_name(t) + " writes '" + tensor_name(o) + "' over '" + tensor_name(w) +
                           "', which the group writes";
        }
        for (tensor_id r : moved.reads)
            for (tensor_id o : n.outputs)
                if (share_storage(r, o))
                    return step_name(t) + " writes '" + tensor_name(o) + "' over '" + tensor_name(r) +
                           "', which the group reads";
        return std::nullopt;
    }

    // Chooses where the group's GEMM runs, or says why it cannot run anywhere.
    bool place(fused_gemm& f, std::string& why) const {
        std::vector<accesses> member_accesses;
        accesses all;
        for (std::size_t s : f.steps) {
            member_accesses.push_back(effective(f, s));
            all.reads.insert(all.reads.end(), member_accesses.back().reads.begin(), member_accesses.back().reads.end());
            all.writes.insert(all.writes.end(), member_accesses.back().writes.begin(),
                              member_accesses.back().writes.end());
        }
        // One kernel reads all its operands while it writes its outputs, so no output may
        // share bytes with an operand or another output. The separate steps had no such
        // need: a step may write over a tensor the previous step read for the last time.
        for (std::size_t i = 0; i < all.writes.size(); ++i) {
            for (tensor_id r : all.reads)
                if (share_storage(all.writes[i], r)) {
                    why = "the liveness plan puts '" + tensor_name(all.writes[i]) + "' over '" + tensor_name(r) +
                          "', which the same GEMM would read";
                    return false;
                }
            for (std::size_t j = i + 1; j < all.writes.size(); ++j)
                if (share_storage(all.writes[i], all.writes[j])) {
                    why = "the liveness plan puts '" + tensor_name(all.writes[i]) + "' over '" +
                          tensor_name(all.writes[j]) + "', both written by the same GEMM";
                    return false;
                }
        }
        // Running the group at step p moves each other member across the steps between it
        // and p. That keeps every read's value only if no such pair touches the same bytes
        // with a write on either side. The latest such p is chosen: members before p then run
        // late, which costs nothing, while members after p run early, and so do the
        // before-step hooks of every step up to them (executor.hpp), which makes the stream
        // wait for overlapped transfers earlier than it had to.
        std::string reasons;
        for (std::size_t i = f.steps.size(); i-- > 0;) {
            const std::size_t p = f.steps[i];
            std::optional<std::string> blocked;
            for (std::size_t j = 0; j < f.steps.size() && !blocked; ++j) {
                const std::size_t s = f.steps[j];
                const std::size_t lo = std::min(s, p), hi = std::max(s, p);
                for (std::size_t t = lo + 1; t < hi && !blocked; ++t)
                    if (!member(f, t)) blocked = conflict(member_accesses[j], t);
            }
            // The executor calls the before-step hooks of every step up to the group's last
            // before the launch (in order, as set_before_step promises). A transfer's handler
            // must run right after its own hook (the device transfer runner learns its step
            // there), so no transfer may sit between the launch and the group's last step.
            for (std::size_t t = p + 1; t < f.steps.back() && !blocked; ++t)
                if (node_of(t).op->communication)
                    blocked = step_name(t) + " is a transfer, whose before-step hook would run before the steps "
                                             "ahead of it";
            // Where cuBLASLt has no kernel for the fused problem at run time (pointer
            // alignments are known only then), the executor runs the group's steps one by one
            // at p, writing the absorbed intermediates after all. Their bytes are theirs only
            // between their producer and their last reader, so p must lie there.
            for (tensor_id t : f.absorbed)
                if (!blocked && (static_cast<std::int64_t>(p) < first_[index(t)] ||
                                 static_cast<std::int64_t>(p) > last_[index(t)]))
                    blocked = "'" + tensor_name(t) + "' is not live at step " + std::to_string(p) +
                              ", where the unfused fallback would write it";
            if (!blocked) {
                f.launch = p;
                return true;
            }
            reasons += (reasons.empty() ? "" : "; ") + std::string("at step ") + std::to_string(p) + ", " + *blocked;
        }
        why = "no step of the group can run it without reordering a dependency: " + reasons;
        return false;
    }
};

}  // namespace fusion_detail

// The fusion plan of a compiled program (whose graph is p.source). Pure host logic: no CUDA
// call, no device needed.
inline fusion_plan plan_gemm_fusion(const program& p, const fusion_options& options = {}) {
    if (!p.source) throw usage_error("plan_gemm_fusion: the program has no graph; compile it with compile_program");
    return fusion_detail::planner(p).plan(options);
}

// The GEMM of a fused group over the executor's per-tensor device pointers (indexed by
// tensor id, as executor::data).
template <class T>
gemm_args<T> fused_gemm_args(const fused_gemm& f, std::span<void* const> tensor_data) {
    auto at = [&](tensor_id t) { return t == no_id ? nullptr : tensor_data[static_cast<std::size_t>(t)]; };
    gemm_args<T> g;
    g.transpose_b = f.transpose_b;
    g.m = f.m;
    g.n = f.n;
    g.k = f.k;
    g.a = static_cast<const T*>(at(f.a));
    g.b = static_cast<const T*>(at(f.b));
    g.c = static_cast<T*>(at(f.c));
    g.epilogue = f.epilogue;
    g.bias = static_cast<const T*>(at(f.bias));
    g.bias_grad = static_cast<T*>(at(f.bias_grad));
    g.aux = static_cast<T*>(at(f.aux));
    g.ldaux = f.n;  // packed; the plan fuses only when n is a multiple of 8
    return g;
}

}  // namespace loom::cuda
