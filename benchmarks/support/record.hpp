#pragma once
// Writing a benchmark's JSON record: stamped with the machine, the load, the commit and the
// time when the record does not say them itself; the folder is made when missing, and a
// record that cannot be written is an error naming the path, never silently lost.
#include <nlohmann/json.hpp>

#include <filesystem>
#include <fstream>
#include <string>
#include <system_error>

#include <loom/core/error.hpp>

#include "machine.hpp"

namespace loom::bench {

// The malloc that served this program: loom's planning programs link mimalloc where it is
// found (CMake defines LOOM_PLANNING_ALLOCATOR for them), the others keep the C library's.
// Plan searches run about twice as fast with mimalloc, so every record says which it had.
inline const char* allocator_name() {
#ifdef LOOM_PLANNING_ALLOCATOR
    return LOOM_PLANNING_ALLOCATOR;
#else
    return "C library";
#endif
}

// Writes `record` to `path`, with "allocator" (allocator_name), "cpu", "load_average",
// "commit" and "date_utc" (machine.hpp) added to an object that lacks them.
inline void write_record(const nlohmann::json& given, const std::string& path, int indent = 2) {
    nlohmann::json record = given;
    if (record.is_object()) {
        if (!record.contains("allocator")) record["allocator"] = allocator_name();
        if (!record.contains("cpu")) record["cpu"] = cpu_model();
        if (!record.contains("load_average")) record["load_average"] = load_average();
        if (!record.contains("commit")) record["commit"] = git_revision();
        if (!record.contains("date_utc")) record["date_utc"] = utc_now();
    }
    const std::filesystem::path p(path);
    std::error_code ignored;  // a failure shows as the file not opening, below
    if (p.has_parent_path()) std::filesystem::create_directories(p.parent_path(), ignored);
    std::ofstream file(p);
    if (!(file << record.dump(indent) << '\n') || !file.flush())
        throw error("cannot write the record '" + path + "'; pass a writable --out path");
}

}  // namespace loom::bench
