#pragma once
// The T5-style model's feed from a synthetic batch.
#include <loom/models/t5.hpp>
#include <loom/train/trainer.hpp>

namespace loom::testing {

// The batch's arrays by input name. The feed points into `d`, which must outlive it.
inline train::input_feed t5_feed(const models::t5_batch& d) {
    train::input_feed f;
    f.index["source"] = d.source;
    f.index["target_in"] = d.target_in;
    f.index["targets"] = d.targets;
    f.index["source_positions"] = d.source_positions;
    f.index["target_positions"] = d.target_positions;
    return f;
}

}  // namespace loom::testing
