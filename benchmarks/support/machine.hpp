#pragma once
// What every benchmark record says about where and when it was measured: the CPU, the load,
// the commit, the time. Benchmarks include it as "support/machine.hpp".
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <fstream>
#include <memory>
#include <string>

namespace loom::bench {

// The standard output of `sh -c command`, without trailing newlines ("" if it cannot run).
inline std::string command_output(const std::string& command) {
    std::string out;
    std::unique_ptr<FILE, int (*)(FILE*)> pipe(popen(command.c_str(), "r"), pclose);
    if (!pipe) return out;
    char buf[4096];
    while (std::size_t n = std::fread(buf, 1, sizeof buf, pipe.get())) out.append(buf, n);
    while (!out.empty() && (out.back() == '\n' || out.back() == '\r' || out.back() == ' ')) out.pop_back();
    return out;
}

inline std::string cpu_model() {
    std::ifstream in("/proc/cpuinfo");
    for (std::string line; std::getline(in, line);)
        if (line.rfind("model name", 0) == 0) {
            const auto colon = line.find(':');
            if (colon != std::string::npos) return line.substr(std::min(line.size(), colon + 2));
        }
    return "unknown";
}

// The 1-minute load average, or -1 where /proc/loadavg is missing. Recorded because on a
// shared machine other processes take cores from what is measured.
inline double load_average() {
    std::ifstream file("/proc/loadavg");
    double one_minute = -1;
    if (!(file >> one_minute)) return -1;
    return one_minute;
}

// LOOM_GIT_REV when a build sets it, else git's short HEAD, else "unknown".
inline std::string git_revision() {
    if (const char* given = std::getenv("LOOM_GIT_REV"); given != nullptr && *given != '\0') return given;
    const std::string revision = command_output("git rev-parse --short HEAD 2>/dev/null");
    return revision.empty() ? "unknown" : revision;
}

inline std::string utc_now() {
    const std::time_t now = std::time(nullptr);
    std::tm parts{};
    gmtime_r(&now, &parts);
    char text[32];
    std::strftime(text, sizeof text, "%Y-%m-%dT%H:%M:%SZ", &parts);
    return text;
}

}  // namespace loom::bench
