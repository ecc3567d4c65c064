#pragma once
// What the train_gpt example is asked to do. The command line is parsed in main.cpp and
// the training runs in train.cpp, so the two heavy headers (CLI11 and loom) are compiled
// in separate translation units, in parallel.
#include <cstdint>
#include <string>

struct train_gpt_options {
    std::int64_t steps = 300;
    std::int64_t layers = 4;
    std::int64_t hidden = 128;
    std::int64_t heads = 4;
    std::int64_t seq = 64;
    std::int64_t batch = 16;
    double lr = 3e-3;
    double clip = 1.0;
    std::uint64_t seed = 1234;
    std::int64_t print_every = 0;  // 0: every step with --exact, else about every 5 s
    int devices = 4;  // in-process ranks; the plan for them is searched (1: one device, no search)
    std::string plan;  // a plan file (io::save_plan, loom_plan --out) to train instead of searching
    std::string data;  // empty: loom's corpus, written to a temporary token file
    std::string data_format = "loom";  // "loom" (.tok) or "llmc" (llm.c's .bin token shards)
    double dropout = 0.0;
    std::string checkpoint;      // directory for checkpoints (empty: none)
    std::int64_t save_every = 0; // save after every N steps (0: never)
    bool resume = false;         // continue from the newest complete checkpoint in `checkpoint`
    std::int64_t stop_after = 0; // end the process after this many steps (0: run to --steps)
    bool exact = false;          // print losses with every digit (%.17g), for bit-for-bit comparisons
};

// Trains and prints progress; returns the process exit code.
int run_training(const train_gpt_options& options);
