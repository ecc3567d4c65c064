// One plan written by hand with all three primitives, checked while it compiles, explained,
// and trained on in-process ranks (README "Plans" quotes the part between the markers).
//
//   op-trans   Megatron's tensor parallelism (a preset: a part like any other), and the
//              micro-batches: the outermost cut of every op along the batch
//   op-assign  two pipeline stages: the layers split evenly over two groups of two devices
//   op-order   1F1B over the stages' (micro-batch, pass) blocks
//   and ZeRO-1 inside the stages, recomputation of half the layers, and an open micro-batch
//   count that the searcher would fill, here chosen by hand.
//
//   plan_by_hand [--steps 20]
//
// It includes loom.hpp and nothing else, and parses its one option by hand: its compile
// time is loom's (benchmarks/RESULTS.md, "Compile time").
#include <charconv>
#include <cstdio>
#include <cstring>
#include <string>

#include <loom/loom.hpp>

using namespace loom;

int main(int argc, char** argv) {
    int steps = 20;
    for (int a = 1; a < argc; ++a) {
        if (std::strcmp(argv[a], "--steps") != 0) {
            std::fprintf(stderr, "plan_by_hand: unknown argument '%s'; usage: plan_by_hand [--steps N]\n", argv[a]);
            return 2;
        }
        const char* value = a + 1 < argc ? argv[++a] : "";
        const char* end = value + std::strlen(value);
        if (std::from_chars(value, end, steps).ptr != end || !*value || steps < 1) {
            std::fprintf(stderr, "plan_by_hand: --steps takes a whole number of steps, at least 1 (got '%s')\n", value);
            return 2;
        }
    }
    try {
        // [plan]
        auto model = models::gpt({.layers = 4, .hidden = 64, .heads = 4, .vocab = 256, .seq = 32, .batch = 16});

        const auto space = plan::compose(
            plan::devices<4>,
            plan::presets::megatron(2),                                // op-trans inside each stage: TP 2
            plan::stages<2>,                                           // op-assign: layers 0-1 and 2-3
            plan::micro_batches<plan::open<OneOf<2, 4, 8>, "m">>,      // op-trans: the batch, outermost
            plan::order<plan::OneFOneB>,                               // op-order
            plan::zero<1>,                                             // optimizer state sharded
            plan::on_layers<"blocks", 0, 1>(plan::recompute));         // recompute half the layers
        static_assert(plan::well_formed<decltype(space)>);             // a mistake here stops the build

        const auto chosen = space.choose("m", 4);                      // what the searcher would fill
        const partition::partitioned_graph programs = partition::apply_plan(model.ir(), chosen);
        std::printf("%s", partition::explain(programs).c_str());

        // The data feed: every input of the model by name. Each rank reads the whole batch
        // and takes its own part of it.
        const std::vector<std::int32_t> tokens = train::byte_tokenizer{}.encode(train::make_corpus());
        train::data_loader loader(tokens, {.batch = 16, .seq = 32, .seed = 1});
        const std::vector<std::int32_t> positions = models::gpt_positions(model.config);

        comm::run_ranks(programs.world, [&](comm::communicator& comm) {
            train::distributed_trainer<float> rank(programs, comm, {});
            train::data_loader data = loader;                          // the same batches on every rank
            for (int step = 0; step < steps; ++step) {
                const train::batch b = data.next();
                train::input_feed feed;
                feed.index["tokens"] = b.inputs;
                feed.index["targets"] = b.targets;
                feed.index["positions"] = positions;
                const train::step_result r = rank.step(feed);
                if (comm.rank() == 0) std::printf("step %2d | loss %.4f | grad norm %.3f\n", step, r.loss, r.grad_norm);
            }
        });
        // [plan]
    } catch (const loom::error& e) {
        std::fprintf(stderr, "error: %s\n", e.what());
        return 2;
    }
    return 0;
}
