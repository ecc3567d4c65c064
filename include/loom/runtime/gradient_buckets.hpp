#pragma once
// Gradient buckets: the data-parallel all-reduces of a device program's gradients, grouped
// so that a few large collectives replace many small ones, each started as soon as the
// backward has produced its last gradient, while the backward goes on.
//
// A plan's gradient all-reduces are transfer steps of the program (partition/transfer.hpp:
// kind all_reduce, backward, no consumer). Walking the steps in order, a bucket collects
// consecutive gradient all-reduces of one group until it holds `bucket_bytes`; any other
// transfer, or a gradient all-reduce of another group, closes it first. Buckets therefore
// start in the order the transfers would have run, so every member of a group makes the
// same calls in the same order, as the communicator laws require. The backend lays each
// bucket's gradients out contiguously and reduces the bucket as one span.
//
// Host-only: it reads the program and the plan, and any backend may use it.
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include <loom/core/error.hpp>
#include <loom/partition/partitioned_graph.hpp>
#include <loom/runtime/program.hpp>

namespace loom {

struct gradient_bucket {
    std::vector<int> group;             // global ranks, ascending
    std::vector<std::size_t> steps;     // the program steps of its transfers, in order
    std::vector<tensor_id> gradients;   // their outputs: the gradient storage, laid out in this order
    std::int64_t bytes = 0;             // of the gradients alone (the layout may pad between them)
};

struct gradient_bucket_plan {
    std::vector<gradient_bucket> buckets;
    // Per program step: the bucket its transfer belongs to, or -1.
    std::vector<std::int64_t> bucket_of_step;

    // Whether step s is the last member of its bucket: the step after which the bucket starts.
    bool starts_after(std::size_t s) const {
        const std::int64_t b = bucket_of_step.at(s);
        return b >= 0 && buckets[static_cast<std::size_t>(b)].steps.back() == s;
    }
};

// The transfer a program step runs, or null for a compute step.
inline const partition::transfer* transfer_of_step(const program& p, const partition::partitioned_graph& plan,
                                                   std::size_t s) {
    const node& n = p.source->at(p.steps.at(s).node);
    if (!n.op->communication) return nullptr;
    const auto id = n.attrs.get<std::int64_t>("transfer");
    return &plan.transfers.at(static_cast<std::size_t>(id));
}

inline gradient_bucket_plan plan_gradient_buckets(const program& p, const partition::partitioned_graph& plan,
                                                  std::int64_t bucket_bytes) {
    if (bucket_bytes <= 0)
        throw usage_error("plan_gradient_buckets: bucket_bytes = " + std::to_string(bucket_bytes) +
                          "; pass a positive size (e.g. 25 MiB)");
    const graph& g = *p.source;
    // A gradient that some step reads cannot wait for its bucket: it runs as a plain transfer.
    std::vector<bool> read(g.tensors.size(), false);
    for (const auto& step : p.steps)
        for (tensor_id t : g.at(step.node).inputs) read[static_cast<std::size_t>(t)] = true;

    gradient_bucket_plan out;
    out.bucket_of_step.assign(p.steps.size(), -1);
    bool open = false;
    for (std::size_t s = 0; s < p.steps.size(); ++s) {
        const partition::transfer* tr = transfer_of_step(p, plan, s);
        if (!tr) continue;
        const node& n = g.at(p.steps[s].node);
        const bool bucketable = tr->kind == partition::transfer_kind::all_reduce && tr->backward &&
                                tr->consumer == no_id && tr->values == value_kind::real && n.outputs.size() == 1 &&
                                !read[static_cast<std::size_t>(n.outputs[0])] &&
                                p.buffers.at(static_cast<std::size_t>(n.outputs[0])).where == buffer::place::bound;
        if (!bucketable || (open && out.buckets.back().group != tr->group)) open = false;
        if (!bucketable) continue;
        if (!open) {
            out.buckets.push_back({tr->group, {}, {}, 0});
            open = true;
        }
        gradient_bucket& b = out.buckets.back();
        b.steps.push_back(s);
        b.gradients.push_back(n.outputs[0]);
        b.bytes += p.bytes_of(n.outputs[0]);
        out.bucket_of_step[s] = static_cast<std::int64_t>(out.buckets.size() - 1);
        if (b.bytes >= bucket_bytes) open = false;
    }
    return out;
}

}  // namespace loom
