// A vocabulary that the tensor-parallel degree does not divide (a prime one, with any
// degree) works under every preset that splits it: the embedding, the LM head and the
// vocabulary-parallel loss are cut into near-equal pieces (97 rows over 2 devices: 49 and
// 48), where Megatron pads the vocabulary to a multiple of the degree. No padding row
// exists, so none reaches the softmax: training equals one device with the same vocabulary
// (float64, relative 1e-9, AdamW, several steps), and the parameters and their gradients
// keep the model's shapes. A degree that does not divide any other dim is refused with a
// message that says what to do.
#include <catch2/catch.hpp>

#include <string>

#include <loom/partition/apply.hpp>
#include <loom/partition/region_copy.hpp>
#include <loom/plan/compose.hpp>
#include <loom/plan/presets.hpp>

#include "support/plan_equivalence.hpp"

using namespace loom;
namespace presets = loom::plan::presets;

namespace {

// Heads, FFN and sequence divide by 2, 3 and 4; the batch by 2 and 4.
models::gpt_config model(std::int64_t vocab, std::int64_t layers = 2) {
    return {.layers = layers, .hidden = 24, .heads = 12, .vocab = vocab, .seq = 12, .batch = 4};
}

template <class Plan>
void check_equal(const models::gpt_config& c, const Plan& plan, const std::string& what, int steps = 4) {
    const auto e = testing::compare_with_single_device<double>(c, plan, steps);
    INFO(what << ", vocabulary " << c.vocab << (c.tie_embeddings ? "" : " (untied head)") << ": loss " << e.loss
              << ", grad norm " << e.grad_norm << ", parameters " << e.parameters << " (" << e.worst_parameter << "), "
              << e.transfers << " transfers");
    CHECK(e.loss <= 1e-9);
    CHECK(e.grad_norm <= 1e-9);
    CHECK(e.parameters <= 1e-9);
    CHECK(e.transfers > 0);
}

// The rows of parameter `name` that each device stores, in device order.
std::vector<std::string> stored_rows(const partition::partitioned_graph& pg, const std::string& name) {
    std::vector<std::string> rows;
    for (const auto& part : pg.devices)
        for (const auto& s : part.parameters)
            if (pg.ir().tensor(s.logical).name == name)
                rows.push_back(std::to_string(s.region.ranges[0].begin) + ":" + std::to_string(s.region.ranges[0].end));
    return rows;
}

}  // namespace

// The compile-time checks agree: a declared vocabulary need not divide by the degree, any
// other declared extent must.
template <class... Parts>
constexpr bool well_formed_parts = plan::well_formed<Parts...>;
static_assert(well_formed_parts<decltype(plan::devices<2>), decltype(plan::extent<Dim::Vocab, 97>),
                                decltype(plan::on_all(plan::trans<Split<Dim::Vocab>, 2>{}))>);
static_assert(!well_formed_parts<decltype(plan::devices<2>), decltype(plan::extent<Dim::Head, 7>),
                                 decltype(plan::on_all(plan::trans<Split<Dim::Head>, 2>{}))>);

TEST_CASE("a prime vocabulary trains like one device under Megatron tensor parallelism of any degree",
          "[plan][presets][vocabulary]") {
    for (std::int64_t vocab : {97, 101}) {
        const auto c = model(vocab);
        for (const auto& spec : {presets::megatron(2), presets::megatron(3), presets::megatron(4), presets::megatron(2, 2),
                                 presets::megatron(4, 2)})
            check_equal(c, spec, spec.name);
    }
    auto untied = model(97);
    untied.tie_embeddings = false;
    check_equal(untied, presets::megatron(3), "megatron x3");
    check_equal(untied, presets::megatron(2, 2), "megatron x2 x data parallel x2");
}

TEST_CASE("a prime vocabulary trains like one device under sequence and vocabulary parallelism",
          "[plan][presets][vocabulary]") {
    const auto c = model(97);
    for (const auto& spec : {presets::sequence_parallel(2), presets::sequence_parallel(3), presets::sequence_parallel(2, 2),
                             presets::vocabulary_parallel(2), presets::vocabulary_parallel(3), presets::vocabulary_parallel(4)})
        check_equal(c, spec, spec.name);
}

