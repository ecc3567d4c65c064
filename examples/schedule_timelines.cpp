// Draws loom's pipeline schedules: simulates each template with a backward that costs two
// forwards and writes an SVG timeline (docs/schedules/*.svg, shown in the README) and a
// Chrome trace (open it in Perfetto) per schedule.
//
//   schedule_timelines                       writes into docs/schedules/
//   schedule_timelines --out DIR             writes into DIR
//   schedule_timelines --check docs/schedules   exits 1 if a file there differs from what
//                                            this program writes (a ctest test runs it)
#include <filesystem>
#include <fstream>
#include <functional>
#include <iostream>
#include <sstream>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include <loom/schedule/all.hpp>

namespace {

namespace sched = loom::schedule;

struct picture {
    std::string name;  // file stem
    std::function<sched::schedule(const sched::cost_model&)> build;
};

std::vector<picture> pictures() {
    return {
        {"gpipe_4x8", [](const auto& c) { return sched::gpipe(4, 8, c); }},
        {"one_f_one_b_4x8", [](const auto& c) { return sched::one_f_one_b(4, 8, c); }},
        {"interleaved_4x2x8", [](const auto& c) { return sched::interleaved_one_f_one_b(4, 2, 8, c); }},
        {"three_f_one_b_4x4", [](const auto& c) { return sched::three_f_one_b(4, 4, c); }},
        {"interlaced_4x8", [](const auto& c) { return sched::interlaced(4, 8, 1, c); }},
    };
}

std::string read_file(const std::filesystem::path& path) {
    std::ifstream in(path, std::ios::binary);
    std::ostringstream text;
    text << in.rdbuf();
    return text.str();
}

}  // namespace

int main(int argc, char** argv) {
    CLI::App app{"Simulate loom's pipeline schedules and draw them as SVG timelines and Chrome traces"};
    std::string out = "docs/schedules", check;
    app.add_option("--out", out, "Folder to write the pictures into");
    app.add_option("--check", check, "Folder whose pictures must equal this program's output");
    CLI11_PARSE(app, argc, argv);

    // Figure 2 of the nnScaler paper draws a backward twice as long as a forward.
    sched::cost_model costs;
    costs.backward = 2.0;
    int stale = 0;
    for (const picture& p : pictures()) {
        const sched::simulation simulated = sched::simulate(p.build(costs), costs);
        const std::vector<std::pair<std::string, std::string>> files = {
            {p.name + ".svg", sched::svg_timeline(simulated)},
            {p.name + ".json", sched::chrome_trace_json(simulated)},
        };
        for (const auto& [file, text] : files) {
            if (!check.empty()) {
                const std::filesystem::path path = std::filesystem::path(check) / file;
                if (!std::filesystem::exists(path) || read_file(path) != text) {
                    std::cerr << "schedule_timelines: " << path.string()
                              << " is missing or stale; regenerate it with `schedule_timelines --out " << check
                              << "` from the source folder\n";
                    ++stale;
                }
                continue;
            }
            std::filesystem::create_directories(out);
            std::ofstream(std::filesystem::path(out) / file, std::ios::binary) << text;
        }
        std::cout << p.name << ": makespan " << simulated.makespan << ", bubble "
                  << 100.0 * simulated.bubble_fraction << "%\n";
    }
    return stale == 0 ? 0 : 1;
}
