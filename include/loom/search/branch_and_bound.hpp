#pragma once
// Branch-and-bound over a search space (plan_space.hpp) with the cost model of
// evaluate.hpp, and the exhaustive enumeration it must agree with.
//
//   cost_context ctx(profile_model(g), dgx2_v100(2), {.memory_per_device = 32e9});
//   search_result r = branch_and_bound(ctx, search_space{});
//   r.best, r.cost.step_time, r.stats.nodes, r.stats.pruned_by_bound, r.explain()
//
// The tree fixes, in order: TP degree, pipeline stages (DP is what is left), ZeRO stage,
// micro-batches, schedule, interlacing, Coshard factor, stage boundaries; then the recompute
// choices, which no longer interact: the makespan only grows when a block grows, gradient
// sync does not depend on them, and memory is per device, so each pipeline device
// independently takes the choices that fit its memory with the least extra backward time
// (an exact small knapsack). Recomputation's transient (the largest set one recomputed layer
// brings back) is a maximum, not a sum: the knapsack is solved once per candidate maximum t,
// allowing only choices whose transient is at most t within the memory left after t, and the
// least time wins. The optimum's own maximum is one of the candidates, so this is exact.
//
// Pruning, each bound valid for every completion of the node:
//   work        no device finishes before its share of all forward and backward work
//               (total / devices) plus the exposed communication that is already fixed;
//   pipeline    a device with stages S runs m micro-batches of each: m * sum_S (f + b),
//               and in a linear pipeline stage s also waits for one micro-batch to cross
//               the stages before it, forward and back;
//   memory      model states plus the activations left when every layer recomputes as
//               much as the space allows must fit, or the whole subtree is infeasible.
// A node whose bound reaches the best step time found so far is cut.
//
// Folding (search_options::fold): layers of one class (folding.hpp) on one chunk are
// interchangeable, so the knapsack decides how many of them take each choice instead of
// deciding layer by layer: polynomial in the layers per device instead of exponential.
// The answer is the same (tests check it against the unfolded search and against
// enumerate_all on small spaces).
//
// Deterministic: candidates are visited in a fixed order and ties keep the first found.
// With a time budget the search stops where it is and reports the best configuration so far
// and its proven gap: (best - the least lower bound of the parts not searched) / best.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <functional>
#include <limits>
#include <sstream>
#include <string>
#include <vector>

#include <loom/core/linkage.hpp>
#include <loom/search/evaluate.hpp>

namespace loom::search {

struct search_statistics {
    long nodes = 0;              // tree nodes visited
    long pruned_by_bound = 0;    // cut because their lower bound reached the best time
    long pruned_by_memory = 0;   // cut because nothing below them fits in memory
    long leaves = 0;             // complete configurations timed
    long knapsack_nodes = 0;     // nodes of the recompute subproblems
    int schedules_built = 0;
    double seconds = 0;
    bool complete = true;        // false: the time budget ran out
    double gap = 0;              // proven relative gap of the answer (0 when complete)
};

struct search_result {
    bool found = false;
    configuration best;
    evaluation cost;
    search_statistics stats;
    std::string model_summary;
    std::string cluster_name;

    std::string explain() const;
};

namespace detail {

inline std::vector<int> powers_of_two_up_to(int limit) {
    std::vector<int> out;
    for (int v = 1; v <= limit; v *= 2) out.push_back(v);
    return out;
}

// The candidates of each level, in visiting order.
struct candidates {
    const cost_context& ctx;
    const search_space& space;