TEST_CASE("a prime vocabulary trains like one device in pipelines: Megatron inside the stages, and interlaced",
          "[plan][pipeline][vocabulary]") {
    const auto c = model(97, 4);
    check_equal(c, presets::pipeline(2, 2, {plan::schedule_kind::one_f_one_b}, presets::megatron(2)),
                "2 stages of megatron x2, 1F1B");
    check_equal(c, presets::pipeline(2, 4, {plan::schedule_kind::gpipe}, presets::megatron(3)),
                "2 stages of megatron x3, GPipe");
    for (int p : {2, 4}) {
        check_equal(c, presets::pipeline(p, 4, {plan::schedule_kind::interlaced}), "interlaced x" + std::to_string(p));
    }
}

TEST_CASE("an uneven vocabulary split: near-equal pieces of the model's own table, no logits gathered",
          "[plan][presets][vocabulary]") {
    const auto c = model(97);
    for (const auto& spec : {presets::megatron(2), presets::megatron(4), presets::megatron(2, 2)}) {
        INFO(spec.name);
        auto m = models::gpt(c);
        const auto pg = partition::apply_plan(m.ir(), spec);
        // The table keeps its 97 rows; each tensor-parallel rank stores its near-equal piece.
        CHECK(pg.ir().tensor(pg.ir().parameters.at(0)).dims.extent(0) == 97);
        if (spec.devices == 2) CHECK(stored_rows(pg, "wte") == std::vector<std::string>{"0:49", "49:97"});
        if (spec.devices == 4 && spec.name.find("data") == std::string::npos)
            CHECK(stored_rows(pg, "wte") == std::vector<std::string>{"0:25", "25:49", "49:73", "73:97"});
        if (spec.devices == 4 && spec.name.find("data") != std::string::npos)
            CHECK(stored_rows(pg, "wte") == std::vector<std::string>{"0:49", "49:97", "0:49", "49:97"});
        // The loss takes each piece's log-sum-exp over its own columns (ragged chunks).
        int ragged = 0, whole_losses = 0;
        for (const auto& n : pg.ir().nodes) {
            ragged += n.op == &op_def_of<ops::RaggedChunkLogsumexp>();
            whole_losses += n.op == &op_def_of<ops::CrossEntropy>();
        }
        CHECK(ragged == 1);
        CHECK(whole_losses == 0);
        // Nothing of [batch, seq, vocab] size crosses devices, forward or backward.
        const std::int64_t logits = c.batch * c.seq * c.vocab;
        for (const auto& t : pg.transfers) {
            const tensor_desc& d = pg.ir().tensor(t.logical);
            INFO(t.describe() << " of '" << d.name << "' " << d.dims.to_string());
            CHECK(d.dims.numel() < logits);
        }
    }
}

