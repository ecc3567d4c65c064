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

inline void write_record(const nlohmann::json& record, const std::string& path, int indent = 2) {
    const std::filesystem::path p(path);
    std::error_code ignored;  // a failure shows as the file not opening, below
    if (p.has_parent_path()) std::filesystem::create_directories(p.parent_path(), ignored);
    std::ofstream file(p);
    if (!(file << record.dump(indent) << '\n') || !file.flush())
        throw error("cannot write the record '" + path + "'; pass a writable --out path");
}

}  // namespace loom::bench
