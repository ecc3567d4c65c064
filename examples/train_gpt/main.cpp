// Trains a small GPT on loom's own text corpus on the host backend: calibrates the host,
// searches the plan for --devices in-process ranks, shows it, and prints a progress line
// per step (--devices 1: one device, no search; --plan FILE: the plan stored in FILE).
//
//   train_gpt [--devices 4] [--steps 300] [--layers 4] [--hidden 128] [--heads 4] [--seq 64] [--batch 16]
//             [--lr 3e-3] [--clip 1] [--seed 1234] [--print-every 1] [--data corpus.tok] [--plan plan.json]
//             [--checkpoint DIR --save-every N] [--resume] [--stop-after K] [--exact]
#include <cstdio>

#include <CLI/CLI.hpp>

#include "options.hpp"

int main(int argc, char** argv) {
    CLI::App app{"Search a plan for a small GPT, then train it on loom's corpus on the host backend"};
    train_gpt_options o;
    app.add_option("--steps", o.steps, "training steps")->check(CLI::PositiveNumber);
    app.add_option("--layers", o.layers, "transformer blocks")->check(CLI::PositiveNumber);
    app.add_option("--hidden", o.hidden, "hidden size")->check(CLI::PositiveNumber);
    app.add_option("--heads", o.heads, "attention heads")->check(CLI::PositiveNumber);
    app.add_option("--seq", o.seq, "sequence length")->check(CLI::PositiveNumber);
    app.add_option("--batch", o.batch, "sequences per step")->check(CLI::PositiveNumber);
    app.add_option("--lr", o.lr, "peak learning rate (AdamW, warm-up then cosine decay)");
    app.add_option("--clip", o.clip, "global gradient-norm clip (0: off)");
    app.add_option("--seed", o.seed, "initialisation and data seed");
    app.add_option("--print-every", o.print_every,
                   "print one progress line every N steps (default: every step with --exact, else about every 5 s)")
        ->check(CLI::PositiveNumber);
    app.add_option("--devices", o.devices, "in-process ranks to search a plan for and train on (1: one device)")
        ->check(CLI::PositiveNumber);
    app.add_option("--data", o.data, "token file to train on (default: loom's corpus, written to a temp file)");
    app.add_option("--plan", o.plan, "a plan file (loom_plan --out) to train on its devices instead of searching")
        ->check(CLI::ExistingFile);
    app.add_option("--data-format", o.data_format, "format of --data: loom (.tok) or llmc (llm.c .bin shard)")
        ->check(CLI::IsMember({"loom", "llmc"}));
    app.add_option("--dropout", o.dropout, "dropout probability after embeddings, attention and MLP");
    app.add_option("--checkpoint", o.checkpoint, "directory for sharded checkpoints");
    app.add_option("--save-every", o.save_every, "save a checkpoint after every N steps (needs --checkpoint)");
    app.add_flag("--resume", o.resume, "continue from the newest complete checkpoint in --checkpoint "
                                       "(another --devices count or plan reshards it)");
    app.add_option("--stop-after", o.stop_after, "end after this many steps, as if the process were stopped "
                                                 "(the schedule still spans --steps)");
    app.add_flag("--exact", o.exact, "print losses with all 17 digits");
    CLI11_PARSE(app, argc, argv);
    if (o.print_every == 0 && o.exact) o.print_every = 1;  // exact runs are compared step by step
    if ((o.save_every > 0 || o.resume) && o.checkpoint.empty()) {
        std::fprintf(stderr, "error: --save-every and --resume need --checkpoint DIR\n");
        return 2;
    }
    return run_training(o);
}
