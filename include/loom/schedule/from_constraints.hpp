#pragma once
// A schedule from order constraints alone: a deterministic list scheduler.
//
//   schedule s = from_constraints(pipeline_shape::linear(4, 8), {
//       before{forward(micro), forward(micro + 1)},
//       before{backward(micro), backward(micro + 1)},
//       before{forward(micro + stages - stage - 1).or_last(), backward(micro)},
//       before{backward(micro), forward(micro + stages - stage)}}, "my 1F1B");
//
// The scheduler plays the pipeline forward in time under a cost model (uniform by default):
// among the blocks whose data dependencies and constrained predecessors are all placed, it
// places the one that can start earliest on all of its devices; ties go to the block on more
// devices (an SPMD block takes the moment every device is free), then the oldest micro-batch,
// then backward before forward, then the later forward round, then the lower stage.
//
// Messages on one channel (device a -> device b) arrive in the order a sends them, so once a
// has sent for X' and then for X, X' must run before X on b. Before placing a block, the
// scheduler follows what its messages would force down the pipeline and skips the block when
// that contradicts an order already forced; what it returns passes validate() (which it runs).
//
// Constraints that fix each device's order (GPipe, 1F1B, interleaved 1F1B) give exactly that
// order whatever the costs; where they leave freedom (3F1B's warm-up, the interlaced
// pipeline's embedding and head), the costs decide, standing in for nnScaler's temporal-order
// search. The scheduler is greedy: it can report crossed messages for constraints that some
// other order would satisfy.
//
// Throws schedule_error when a constraint is ill-formed, when the constraints and the data
// dependencies order blocks in a cycle (the blocks and the constraints are named), or when
// they leave no way to avoid crossed messages.
#include <algorithm>
#include <cstddef>
#include <map>
#include <set>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include <loom/schedule/constraints.hpp>
#include <loom/schedule/costs.hpp>
#include <loom/schedule/cycle.hpp>
#include <loom/schedule/schedule.hpp>
#include <loom/schedule/transfers.hpp>
#include <loom/schedule/validate.hpp>

namespace loom::schedule {

// A named shape with its constraints: what the templates (templates.hpp) produce.
struct schedule_spec {
    std::string name;
    pipeline_shape shape;
    std::vector<before> constraints;
};

namespace detail {

class list_scheduler {
public:
    list_scheduler(const pipeline_shape& p, const std::vector<before>& constraints, std::string name,
                   const cost_model& costs)
        : p_(p), constraints_(constraints), name_(std::move(name)), costs_(costs),
          where_(name_.empty() ? std::string("from_constraints") : "from_constraints('" + name_ + "')"),
          n_(static_cast<std::size_t>(block_count(p))), preds_(n_), deps_(n_) {}

    schedule run() {
        check_shape(p_, where_ + ": shape");
        collect_edges();
        check_acyclic();
        std::map<std::pair<int, int>, std::size_t> channel_ids;
        for (const transfer& t : all_transfers(p_)) {
            const auto [it, added] = channel_ids.try_emplace({t.from, t.to}, channels_.size());
            if (added) channels_.emplace_back();
            channels_[it->second].push_back(messages_.size());
            channel_of_.push_back(it->second);
            messages_.push_back(t);
        }
        place_all();
        schedule s{p_, order_, name_};
        validate(s);
        return s;
    }

private:
    const pipeline_shape& p_;
    const std::vector<before>& constraints_;
    std::string name_;
    const cost_model& costs_;
    std::string where_;
    std::size_t n_;
    std::vector<std::vector<std::pair<std::size_t, int>>> preds_;  // (block, constraint #) placed before
    std::vector<std::vector<dependency>> deps_;
    std::vector<transfer> messages_;
    std::vector<std::size_t> channel_of_;                // message id -> channel id
    std::vector<std::vector<std::size_t>> channels_;     // channel id -> its message ids
    std::vector<std::vector<block>> order_;
    std::vector<bool> placed_;
    std::vector<std::vector<std::size_t>> fifo_preds_;  // blocks that must run first because of message order
    std::vector<std::vector<std::size_t>> sent_;        // channel id -> message ids sent so far, in order
    std::vector<std::vector<std::size_t>> out_of_;      // message ids each block sends

    std::size_t index(const block& b) const { return static_cast<std::size_t>(block_index(p_, b)); }
    std::string name(const block& b) const { return to_string(b, p_.rounds); }

