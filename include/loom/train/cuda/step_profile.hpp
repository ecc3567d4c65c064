#pragma once
// Where one GPU training step's time goes, by op kind: one step of a cuda::trainer with a
// timing event recorded before every program step, the GPU time from one event to the next
// charged to that step's op kind, with the kind's instructions, FLOPs (as the ops count
// them) and bytes read and written. What benchmarks/cuda/gpu_train --profile prints, and
// what cuda::calibrate_gpu fits the searcher's rates per op kind from.
//
//   const auto kinds = cuda::profile_step(trainer, feed);   // one more training step
//   kinds.at("attention_grad").seconds / kinds.at("attention_grad").instructions
//
// A fused GEMM queues its work after the hooks of all its group's steps, so the group's time
// lands on its last step: it is charged to a kind of its own, "fused GEMM + <epilogue>",
// with the group's work. The last step's interval also holds the gradient norm, the clipping
// and AdamW, which follow the program: its kind gets the suffix " + norm, clip, AdamW".
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include <loom/runtime/cuda/device.hpp>
#include <loom/search/op_rate.hpp>
#include <loom/train/cuda/trainer.hpp>

namespace loom::cuda {

inline search::step_measurement profile_step(trainer& t, const train::input_feed& feed) {
    const program& p = t.compiled();
    const graph& g = *p.source;
    std::vector<std::unique_ptr<event>> marks;
    for (std::size_t s = 0; s <= p.steps.size(); ++s) marks.push_back(std::make_unique<event>(true));
    t.set_before_step([&](std::size_t s) { marks[s]->record(t.compute_stream()); });
    try {
        t.step(feed);  // synchronised: it reads the loss back
    } catch (...) {
        t.set_before_step(nullptr);
        throw;
    }
    t.set_before_step(nullptr);
    marks.back()->record(t.compute_stream());
    marks.back()->synchronize();

    const fusion_plan& fusion = t.fusion();
    search::step_measurement by_kind;
    for (std::size_t s = 0; s < p.steps.size(); ++s) {
        const step_fusion& f = fusion.steps[s];
        const node& n = g.at(p.steps[s].node);
        std::string kind(n.op->name);
        bool timed = true;
        if (f.group >= 0) {
            const fused_gemm& group = fusion.groups[static_cast<std::size_t>(f.group)];
            timed = s == group.steps.back();
            kind = std::string("fused GEMM + ") + to_string(group.epilogue);
        }
        if (s + 1 == p.steps.size()) kind += search::after_program_suffix;
        search::kind_measurement& entry = by_kind[kind];
        entry.flops += n.op->flops ? n.op->flops(g, n) : 0.0;
        for (tensor_id in : n.inputs) entry.bytes += static_cast<double>(p.bytes_of(in));
        for (tensor_id out : n.outputs) entry.bytes += static_cast<double>(p.bytes_of(out));
        if (!timed) continue;
        entry.seconds += 1e-3 * event::elapsed_ms(*marks[s], *marks[s + 1]);
        ++entry.instructions;
    }
    return by_kind;
}

}  // namespace loom::cuda