TEST_CASE("the gradients of the embedding and the head under an uneven vocabulary split equal one device's",
          "[plan][presets][vocabulary]") {
    auto c = model(97);
    c.tie_embeddings = false;
    train::trainer_options options;
    options.clip_norm = 0;  // the gradients as computed
    std::vector<std::vector<std::int32_t>> keep;
    const train::input_feed feed = testing::gpt_batch(c, 0, keep);
    train::trainer<double> single(models::gpt(c).training_graph(), options);
    single.step(feed);
    for (const auto& spec : {presets::megatron(2), presets::megatron(3, 2)}) {
        INFO(spec.name);
        auto m = models::gpt(c);
        const auto pg = partition::apply_plan(m.ir(), spec);
        for (const std::string name : {"wte", "lm_head"}) {
            INFO(name);
            const auto want = single.gradient(name);
            tensor_id p = no_id;
            for (tensor_id t : pg.ir().parameters)
                if (pg.ir().tensor(t).name == name) p = t;
            REQUIRE(p != no_id);
            const partition::box whole = partition::box::whole(pg.ir().tensor(p).dims);
            REQUIRE(whole.numel() == static_cast<std::int64_t>(want.size()));
            // Every rank's gradient pieces, laid into the whole gradient (replicas agree).
            std::vector<std::vector<double>> got(static_cast<std::size_t>(pg.world));
            std::vector<std::vector<partition::box>> regions(static_cast<std::size_t>(pg.world));
            comm::run_ranks(pg.world, [&](comm::communicator& comm) {
                train::distributed_trainer<double> rank(pg, comm, options);
                rank.step(feed);
                auto& mine = got[static_cast<std::size_t>(comm.rank())];
                mine.assign(want.size(), 0.0);
                for (const auto& s : rank.part().gradients) {
                    if (s.logical != p) continue;
                    regions[static_cast<std::size_t>(comm.rank())].push_back(s.region);
                    partition::copy_region(rank.local_values(s.local).data(), s.region, mine.data(), whole, s.region);
                }
            });
            std::vector<bool> covered(want.size(), false);
            double worst = 0, scale = 1e-300;
            for (std::size_t r = 0; r < got.size(); ++r)
                for (const auto& region : regions[r]) {
                    // Uneven pieces: 97 rows over 2 or 3 tensor-parallel ranks.
                    CHECK(region.ranges[0].size() <= 49);
                    partition::for_each_region_row(region, whole, region, [&](std::int64_t at, std::int64_t, std::int64_t n) {
                        for (std::int64_t i = at; i < at + n; ++i) {
                            const auto k = static_cast<std::size_t>(i);
                            covered[k] = true;
                            worst = std::max(worst, std::abs(got[r][k] - want[k]));
                        }
                    });
                }
            for (double w : want) scale = std::max(scale, std::abs(w));
            CHECK(std::all_of(covered.begin(), covered.end(), [](bool b) { return b; }));
            CHECK(worst / scale <= 1e-9);
        }
    }
}

TEST_CASE("a degree that divides no dim but the vocabulary's: the error names the op, the dim, its extent, the degree "
          "and the fix",
          "[plan][vocabulary][errors]") {
    // Heads 6 split 4 ways, by a hand-written rule and by the Megatron preset.
    const models::gpt_config c{.layers = 1, .hidden = 24, .heads = 6, .vocab = 97, .seq = 8, .batch = 4};
    auto m = models::gpt(c);
    plan::plan_spec mine;
    mine.devices = 4;
    plan::rule heads;
    heads.on.kinds = {&op_def_of<ops::Attention>()};
    heads.trans = std::vector<plan::split_spec>{{Dim::Head::id, "", {4, "", {}}, false}};
    mine.add(heads);
    const std::string expected =
        "dim Head has extent 6, which degree 4 does not divide; choose a divisor of 6 (1, 2, 3, 6) as the degree, or "
        "change the model so that the degree divides it (only a vocabulary is split unevenly, into near-equal pieces, "
        "as the Megatron presets pad it; no other dim is padded)";
    CHECK_THROWS_AS(partition::apply_plan(m.ir(), mine), plan_error);
    CHECK_THROWS_WITH(partition::apply_plan(m.ir(), mine),
                      Catch::StartsWith("plan: trans<Split<Headx4>> on attention 'blocks.0.attn/attention'") &&
                          Catch::EndsWith(expected));
    CHECK_THROWS_WITH(partition::apply_plan(m.ir(), presets::megatron(4)),
                      Catch::Contains("split_heads") && Catch::EndsWith(expected));
    // The vocabulary itself needs at least one row per piece.
    auto tiny = models::gpt({.layers = 1, .hidden = 24, .heads = 12, .vocab = 3, .seq = 8, .batch = 4});
    CHECK_THROWS_WITH(partition::apply_plan(tiny.ir(), presets::megatron(4)),
                      Catch::Contains("dim Vocab has extent 3, fewer than degree 4 pieces") &&
                          Catch::Contains("use a degree of at most 3"));
}