    std::vector<int> tp() const {
        const int devices = ctx.hardware().devices();
        const int limit = space.max_tp > 0 ? space.max_tp : ctx.hardware().topo.devices_per_node;
        std::vector<int> out;
        for (int t : space.tp.empty() ? powers_of_two_up_to(limit) : space.tp)
            if (t >= 1 && devices % t == 0 && ctx.model().allows_tp(t)) out.push_back(t);
        return out;
    }
    std::vector<int> pp(int tp) const {
        const int devices = ctx.hardware().devices();
        const int layers = static_cast<int>(ctx.repeated().size());
        std::vector<int> out;
        for (int p : space.pp.empty() ? powers_of_two_up_to(std::max(layers, 1)) : space.pp) {
            if (p < 1 || devices % (tp * p) != 0) continue;
            if (p > std::max(layers, 1)) continue;
            if (ctx.model().batch % (devices / (tp * p)) != 0) continue;  // DP splits the batch
            out.push_back(p);
        }
        return out;
    }
    std::vector<zero_stage> zero(int dp) const {
        std::vector<zero_stage> out;
        for (zero_stage z : space.zero)
            if (dp > 1 || z == zero_stage::none) out.push_back(z);  // without DP every stage is "none"
        if (out.empty() && dp == 1) out.push_back(zero_stage::none);
        return out;
    }
    std::vector<int> micro_batches(int dp) const {
        const std::int64_t per_replica = ctx.model().batch / dp;
        std::vector<int> out;
        for (int m : space.micro_batches.empty() ? powers_of_two_up_to(static_cast<int>(per_replica)) : space.micro_batches)
            if (m >= 1 && per_replica % m == 0) out.push_back(m);
        return out;
    }
    // Interlacing needs an embedding or head to spread, and a pipeline to interlace with.
    std::vector<int> coshard() const {
        std::vector<int> out;
        for (int c : space.coshard)
            if (c >= 1 && std::find(out.begin(), out.end(), c) == out.end()) out.push_back(c);
        if (out.empty()) out.push_back(1);
        return out;
    }
    std::vector<bool> interlaced(int pp) const {
        std::vector<bool> out;
        if (ctx.rounds() > 1) return {false};  // not combined with forward rounds
        for (bool i : space.interlaced)
            if (!i || (pp > 1 && (ctx.prologue() >= 0 || ctx.epilogue() >= 0))) out.push_back(i);
        if (out.empty()) out.push_back(false);
        return out;
    }

    // (schedule, chunks per device) pairs.
    std::vector<std::pair<plan::schedule_kind, int>> schedules(int pp, int m) const {
        std::vector<std::pair<plan::schedule_kind, int>> out;
        const int layers = static_cast<int>(ctx.repeated().size());
        for (plan::schedule_kind s : space.schedules) {
            if (pp == 1) {  // one stage: every schedule is the same sequence of micro-batches
                if (out.empty()) out.push_back({plan::schedule_kind::one_f_one_b, 1});
                continue;
            }
            // A model with forward rounds pipelines only with 3F1B (its three rounds), and 3F1B
            // only such a model: the other orders have one forward block per micro-batch.
            if ((s == plan::schedule_kind::three_f_one_b) != (ctx.rounds() > 1)) continue;
            if (s == plan::schedule_kind::three_f_one_b && ctx.rounds() != 3) continue;
            if (s == plan::schedule_kind::interleaved) {
                const int v = space.interleave_chunks;
                if (v < 2 || m % pp != 0 || layers < pp * v) continue;
                if (!space.search_stage_boundaries && layers % (pp * v) != 0) continue;
                out.push_back({s, v});
            } else {
                if (!space.search_stage_boundaries && layers % pp != 0) continue;
                out.push_back({s, 1});
            }
        }
        return out;
    }
};

// Every split of `layers` into `parts` positive counts (the even split first). With a
// slack, each count stays within `slack` of the even share (floor or ceiling).
// `cut(k, split)` (optional) is asked after counts 0..k are chosen (k < parts - 1) and may
// cut every split that starts so.
LOOM_INLINE void for_each_split(int layers, int parts, bool all, int slack,
                                const std::function<bool(const std::vector<int>&)>& visit,
                                const std::function<bool(int, const std::vector<int>&)>& cut = {});

// A group of interchangeable layers on one device: same class, same chunk.
struct recompute_group {
    std::vector<int> layers;    // repeated-layer positions (into ctx.repeated())
    double weight = 0;          // bytes per kept element (in-flight * share * bytes / tp)
    double time_scale = 0;      // seconds per unit of layer time (share / tp)
    double transient_scale = 0;  // bytes per transient element (share * bytes / (tp coshard))
};

// The least extra backward time over groups, with memory <= budget. Choices per group:
// counts of each recompute option (folded) or per layer (groups of one).
struct recompute_solver {
    recompute_solver(const cost_context& c, const std::vector<plan::recompute_policy>& r) : ctx(c), choices(r) {}

