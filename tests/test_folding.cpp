// Folding (search/folding.hpp): a model's layers and which of them are the same, found from
// the scopes its builder recorded or from its structure alone, and the forward rounds of a
// recycling model (AlphaFold2's, pipelined by 3F1B) found from nested repeats.
#include <catch2/catch.hpp>

#include <cstdint>

#include <loom/models/evoformer.hpp>
#include <loom/models/gpt.hpp>
#include <loom/search/folding.hpp>

using namespace loom;

namespace {

graph small_gpt(std::int64_t layers) {
    return models::gpt({.layers = layers, .hidden = 64, .heads = 4, .vocab = 128, .seq = 16, .batch = 8}).training_graph();
}

// An Evoformer with 3 recycling rounds over its blocks.
graph evoformer_graph(std::int64_t blocks) {
    models::evoformer_config c;
    c.blocks = blocks;
    c.batch = 2;
    c.msa_seqs = 8;
    c.residues = 16;
    c.msa_channels = 16;
    c.pair_channels = 8;
    return models::evoformer(c).training_graph();
}

}  // namespace

TEST_CASE("layers from scopes and from structure alone are the same", "[folding]") {
    for (std::int64_t layers : {2, 3, 6}) {
        graph g = small_gpt(layers);
        const auto by_scopes = search::layers_from_scopes(g);
        // Forget every scope: the structure must still show the blocks.
        for (auto& n : g.nodes) n.scope = no_id;
        g.repeats.clear();
        g.scopes.clear();
        const auto by_structure = search::find_layers(g);
        CHECK(by_structure.found_by == "structure");
        REQUIRE(by_scopes.layers.size() == static_cast<std::size_t>(layers + 2));
        REQUIRE(by_structure.layers.size() == by_scopes.layers.size());
        for (std::size_t i = 0; i < by_scopes.layers.size(); ++i) {
            INFO(layers << " layers, layer " << i << ": " << by_scopes.layers[i].name);
            CHECK(by_structure.layers[i].nodes == by_scopes.layers[i].nodes);
            CHECK(by_structure.layers[i].class_id == by_scopes.layers[i].class_id);
        }
        CHECK(by_scopes.classes == 3);  // prologue, the block, epilogue
        CHECK(by_scopes.repeated().size() == static_cast<std::size_t>(layers));
    }
}

TEST_CASE("forward rounds are found from the scopes: the layers are one round's blocks", "[folding]") {
    for (std::int64_t blocks : {2, 5}) {  // fewer and more blocks than rounds
        INFO(blocks << " blocks");
        const graph g = evoformer_graph(blocks);
        const search::layer_partition p = search::find_layers(g);
        CHECK(p.found_by == "scopes");
        CHECK(p.rounds == 3);
        REQUIRE(p.repeated().size() == static_cast<std::size_t>(blocks));
        for (int l : p.repeated()) CHECK(p.layers[static_cast<std::size_t>(l)].name.rfind("blocks.", 0) == 0);
        // The blocks after the first are alike (the first also normalises the recycled inputs).
        CHECK(p.layers[static_cast<std::size_t>(p.repeated().back())].class_id ==
              p.layers[static_cast<std::size_t>(p.repeated()[1])].class_id);
    }
    CHECK(search::find_layers(small_gpt(2)).rounds == 1);
}
