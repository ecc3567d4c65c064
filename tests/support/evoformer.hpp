#pragma once
// The Evoformer's feed from a synthetic batch, and the small configuration the pipeline
// tests (in-process and MPI) train with 3F1B.
#include <loom/models/evoformer.hpp>
#include <loom/train/trainer.hpp>

namespace loom::testing {

// The batch's arrays by input name. The feed points into `d`, which must outlive it.
inline train::input_feed evoformer_feed(const models::evoformer_batch& d) {
    train::input_feed f;
    f.index["msa"] = d.msa;
    f.index["pair_left"] = d.pair_left;
    f.index["pair_right"] = d.pair_right;
    f.index["relpos"] = d.relpos;
    f.index["targets"] = d.targets;
    return f;
}

// 4 samples, 3 recycling rounds, `blocks` Evoformer blocks (one per pipeline stage or more).
inline models::evoformer_config pipeline_evoformer(std::int64_t blocks) {
    return {.batch = 4, .msa_seqs = 3, .residues = 4, .msa_channels = 8, .pair_channels = 4, .heads = 2,
            .blocks = blocks, .recycles = 3, .bins = 5, .vocab = 6, .relpos_clip = 2, .outer_groups = 2,
            .outer_channels = 2, .transition_factor = 2};
}

}  // namespace loom::testing