    const cost_context& ctx;
    const std::vector<plan::recompute_policy>& choices;
    std::vector<recompute_group> groups;
    double budget = 0;
    double max_transient = std::numeric_limits<double>::infinity();  // choices above it are not allowed
    long* nodes = nullptr;
    std::function<bool()> out_of_time;  // checked every 4096 nodes; true: give up
    bool gave_up = false;

    std::vector<std::vector<int>> best_counts, counts;  // per group: count per choice
    double best_time = std::numeric_limits<double>::infinity();
    std::vector<double> least_memory_after;  // least memory of groups i.. (all max-saving)

    // Representative numbers of a group (its layers are identical in folded mode; in
    // unfolded mode groups hold one layer).
    double memory_of(const recompute_group& g, plan::recompute_policy r) const {
        if (transient_of(g, r) > max_transient) return std::numeric_limits<double>::infinity();
        return g.weight * ctx.kept_elements(ctx.repeated()[static_cast<std::size_t>(g.layers.front())], r);
    }
    double transient_of(const recompute_group& g, plan::recompute_policy r) const {
        return g.transient_scale * ctx.transient_elements(ctx.repeated()[static_cast<std::size_t>(g.layers.front())], r);
    }
    double time_of(const recompute_group& g, plan::recompute_policy r) const {
        return g.time_scale * ctx.recompute_time(ctx.repeated()[static_cast<std::size_t>(g.layers.front())], r);
    }

    bool solve() {
        best_time = std::numeric_limits<double>::infinity();
        best_counts.clear();
        least_memory_after.assign(groups.size() + 1, 0.0);
        for (std::size_t i = groups.size(); i-- > 0;) {
            double least = std::numeric_limits<double>::infinity();
            for (plan::recompute_policy r : choices) least = std::min(least, memory_of(groups[i], r));
            least_memory_after[i] = least_memory_after[i + 1] + least * static_cast<double>(groups[i].layers.size());
        }
        if (least_memory_after[0] > budget) return false;
        counts.assign(groups.size(), std::vector<int>(choices.size(), 0));
        go(0, 0.0, 0.0);
        return best_time < std::numeric_limits<double>::infinity();
    }

    void go(std::size_t i, double memory, double time) {
        if (gave_up) return;
        if (nodes && (++*nodes & 4095) == 0 && out_of_time && out_of_time()) {
            gave_up = true;
            return;
        }
        if (time >= best_time) return;
        if (memory + least_memory_after[i] > budget) return;
        if (i == groups.size()) {
            best_time = time;
            best_counts = counts;
            return;
        }
        const int n = static_cast<int>(groups[i].layers.size());
        // Counts per choice summing to n, choices earlier in the list first and in larger numbers.
        // n layers taking choice r: their memory (0 when none do, even for a choice above the
        // transient limit, whose memory is infinite).
        const auto memory_of_n = [&](int n, plan::recompute_policy r) { return n == 0 ? 0.0 : n * memory_of(groups[i], r); };
        std::function<void(std::size_t, int, double, double)> split = [&](std::size_t k, int left, double mem, double t) {
            if (k + 1 == choices.size()) {
                counts[i][k] = left;
                go(i + 1, mem + memory_of_n(left, choices[k]), t + left * time_of(groups[i], choices[k]));
                return;
            }
            for (int c = left; c >= 0; --c) {
                counts[i][k] = c;
                split(k + 1, left - c, mem + memory_of_n(c, choices[k]), t + c * time_of(groups[i], choices[k]));
            }
        };
        split(0, n, memory, time);
    }
};

}  // namespace detail

class branch_and_bound_search {
public:
    branch_and_bound_search(cost_context& ctx, const search_space& space) : ctx_(ctx), space_(space) {}