    void collect_edges() {
        for (std::size_t c = 0; c < constraints_.size(); ++c) {
            const std::string at = where_ + ": constraint #" + std::to_string(c);
            for (const ordered_pair& q : expand(constraints_[c], p_, at))
                preds_[index(q.then)].push_back({index(q.first), static_cast<int>(c)});
        }
        for (const dependency& d : dependencies(p_)) deps_[index(d.consumer)].push_back(d);
    }

    // Edge labels: >= 0 a dependency kind, < 0 constraint #(-label - 1).
    void check_acyclic() const {
        std::vector<std::vector<labelled_edge>> out(n_);
        for (std::size_t v = 0; v < n_; ++v) {
            for (const auto& [u, c] : preds_[v]) out[u].push_back({static_cast<int>(v), -c - 1});
            for (const dependency& d : deps_[v])
                out[index(d.producer)].push_back({static_cast<int>(v), static_cast<int>(d.kind)});
        }
        const auto cycle = find_cycle(out);
        if (cycle.empty()) return;
        std::string text;
        for (const auto& e : cycle) {
            const block u = block_at(p_, e.from), v = block_at(p_, e.to);
            if (!text.empty()) text += "; ";
            if (e.label < 0) {
                const auto c = static_cast<std::size_t>(-e.label - 1);
                text += name(u) + " before " + name(v) + " by constraint #" + std::to_string(c) + " " +
                        to_string(constraints_[c]);
            } else {
                text += name(v) + " needs " + name(u) + " (" + reads_text(static_cast<dependency_kind>(e.label)) + ")";
            }
        }
        throw schedule_error(where_ + ": the constraints cannot all hold; with the data dependencies they order "
                                      "these blocks in a cycle: " + text + "; drop or change one of the constraints named");
    }

    // Placing blocks in time order. Messages add order too: once P' has sent to X' on a
    // channel, a later message to X on it makes X' a predecessor of X (fifo_preds_). A block
    // is placed only if that cannot contradict what is already forced: a producer P sending
    // to X goes first only if no consumer X'' of a producer still to come on the channel
    // must run before X (fifo_conflict).
    void place_all() {
        const int devices = p_.devices;
        order_.assign(static_cast<std::size_t>(devices), {});
        std::vector<double> free(static_cast<std::size_t>(devices), 0.0), finish(n_, 0.0);
        placed_.assign(n_, false);
        fifo_preds_.assign(n_, {});
        sent_.assign(channels_.size(), {});
        out_of_.assign(n_, {});
        for (std::size_t id = 0; id < messages_.size(); ++id) out_of_[index(messages_[id].producer)].push_back(id);
        const auto blocks = all_blocks(p_);
        using key = std::tuple<double, int, int, int, int, int, std::size_t>;
        for (std::size_t count = 0; count < n_; ++count) {
            std::vector<key> candidates;
            for (std::size_t x = 0; x < n_; ++x) {
                if (placed_[x] || !predecessors_placed(x)) continue;
                const block& b = blocks[x];
                double start = 0.0;
                for (int g : p_.devices_of(b.stage)) {
                    start = std::max(start, free[static_cast<std::size_t>(g)]);
                    for (const dependency& d : deps_[x]) {
                        const double latency = p_.runs_on(d.producer.stage, g) ? 0.0 : costs_.latency;
                        start = std::max(start, finish[index(d.producer)] + latency);
                    }
                }
                const int spmd_first = -static_cast<int>(p_.devices_of(b.stage).size());
                candidates.push_back({start, spmd_first, b.micro, is_backward(b) ? 0 : 1, -b.round, b.stage, x});
            }
            std::sort(candidates.begin(), candidates.end());
            std::size_t best = n_;
            double start = 0.0;
            std::size_t first_blocked = n_;
            std::pair<std::size_t, std::size_t> first_conflict{n_, n_};
            for (const key& k : candidates) {
                const std::size_t x = std::get<6>(k);
                if (auto conflict = fifo_conflict(x); conflict.first < n_) {
                    if (first_blocked == n_) first_blocked = x, first_conflict = conflict;
                    continue;
                }
                best = x;
                start = std::get<0>(k);
                break;
            }
            if (best == n_) stall(first_blocked, first_conflict);
            place(best, blocks[best], start, finish, free);
        }
    }

    bool predecessors_placed(std::size_t x) const {
        for (const auto& [u, c] : preds_[x])
            if (!placed_[u]) return false;
        for (const dependency& d : deps_[x])
            if (!placed_[index(d.producer)]) return false;
        for (std::size_t u : fifo_preds_[x])
            if (!placed_[u]) return false;
        return true;
    }

