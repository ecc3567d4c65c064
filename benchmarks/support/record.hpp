#pragma once
// Writing a benchmark's JSON record: the folder is made when missing, and a record that
// cannot be written is an error naming the path, never silently lost.
#include <nlohmann/json.hpp>

#include <filesystem>
#include <fstream>
#include <string>
#include <system_error>

#include <loom/core/error.hpp>

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

// Writes `record` to `path`, with "allocator" (allocator_name) added to an object that lacks it.
inline void write_record(const nlohmann::json& given, const std::string& path, int indent = 2) {
    nlohmann::json record = given;
    if (record.is_object() && !record.contains("allocator")) record["allocator"] = allocator_name();
    const std::filesystem::path p(path);
    std::error_code ignored;  // a failure shows as the file not opening, below
    if (p.has_parent_path()) std::filesystem::create_directories(p.parent_path(), ignored);
    std::ofstream file(p);
    if (!(file << record.dump(indent) << '\n') || !file.flush())
        throw error("cannot write the record '" + path + "'; pass a writable --out path");
}

}  // namespace loom::bench
