// loom_plan: model, cluster and a space of plans in; the best plan out, with an explanation,
// a plan file that loads back (--out) and the predicted timeline as a Chrome trace (--trace).
// Every candidate is priced by the programs its plan produces (search::search_plan).
//
//   loom_plan --layers 48 --hidden 4096 --heads 32 --cluster dgx2_v100:2 --memory 32e9
//             --space megatron --out plan.json --trace timeline.json
//   loom_plan --request request.json              the same options as a JSON object
//   loom_plan --load plan.json --cluster ...      the programs of a saved plan, explained
//   loom_plan --model t5 --space nnscaler --tp 1,2 --budget 30
#include <cstdio>

#include <CLI/CLI.hpp>

#include "options.hpp"

int main(int argc, char** argv) {
    CLI::App app{"Search the best training plan for a model on a cluster, pricing every plan by its programs"};
    loom_plan_options o;
    std::string request;
    app.add_option("--request", request, "JSON file with any of these options (names without dashes)");
    app.add_option("--model", o.model,
                   "gpt, t5 (layers/2 encoder and layers/2 decoder blocks), swin (two stages of layers/2 blocks, "
                   "seq patches, hidden channels) or evoformer (layers blocks, seq residues, hidden MSA channels)")
        ->check(CLI::IsMember({"gpt", "t5", "swin", "evoformer"}));
    app.add_option("--space", o.space,
                   "the plans to search: megatron, deepspeed, alpa, nnscaler (default: every part of the plan "
                   "language open), or a plan file with open parameters")
        ->capture_default_str();
    app.add_option("--runtime-memory", o.runtime_memory,
                   "bytes a runtime holds beside the program (default 2 GiB on GPU presets, 0 for a --cluster-json "
                   "profile)");
    app.add_option("--layers", o.layers, "transformer blocks")->check(CLI::PositiveNumber);
    app.add_option("--hidden", o.hidden, "hidden size")->check(CLI::PositiveNumber);
    app.add_option("--heads", o.heads, "attention heads")->check(CLI::PositiveNumber);
    app.add_option("--seq", o.seq, "sequence length")->check(CLI::PositiveNumber);
    app.add_option("--vocab", o.vocab, "vocabulary size")->check(CLI::PositiveNumber);
    app.add_option("--batch", o.batch, "global batch, in sequences")->check(CLI::PositiveNumber);
    app.add_option("--cluster", o.cluster,
                   "preset:nodes, preset one of dgx1_v100, dgx1_v100_8nic, dgx2_v100, dgx_a100, dgx_h100");
    app.add_option("--cluster-json", o.cluster_json, "a cluster profile (search::save_cluster) instead of a preset");
    app.add_option("--memory", o.memory, "bytes per device the plan may use (default: the device's memory)");
    app.add_option("--precision", o.precision, "bf16 or f16 (mixed-precision Adam), or f32")
        ->check(CLI::IsMember({"bf16", "f16", "f32"}));
    app.add_option("--tp", o.tp, "narrow the space: tensor-parallel degrees to consider")->delimiter(',');
    app.add_option("--dp", o.dp, "narrow the space: data-parallel degrees to consider")->delimiter(',');
    app.add_option("--pp", o.pp, "narrow the space: pipeline stage counts to consider")->delimiter(',');
    app.add_option("--micro-batches", o.micro_batches, "narrow the space: micro-batch counts to consider")->delimiter(',');
    app.add_option("--zero", o.zero, "narrow the space: ZeRO stages to consider (0-3)")->delimiter(',');
    app.add_option("--schedules", o.schedules,
                   "narrow the space: orders to consider, of gpipe, 1f1b, interleaved, 3f1b (models with three "
                   "forward rounds), interlaced (embedding and head on all devices, nnScaler Figure 6)")
        ->delimiter(',');
    app.add_option("--recompute", o.recompute, "narrow the space: none, full or both (the layers' recompute choice)")
        ->delimiter(',');
    app.add_option("--coshard", o.coshard,
                   "narrow the space: Coshard factors to consider, e.g. 1,2 (recomputed layers run in that many "
                   "colocated pieces, nnScaler Figure 5)")
        ->delimiter(',')
        ->check(CLI::PositiveNumber);
    app.add_option("--boundary-slack", o.boundary_slack,
                   "alpa and nnscaler: each stage's layers within this many of the even split (-1: any cut)")
        ->capture_default_str();
    app.add_flag("--unfolded", o.unfolded,
                 "price every device's programs instead of small instances of the model (GPTs are folded)");
    app.add_option("--budget", o.budget,
                   "search time budget in seconds, then the best so far and its gap (0: until the best is proven)")
        ->capture_default_str();
    app.add_option("--out", o.out, "write the plan file (io::save_plan JSON) here");
    app.add_option("--trace", o.trace, "write the predicted timeline here (Chrome trace JSON, open in Perfetto)");
    app.add_option("--save-cluster", o.save_cluster, "write the cluster profile used here (JSON)");
    app.add_option("--load", o.load, "apply this plan file to the model and explain its programs instead of searching");
    CLI11_PARSE(app, argc, argv);
    if (!request.empty()) {
        loom_plan_options from_file;
        try {
            apply_request_file(request, from_file);
        } catch (const std::exception& e) {
            std::fprintf(stderr, "error: %s\n", e.what());
            return 2;
        }
        // Parse again over the request's values, so the command line wins.
        o = from_file;
        app.clear();
        CLI11_PARSE(app, argc, argv);
    }
    return run_loom_plan(o);
}