    search_result run() {
        const auto start = std::chrono::steady_clock::now();
        start_ = start;
        detail::candidates cand{ctx_, space_};
        const int devices = ctx_.hardware().devices();
        double total_work = 0;
        for (std::size_t l = 0; l < ctx_.model().layers.size(); ++l)
            total_work += ctx_.times(static_cast<int>(l)).forward * rounds_of(static_cast<int>(l)) +
                          ctx_.times(static_cast<int>(l)).backward;
        for (int tp : cand.tp()) {
            for (int pp : cand.pp(tp)) {
                ++stats_.nodes;
                const int dp = devices / (tp * pp);
                const double work_bound = total_work / devices;
                if (cut(work_bound)) continue;
                for (zero_stage z : cand.zero(dp))
                    for (int m : cand.micro_batches(dp))
                        for (auto [kind, chunks] : cand.schedules(pp, m))
                        for (bool interlaced : cand.interlaced(pp))
                        for (int coshard : cand.coshard()) {
                            configuration c;
                            c.interlaced = interlaced;
                            c.coshard = coshard;
                            c.tp = tp;
                            c.pp = pp;
                            c.dp = dp;
                            c.zero = z;
                            c.micro_batches = m;
                            c.schedule = kind;
                            c.chunks = chunks;
                            const int layers = static_cast<int>(ctx_.repeated().size());
                            const auto chunk_bound = boundary_bound(c);
                            detail::for_each_split(
                                layers, pp * chunks, space_.search_stage_boundaries, space_.boundary_slack,
                                [&](const std::vector<int>& split) {
                                    c.layers_per_chunk = split;
                                    visit(c, work_bound);
                                    return true;
                                },
                                [&](int k, const std::vector<int>& split) { return cut(chunk_bound(k, split)); });
                        }
            }
        }
        result_.stats = stats_;
        result_.stats.schedules_built = ctx_.schedules_built();
        result_.stats.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
        if (!result_.stats.complete && result_.found)
            result_.stats.gap = std::max(0.0, (result_.cost.step_time - open_bound_) / result_.cost.step_time);
        result_.cluster_name = ctx_.hardware().name;
        return result_;
    }

private:
    // Forward passes a layer makes per micro-batch: the model's rounds for repeated layers.
    int rounds_of(int layer) const {
        return ctx_.model().layers[static_cast<std::size_t>(layer)].role == layer_role::repeated ? ctx_.rounds() : 1;
    }

    bool out_of_time() {
        if (ctx_.options().time_budget_seconds <= 0) return false;
        if (!stats_.complete) return true;
        const double elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
        if (elapsed > ctx_.options().time_budget_seconds) stats_.complete = false;
        return !stats_.complete;
    }

    // True when a node with this lower bound cannot beat the best (or time is up).
    bool cut(double bound) {
        if (out_of_time()) {
            open_bound_ = std::min(open_bound_, bound);
            return true;
        }
        if (result_.found && bound >= result_.cost.step_time) {
            ++stats_.pruned_by_bound;
            return true;
        }
        return false;
    }

