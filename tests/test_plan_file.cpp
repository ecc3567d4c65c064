// Plan files (io/plan_file.hpp): the one plan value, open parameters and choices included,
// goes to JSON and back unchanged and gives the same programs; every malformed file is
// refused with a loom::plan_error that names the file, the field and the fix.
#include <catch2/catch.hpp>

#include <filesystem>
#include <fstream>
#include <string>

#include <loom/io/plan_file.hpp>
#include <loom/models/gpt.hpp>
#include <loom/models/t5.hpp>
#include <loom/partition/apply.hpp>
#include <loom/plan/combinators.hpp>
#include <loom/plan/presets.hpp>

using namespace loom;

namespace {

models::gpt_config small() { return {.layers = 4, .hidden = 16, .heads = 4, .vocab = 32, .seq = 8, .batch = 8}; }

// Every way a plan file's text can be wrong must end in a plan_error (never a JSON library
// exception, never a silently different plan).
void check_refused(const nlohmann::json& j, const std::string& expect, const graph* model = nullptr) {
    INFO(j.dump());
    try {
        (void)io::plan_from_json(j, "plan.json", model);
        FAIL("the file was accepted");
    } catch (const plan_error& e) {
        CHECK_THAT(e.what(), Catch::Contains("plan.json") && Catch::Contains(expect));
    }
}

}  // namespace

TEST_CASE("a plan with every part goes to a file and back unchanged, and gives the same programs", "[io][plan_file]") {
    const auto c = small();
    const graph g = models::gpt(c).ir();
    constexpr auto space = plan::compose(
        plan::devices<4>, plan::on_all(plan::trans<Split<Dim::Batch>, plan::open<Pow2<1, 2>, "dp">>{}),
        plan::stages<2>, plan::micro_batches<plan::open<OneOf<2, 4>, "m">>,
        plan::order<plan::one_of<plan::GPipe, plan::OneFOneB, plan::Interleaved<2>>>,
        plan::on_layers<"blocks", 0, 1>(plan::recompute));
    const plan::plan_spec p = space.choose("dp", 2).choose("m", 4).choose("order", 1).spec();
    const std::string path = (std::filesystem::temp_directory_path() / "loom_test_plan_file.json").string();
    io::save_plan(p, path, g);
    const plan::plan_spec back = io::load_plan(path, g);
    std::filesystem::remove(path);
    CHECK(io::to_json(back) == io::to_json(p));
    CHECK(back.choices == p.choices);
    CHECK(plan::open_parameters(back) == std::vector<std::string>{"dp", "m", "order"});

    const auto a = partition::apply_plan(g, p), b = partition::apply_plan(g, back);
    REQUIRE(a.world == b.world);
    CHECK(a.order == b.order);
    for (int d = 0; d < a.world; ++d) {
        const graph& x = a.devices[static_cast<std::size_t>(d)].ir();
        const graph& y = b.devices[static_cast<std::size_t>(d)].ir();
        REQUIRE(x.nodes.size() == y.nodes.size());
        for (std::size_t i = 0; i < x.nodes.size(); ++i) CHECK(x.nodes[i].name == y.nodes[i].name);
    }

    // Presets with every other part: ZeRO as an open choice, Coshard's colocation, explicit
    // boundaries, devices per stage.
    plan::plan_spec q = plan::presets::pipeline(2, 4, {plan::schedule_kind::interleaved, 2}, plan::presets::coshard(2, 2));
    q.stages->boundaries = {1, 2, 3};
    q.zero_open = "zero";
    q.zero_allowed = {0, 1, 3};
    q.choose("zero", 1);
    CHECK(io::to_json(io::plan_from_json(io::to_json(q), "plan.json")) == io::to_json(q));

    // Open stage boundaries with a slack, and a cut chosen: back unchanged, the same cut.
    plan::plan_spec open = plan::presets::pipeline(2, 4);
    open.stages->boundaries_open = "cut";
    open.stages->boundary_slack = 1;
    open.choices["cut"] = 2;
    const nlohmann::json open_json = io::to_json(open, &g);
    CHECK(open_json.at("stages").at("boundaries") == nlohmann::json{{"open", "cut"}, {"slack", 1}});
    const plan::plan_spec open_back = io::plan_from_json(open_json, "plan.json", &g);
    CHECK(open_back.stages->boundaries_open == "cut");
    CHECK(open_back.stages->boundary_slack == 1);
    CHECK(plan::open_parameters(open_back) == std::vector<std::string>{"cut"});
    CHECK(io::to_json(open_back, &g) == open_json);
    CHECK(partition::apply_plan(g, open_back).order == partition::apply_plan(g, open).order);

    // Coshard's factor and the devices per stage as open parameters: back open, with their
    // ranges, and filled they give the same programs.
    plan::plan_spec cs = plan::presets::pipeline(2, 4, {plan::schedule_kind::one_f_one_b},
                                                 plan::presets::coshard(plan::degree_spec{2, "", {}}, plan::degree_spec{1, "cs", {1, 2}}));
    cs.stages->devices_per_stage = {1, "group", {2, 4}};
    const nlohmann::json cs_json = io::to_json(cs, &g);
    CHECK(cs_json.at("stages").at("devices_per_stage") == nlohmann::json{{"open", "group"}, {"allowed", {2, 4}}});
    CHECK(cs_json.at("rules").at(1).at("assign") ==
          nlohmann::json{{"colocate", {{"open", "cs"}, {"allowed", {1, 2}}}}, {"coshard", true}});
    const plan::plan_spec cs_back = io::plan_from_json(cs_json, "plan.json", &g);
    CHECK(plan::open_parameters(cs_back) == std::vector<std::string>{"cs", "group"});
    CHECK(io::to_json(cs_back, &g) == cs_json);
    cs.choose("cs", 2).choose("group", 2);
    const auto filled = partition::apply_plan(g, cs);
    const auto filled_back = partition::apply_plan(g, io::plan_from_json(io::to_json(cs, &g), "plan.json", &g));
    CHECK(filled.order == filled_back.order);
    for (int d = 0; d < filled.world; ++d)
        CHECK(filled.devices[static_cast<std::size_t>(d)].ir().nodes.size() ==
              filled_back.devices[static_cast<std::size_t>(d)].ir().nodes.size());
}

