// The program every consumer test (find_package, add_subdirectory, fetch_content) builds
// and runs: it includes loom through the consumer's target, builds a small graph, trains
// it and checks that the loss falls. Exit code 0 means the target carried everything.
// It includes the headers it uses, as a program would, rather than <loom/loom.hpp>: that
// one took two thirds of each consumer's compile (37 s against 17 s), and it compiles on its
// own as the first line of src/compiled.cpp and in the header test.
#include <loom/autograd/autograd.hpp>
#include <loom/graph/builder.hpp>
#include <loom/ops/all.hpp>
#include <loom/train/trainer.hpp>

#include <iostream>

int main() {
    using namespace loom;
    try {
        graph_builder b;
        auto x = b.input("x", {{Dim::Batch::id, 8}, {Dim::Hidden::id, 4}});
        auto w = b.parameter("w", {{Dim::FFN::id, 4}, {Dim::Hidden::id, 4}}, parameter_init::normal(0.5));
        auto y = ops::linear(x, w);
        b.set_loss(ops::mean(y * y));  // minimised by w = 0
        build_backward(b);
        train::trainer_options options;
        options.optimizer = train::sgd_options{.momentum = 0.5};
        options.schedule.peak = 0.1;
        train::trainer<float> trainer(std::move(b).take(), options);
        std::vector<double> xs(32);
        for (std::size_t i = 0; i < xs.size(); ++i) xs[i] = static_cast<double>(i % 5) - 2.0;
        train::input_feed feed;
        feed.real["x"] = xs;
        const double first = trainer.step(feed).loss;
        double last = first;
        for (int s = 0; s < 30; ++s) last = trainer.step(feed).loss;
        std::cout << "consumer: loss " << first << " -> " << last << '\n';
        return last < 0.1 * first ? 0 : 1;
    } catch (const loom::error& e) {
        std::cerr << e.what() << '\n';
        return 1;
    }
}