    void visit(configuration& c, double work_bound) {
        ++stats_.nodes;
        // Costs with no recompute: the least time any completion can have.
        c.recompute_of.assign(ctx_.repeated().size(), plan::recompute_policy::none);
        evaluation base = evaluate_without_pipeline(ctx_, c);
        double fixed = 0;  // exposed communication and optimizer: the same for every completion
        for (const auto& d : base.devices) fixed = std::max(fixed, d.exposed_communication + d.optimizer);
        if (cut(std::max(work_bound, pipeline_bound(c, base) + c.micro_batches * base.interlaced_per_micro_batch) + fixed)) return;

        // Recompute: per device, the least extra time that fits.
        const auto layers = layers_of_chunks(ctx_, c);
        const auto& sched = ctx_.schedule_orders(c.schedule, c.pp, c.chunks, c.micro_batches);
        const double share = 1.0 / (static_cast<double>(c.dp) * c.micro_batches);
        std::vector<int> position(ctx_.model().layers.size(), -1);
        for (std::size_t i = 0; i < ctx_.repeated().size(); ++i) position[static_cast<std::size_t>(ctx_.repeated()[i])] = static_cast<int>(i);
        for (int d = 0; d < c.pp; ++d) {
            const device_cost& dc = base.devices[static_cast<std::size_t>(d)];
            double fixed_memory = dc.memory.total() - dc.memory.activations;
            detail::recompute_solver solver(ctx_, space_.recompute_choices);
            solver.nodes = &stats_.knapsack_nodes;
            solver.out_of_time = [this] { return out_of_time(); };
            for (int k = d; k < c.pp * c.chunks; k += c.pp) {
                const double weight = sched.in_flight[static_cast<std::size_t>(k)] * share * ctx_.options().activation_bytes / c.tp;
                std::vector<detail::recompute_group> chunk_groups;
                std::vector<int> group_class;
                for (int l : layers[static_cast<std::size_t>(k)]) {
                    const int pos = position[static_cast<std::size_t>(l)];
                    if (pos < 0) {  // prologue, epilogue: keep everything
                        fixed_memory += weight * ctx_.kept_elements(l, plan::recompute_policy::none);
                        continue;
                    }
                    const int cls = ctx_.model().layers[static_cast<std::size_t>(l)].class_id;
                    auto it = std::find(group_class.begin(), group_class.end(), cls);
                    if (ctx_.options().fold && it != group_class.end()) {
                        chunk_groups[static_cast<std::size_t>(it - group_class.begin())].layers.push_back(pos);
                    } else {
                        group_class.push_back(cls);
                        chunk_groups.push_back({{pos}, weight, share / c.tp,
                                                share * ctx_.options().activation_bytes / (static_cast<double>(c.tp) * c.coshard)});
                    }
                }
                for (auto& g : chunk_groups) solver.groups.push_back(std::move(g));
            }
            // One knapsack per candidate largest transient, least time first found.
            std::vector<double> thresholds{0.0};
            for (const auto& g : solver.groups)
                for (plan::recompute_policy r : space_.recompute_choices) thresholds.push_back(solver.transient_of(g, r));
            std::sort(thresholds.begin(), thresholds.end());
            thresholds.erase(std::unique(thresholds.begin(), thresholds.end()), thresholds.end());
            bool solved = false;
            double best_time = std::numeric_limits<double>::infinity();
            std::vector<std::vector<int>> best_counts;
            for (double t : thresholds) {
                if (fixed_memory + t > ctx_.memory_cap()) break;
                solver.max_transient = t;
                solver.budget = ctx_.memory_cap() - fixed_memory - t;
                if (solver.solve() && solver.best_time < best_time) {
                    solved = true;
                    best_time = solver.best_time;
                    best_counts = solver.best_counts;
                }
                if (solver.gave_up) break;
            }
            solver.best_counts = best_counts;
            if (solver.gave_up) {  // the budget ran out inside: this node stays open
                open_bound_ = std::min(open_bound_, std::max(work_bound, pipeline_bound(c, base) +
                                                                             c.micro_batches * base.interlaced_per_micro_batch) + fixed);
                return;
            }
            if (!solved) {
                ++stats_.pruned_by_memory;
                return;
            }
            for (std::size_t gi = 0; gi < solver.groups.size(); ++gi) {
                std::size_t next = 0;
                for (std::size_t k = 0; k < space_.recompute_choices.size(); ++k)
                    for (int n = 0; n < solver.best_counts[gi][k]; ++n)
                        c.recompute_of[static_cast<std::size_t>(solver.groups[gi].layers[next++])] = space_.recompute_choices[k];
            }
        }
        ++stats_.leaves;
        evaluation e = evaluate(ctx_, c);
        if (e.feasible && (!result_.found || e.step_time < result_.cost.step_time)) {
            result_.found = true;
            result_.best = c;
            result_.cost = std::move(e);
        }
    }

    // For stage-boundary search: a lower bound of every split that starts with counts
    // 0..k. Each chosen chunk runs all m micro-batches on its device, forward and backward,
    // without recompute: m * (its layers' time per micro-batch + its TP all-reduces).
    std::function<double(int, const std::vector<int>&)> boundary_bound(const configuration& c) {
        const model_profile& m = ctx_.model();
        const double share = 1.0 / (static_cast<double>(c.dp) * c.micro_batches);
        const double all_reduce = tensor_parallel_all_reduce_time(ctx_, c);
        const auto time_of = [&, share, all_reduce](int layer) {
            const int rounds = rounds_of(layer);
            return (ctx_.times(layer).forward * rounds + ctx_.times(layer).backward) * share / c.tp +
                   (rounds + 1.0) * m.layers[static_cast<std::size_t>(layer)].residual_joins * all_reduce;
        };
        std::vector<double> prefix{0.0};
        for (int l : ctx_.repeated()) prefix.push_back(prefix.back() + time_of(l));
        const double head = ctx_.prologue() >= 0 && !c.interlaced ? time_of(ctx_.prologue()) : 0.0;
        const int micro = c.micro_batches;
        return [prefix, head, micro](int k, const std::vector<int>& split) {
            double bound = 0;
            int start = 0;
            for (int i = 0; i <= k; ++i) {
                const int n = split[static_cast<std::size_t>(i)];
                double work = prefix[static_cast<std::size_t>(start + n)] - prefix[static_cast<std::size_t>(start)];
                if (i == 0) work += head;
                bound = std::max(bound, micro * work);
                start += n;
            }
            return bound;
        };
    }