TEST_CASE("malformed plan files are refused naming the field and the fix", "[io][plan_file][errors]") {
    const auto c = small();
    const graph g = models::gpt(c).ir();
    const nlohmann::json good = io::to_json(plan::presets::pipeline(2, 4, {}, plan::presets::megatron(2)), &g);
    REQUIRE_NOTHROW(io::plan_from_json(good, "plan.json", &g));

    auto with = [&](auto edit) {
        nlohmann::json j = good;
        edit(j);
        return j;
    };
    check_refused(nlohmann::json::array(), "not a loom plan");
    check_refused(with([](auto& j) { j["format"] = "loom.configuration"; }), "not a loom plan");
    check_refused(with([](auto& j) { j["rules"][1]["assign"] = {{"colocate", 2}, {"coshard", 1}}; }),
                  "rules[1].assign.coshard must be true or false");
    check_refused(with([](auto& j) { j["rules"][1]["assign"] = {{"colocate", {{"allowed", {1, 2}}}}}; }),
                  "rules[1].assign.colocate needs \"open\"");
    check_refused(with([](auto& j) { j["stages"]["devices_per_stage"] = {{"open", "g"}, {"allowed", {2, -1}}}; }),
                  "stages.devices_per_stage.allowed[1] is -1, outside 0..");
    check_refused(with([](auto& j) { j["version"] = 7; }), "this loom reads version 1");
    check_refused(with([](auto& j) { j["devices"] = "four"; }), "\"devices\" must be an integer");
    check_refused(with([](auto& j) { j["devices"] = 2.5; }), "must be an integer");
    check_refused(with([](auto& j) { j["devices"] = 1ll << 40; }), "outside 1..");  // no silent narrowing
    check_refused(with([](auto& j) { j["devices"] = 0; }), "outside 1..");
    check_refused(with([](auto& j) { j["micro_batches"] = -4; }), "outside 1..");
    check_refused(with([](auto& j) { j["zero"] = 4; }), "outside 0..3");
    check_refused(with([](auto& j) { j["stages"]["count"] = true; }), "stages.count must be an integer");
    check_refused(with([](auto& j) { j["stages"]["boundries"] = {1}; }), "unknown field \"boundries\"");
    check_refused(with([](auto& j) { j["micro_batchs"] = 4; }), "unknown field \"micro_batchs\"");
    check_refused(with([](auto& j) { j["rules"][0]["trans"][0]["degree"] = "2"; }), "rules[0].trans[0].degree");
    check_refused(with([](auto& j) { j["rules"][1]["on"]["kinds"] = {"warp_drive"}; }), "not one of loom's op kinds");
    check_refused(with([](auto& j) { j["rules"] = 3; }), "\"rules\" must be an array");
    check_refused(with([](auto& j) { j["order"]["alternatives"] = {"2F2B"}; }), "\"1F1B\"");
    check_refused(with([](auto& j) { j["order"]["alternatives"] = {"GPipe", "1F1B"}; }), "no \"open\" name");
    check_refused(with([](auto& j) { j["choices"]["tp"] = 2; }), "not an open parameter");
    check_refused(with([](auto& j) { j["stages"]["boundaries"] = {{"slack", 1}}; }), "needs \"open\"");
    check_refused(with([](auto& j) { j["stages"]["boundaries"] = {{"open", "cut"}, {"slack", -1}}; }),
                  "stages.boundaries.slack");
    check_refused(with([](auto& j) { j["stages"]["boundaries"] = {{"open", 3}}; }), "stages.boundaries.open");
    check_refused(with([](auto& j) { j["stages"]["boundaries"] = {{"open", "cut"}, {"slak", 1}}; }),
                  "unknown field \"slak\"");

    // A plan made for another model is refused; the same model loads.
    const graph other = models::gpt({.layers = 6, .hidden = 16, .heads = 4, .vocab = 32, .seq = 8, .batch = 8}).ir();
    check_refused(good, "made for another model", &other);
    const graph t5 = models::t5({}).ir();
    check_refused(good, "made for another model", &t5);

    // Not JSON at all, or not there.
    const std::string path = (std::filesystem::temp_directory_path() / "loom_test_plan_file_broken.json").string();
    std::ofstream(path) << "{ \"format\": \"loom.plan\", ";
    CHECK_THROWS_WITH(io::load_plan(path, g), Catch::Contains(path) && Catch::Contains("not JSON"));
    std::filesystem::remove(path);
    CHECK_THROWS_AS(io::load_plan(path, g), plan_error);
    // Orders written as constraints are not stored.
    plan::plan_spec constrained = plan::presets::pipeline(2, 4, {plan::schedule_kind::from_constraints});
    CHECK_THROWS_WITH(io::to_json(constrained), Catch::Contains("constraints"));
}