    // The unplaced blocks that must run before x (constraints, dependencies, FIFO order), x included.
    std::vector<bool> forced_before(std::size_t x) const {
        std::vector<bool> seen(n_, false);
        std::vector<std::size_t> stack{x};
        seen[x] = true;
        auto visit = [&](std::size_t u) {
            if (placed_[u] || seen[u]) return;
            seen[u] = true;
            stack.push_back(u);
        };
        while (!stack.empty()) {
            const std::size_t v = stack.back();
            stack.pop_back();
            for (const auto& [u, c] : preds_[v]) visit(u);
            for (const dependency& d : deps_[v]) visit(index(d.producer));
            for (std::size_t u : fifo_preds_[v]) visit(u);
        }
        return seen;
    }

    // Placing producer x now sends its messages before those of every producer still to come
    // on the same channels, so their consumers must run in that order too, and so must the
    // consumers of those consumers' messages, down the pipeline. Returns the first implied
    // pair (must-run-first, must-run-second) that contradicts an order already forced, or
    // (n_, n_) when there is none.
    std::pair<std::size_t, std::size_t> fifo_conflict(std::size_t x) const {
        std::vector<std::pair<std::size_t, std::size_t>> implied;
        for (std::size_t mine : out_of_[x]) {
            const std::size_t consumer = index(messages_[mine].consumer);
            for (std::size_t theirs : channels_[channel_of_[mine]]) {
                const transfer& t = messages_[theirs];
                if (placed_[index(t.producer)] || index(t.producer) == x || index(t.consumer) == consumer) continue;
                implied.push_back({consumer, index(t.consumer)});
            }
        }
        std::set<std::pair<std::size_t, std::size_t>> seen(implied.begin(), implied.end());
        std::map<std::size_t, std::vector<bool>> forced;  // block -> the unplaced blocks forced before it
        for (std::size_t i = 0; i < implied.size(); ++i) {
            const auto [first, second] = implied[i];
            auto it = forced.find(first);
            if (it == forced.end()) it = forced.emplace(first, forced_before(first)).first;
            if (it->second[second]) return {first, second};
            for (std::size_t a : out_of_[first])
                for (std::size_t z : out_of_[second]) {
                    if (channel_of_[a] != channel_of_[z]) continue;
                    const std::pair next{index(messages_[a].consumer), index(messages_[z].consumer)};
                    if (next.first != next.second && seen.insert(next).second) implied.push_back(next);
                }
        }
        return {n_, n_};
    }

    void place(std::size_t x, const block& b, double start, std::vector<double>& finish, std::vector<double>& free) {
        finish[x] = start + costs_.of(b);
        placed_[x] = true;
        for (int g : p_.devices_of(b.stage)) {
            order_[static_cast<std::size_t>(g)].push_back(b);
            free[static_cast<std::size_t>(g)] = finish[x];
        }
        for (std::size_t mine : out_of_[x]) {
            const std::size_t consumer = index(messages_[mine].consumer);
            auto& sent = sent_[channel_of_[mine]];
            for (std::size_t earlier : sent) {
                const std::size_t their_consumer = index(messages_[earlier].consumer);
                if (!placed_[their_consumer] && their_consumer != consumer) fifo_preds_[consumer].push_back(their_consumer);
            }
            sent.push_back(mine);
        }
    }

    [[noreturn]] void stall(std::size_t blocked, std::pair<std::size_t, std::size_t> conflict) const {
        if (blocked >= n_)
            throw schedule_error(where_ + ": no block can run next; the constraints leave no order (this is a bug if "
                                          "no cycle was reported)");
        const block x = block_at(p_, static_cast<int>(blocked));
        const block first = block_at(p_, static_cast<int>(conflict.first));
        const block second = block_at(p_, static_cast<int>(conflict.second));
        throw schedule_error(where_ + ": the constraints force crossed messages: every block that can run next, such as " +
                             name(x) + ", sends a message that would make " + name(first) + " run before " +
                             name(second) + " (messages on one channel arrive in the order they are sent), but " +
                             name(second) + " must run before " + name(first) +
                             "; loosen the constraints that order these blocks");
    }

    static std::string reads_text(dependency_kind k) { return detail::reads_text(k); }
};

}  // namespace detail

inline schedule from_constraints(const pipeline_shape& shape, const std::vector<before>& constraints,
                                 std::string name = "", const cost_model& costs = {}) {
    return detail::list_scheduler(shape, constraints, std::move(name), costs).run();
}

inline schedule from_constraints(const schedule_spec& spec, const cost_model& costs = {}) {
    return from_constraints(spec.shape, spec.constraints, spec.name, costs);
}

}  // namespace loom::schedule