    // Lower bound of the pipeline makespan from per-chunk times without recompute.
    static double pipeline_bound(const configuration& c, const evaluation& base) {
        const int chunks = c.pp * c.chunks;
        double bound = 0;
        for (int d = 0; d < c.pp; ++d) {
            double work = 0;
            for (int k = d; k < chunks; k += c.pp)
                work += base.forward_blocks * base.chunk_forward[static_cast<std::size_t>(k)] +
                        base.chunk_backward[static_cast<std::size_t>(k)];
            bound = std::max(bound, c.micro_batches * work);
        }
        if (c.chunks == 1) {
            // Stage s waits for one forward block of every stage before it, and after its last
            // backward the gradient still crosses them.
            double before = 0;
            for (int s = 0; s < c.pp; ++s) {
                const double own = base.forward_blocks * base.chunk_forward[static_cast<std::size_t>(s)] +
                                   base.chunk_backward[static_cast<std::size_t>(s)];
                bound = std::max(bound, before + c.micro_batches * own);
                before += base.chunk_forward[static_cast<std::size_t>(s)] + base.chunk_backward[static_cast<std::size_t>(s)];
            }
        }
        return bound;
    }

    cost_context& ctx_;
    const search_space& space_;
    search_statistics stats_;
    search_result result_;
    double open_bound_ = std::numeric_limits<double>::infinity();
    std::chrono::steady_clock::time_point start_;
};

inline search_result branch_and_bound(cost_context& ctx, const search_space& space) {
    return branch_and_bound_search(ctx, space).run();
}

// Every configuration of the space, each layer's recompute choice on its own: the answer
// branch_and_bound must reproduce. Exponential in the layers; for small spaces only.
LOOM_INLINE search_result enumerate_all(cost_context& ctx, const search_space& space);

}  // namespace loom::search

// Definitions: compiled here (header-only) or once in loom::compiled (core/linkage.hpp).
#if LOOM_HEADER_DEFINITIONS

namespace loom::search::detail {

LOOM_INLINE void for_each_split(int layers, int parts, bool all, int slack,
                                const std::function<bool(const std::vector<int>&)>& visit,
                                const std::function<bool(int, const std::vector<int>&)>& cut) {
    if (!all) {
        visit(std::vector<int>(static_cast<std::size_t>(parts), layers / parts));
        return;
    }
    const int low = slack > 0 ? std::max(1, layers / parts - slack) : 1;
    const int high = slack > 0 ? (layers + parts - 1) / parts + slack : layers;
    std::vector<int> split(static_cast<std::size_t>(parts), 0);
    if (layers % parts == 0 && !visit(std::vector<int>(static_cast<std::size_t>(parts), layers / parts))) return;
    std::function<bool(int, int)> go = [&](int k, int left) {
        if (k == parts - 1) {
            if (left < low || left > high) return true;
            split[static_cast<std::size_t>(k)] = left;
            if (layers % parts == 0 && std::all_of(split.begin(), split.end(), [&](int x) { return x == layers / parts; }))
                return true;  // visited first
            return visit(split);
        }
        const int rest = parts - 1 - k;
        for (int n = low; n <= std::min(high, left - rest * low); ++n) {
            if (left - n > rest * high) continue;
            split[static_cast<std::size_t>(k)] = n;
            if (cut && cut(k, split)) continue;
            if (!go(k + 1, left - n)) return false;
        }
        return true;
    };
    go(0, layers);
}
}  // namespace loom::search::detail

