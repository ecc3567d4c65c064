#pragma once
// A GPT as a model family (search/folded_price.hpp): the forward graph of `config` at any
// depth and global batch, for the folded search and price to build small instances from.
#include <cstdint>

#include <loom/models/gpt.hpp>
#include <loom/search/folded_price.hpp>

namespace loom::bench {

inline search::model_family gpt_family(const models::gpt_config& config) {
    return {[config](std::int64_t layers, std::int64_t batch) {
                models::gpt_config c = config;
                c.layers = layers;
                c.batch = batch;
                return graph(models::gpt(c).ir());
            },
            config.layers, config.batch};
}

}  // namespace loom::bench