namespace loom::search {

LOOM_INLINE search_result enumerate_all(cost_context& ctx, const search_space& space) {
    const auto start = std::chrono::steady_clock::now();
    search_result best;
    detail::candidates cand{ctx, space};
    const int devices = ctx.hardware().devices();
    const int layers = static_cast<int>(ctx.repeated().size());
    for (int tp : cand.tp())
        for (int pp : cand.pp(tp)) {
            const int dp = devices / (tp * pp);
            for (zero_stage z : cand.zero(dp))
                for (int m : cand.micro_batches(dp))
                    for (auto [kind, chunks] : cand.schedules(pp, m))
                    for (bool interlaced : cand.interlaced(pp))
                    for (int coshard : cand.coshard()) {
                        configuration c{tp, pp, dp, m, chunks, z, kind, {}, {}, interlaced, coshard};
                        detail::for_each_split(layers, pp * chunks, space.search_stage_boundaries, space.boundary_slack, [&](const std::vector<int>& split) {
                            c.layers_per_chunk = split;
                            c.recompute_of.assign(static_cast<std::size_t>(layers), space.recompute_choices.front());
                            std::vector<std::size_t> choice(static_cast<std::size_t>(layers), 0);
                            while (true) {
                                ++best.stats.leaves;
                                for (int l = 0; l < layers; ++l)
                                    c.recompute_of[static_cast<std::size_t>(l)] = space.recompute_choices[choice[static_cast<std::size_t>(l)]];
                                evaluation e = evaluate(ctx, c);
                                if (e.feasible && (!best.found || e.step_time < best.cost.step_time)) {
                                    best.found = true;
                                    best.best = c;
                                    best.cost = std::move(e);
                                }
                                int l = 0;
                                while (l < layers && ++choice[static_cast<std::size_t>(l)] == space.recompute_choices.size())
                                    choice[static_cast<std::size_t>(l++)] = 0;
                                if (l == layers) break;
                            }
                            return true;
                        });
                    }
        }
    best.stats.nodes = best.stats.leaves;
    best.stats.schedules_built = ctx.schedules_built();
    best.stats.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    best.cluster_name = ctx.hardware().name;
    return best;
}

LOOM_INLINE std::string search_result::explain() const {
    std::ostringstream out;
    if (!found) {
        out << "no configuration of the space fits in memory on " << cluster_name
            << "; allow more recompute, ZeRO stages or devices\n";
        return out.str();
    }
    const configuration& c = best;
    out << "plan for " << cluster_name << ": TP " << c.tp << " x PP " << c.pp << " x DP " << c.dp << ", "
        << c.micro_batches << " micro-batches, " << to_string(c.schedule);
    if (c.chunks > 1) out << " (" << c.chunks << " chunks per device)";
    out << ", ZeRO " << static_cast<int>(c.zero);
    if (c.interlaced) out << ", interlaced (embedding and head on all " << c.devices() << " devices)";
    if (c.coshard > 1) out << ", Coshard " << c.coshard << " (recomputed layers run in " << c.coshard << " colocated pieces)";
    out << "\n  layers per chunk:";
    for (int n : c.layers_per_chunk) out << ' ' << n;
    int counts[3] = {0, 0, 0};
    for (plan::recompute_policy r : c.recompute_of) ++counts[static_cast<int>(r)];
    out << "\n  recompute: " << counts[0] << " layers none, " << counts[1] << " selective, " << counts[2] << " full\n";
    out << "  predicted step " << cost.step_time * 1e3 << " ms (pipeline " << cost.pipeline_time * 1e3 << " ms)";
    out << ", peak memory " << cost.peak_memory() / 1e9 << " GB\n";
    for (std::size_t d = 0; d < cost.devices.size(); ++d) {
        const auto& dc = cost.devices[d];
        out << "  stage " << d << ": memory " << dc.memory.total() / 1e9 << " GB (states "
            << (dc.memory.parameters + dc.memory.gradients + dc.memory.optimizer) / 1e9 << ", activations "
            << dc.memory.activations / 1e9 << ", recompute transient " << dc.transient / 1e9 << "), exposed comm " << dc.exposed_communication * 1e3 << " ms\n";
    }
    out << "  search: " << stats.nodes << " nodes, " << stats.pruned_by_bound << " cut by bound, " << stats.pruned_by_memory
        << " by memory, " << stats.leaves << " timed, " << stats.seconds * 1e3 << " ms";
    if (!stats.complete) out << ", stopped by the time budget with a proven gap of " << stats.gap * 100 << "%";
    out << "\n";
    return out.str();
}

}  // namespace loom::search
#endif  // LOOM_HEADER_DEFINITIONS
