#pragma once
// The manifest of a sharded checkpoint: one JSON file, written last, that says what the
// checkpoint holds and where. A checkpoint directory is complete exactly when its
// manifest exists (train/checkpoint.hpp writes it after every shard file is on disk).
//
//   {"format": "loom-checkpoint", "version": 1,
//    "model": {"signature": "9f3c...", "op_graph": "c41e07...", "parameters": {"wte": [256, 64], ...}},
//                                       (parameter names and shapes; the forward ops, graph/fingerprint.hpp)
//    "dtype": "F32",
//    "plan": {...},                       (how the saving run was partitioned; informative)
//    "step": 10,
//    "optimizer": {...}, "schedule": {...}, "data_loader": {...}, "random": {...},
//    "tensors": {"wte": {"shape": [256, 64],
//                        "shards": [{"rank": 0, "file": "rank-00000.safetensors",
//                                    "key": "wte@0:128,0:64", "box": [[0, 128], [0, 64]],
//                                    "bytes": 32768, "rows_per_block": 64,
//                                    "block_crc32": [123456789, ...]}, ...]}, ...}}
//
// A shard's checksums cover blocks of `rows_per_block` rows of its first dim (about 64 KiB
// each, contiguous in the row-major file), so a loader that needs some rows of a shard
// reads and checks only the blocks that hold them.
//
// The shards of a tensor tile it: they lie inside its shape, do not overlap and cover it.
// read() checks that, so a loader can trust every element to come from exactly one shard.
#include <algorithm>
#include <array>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include <loom/core/error.hpp>

namespace loom::io {

using index_box = std::vector<std::array<std::int64_t, 2>>;  // [begin, end) per axis

inline std::int64_t box_elements(const index_box& b) {
    std::int64_t n = 1;
    for (const auto& r : b) n *= std::max<std::int64_t>(r[1] - r[0], 0);
    return n;
}

inline std::string box_text(const index_box& b) {
    std::string s;
    for (std::size_t a = 0; a < b.size(); ++a) s += (a ? "," : "") + std::to_string(b[a][0]) + ":" + std::to_string(b[a][1]);
    return s;
}

struct checkpoint_shard {
    int rank = 0;              // the rank that wrote it
    std::string file;          // relative to the checkpoint directory
    std::string key;           // tensor name inside that safetensors file
    index_box box;             // where it lies in the whole tensor
    std::uint64_t bytes = 0;
    std::int64_t rows_per_block = 1;         // rows of the first dim per checksummed block
    std::vector<std::uint32_t> block_crc32;  // CRC-32 of each block of its bytes as stored
};

struct checkpoint_tensor {
    std::vector<std::int64_t> shape;
    std::vector<checkpoint_shard> shards;
};

struct checkpoint_manifest {
    static constexpr int version = 1;
    static constexpr const char* file_name = "manifest.json";

    std::string model_signature;
    nlohmann::json model = nlohmann::json::object();
    std::string dtype;  // "F32" or "F64", the element type of every tensor
    nlohmann::json plan = nlohmann::json::object();
    std::int64_t step = 0;
    nlohmann::json optimizer = nlohmann::json::object();
    nlohmann::json schedule = nlohmann::json::object();
    nlohmann::json data_loader = nlohmann::json::object();
    nlohmann::json random = nlohmann::json::object();
    std::map<std::string, checkpoint_tensor> tensors;

    nlohmann::json to_json() const {
        nlohmann::json j;
        j["format"] = "loom-checkpoint";
        j["version"] = version;
        j["model"] = model;
        j["model"]["signature"] = model_signature;
        j["dtype"] = dtype;
        j["plan"] = plan;
        j["step"] = step;
        j["optimizer"] = optimizer;
        j["schedule"] = schedule;
        j["data_loader"] = data_loader;
        j["random"] = random;
        nlohmann::json ts = nlohmann::json::object();
        for (const auto& [name, t] : tensors) {
            nlohmann::json shards = nlohmann::json::array();
            for (const auto& s : t.shards)
                shards.push_back({{"rank", s.rank}, {"file", s.file}, {"key", s.key}, {"box", s.box},
                                  {"bytes", s.bytes}, {"rows_per_block", s.rows_per_block},
                                  {"block_crc32", s.block_crc32}});
            ts[name] = {{"shape", t.shape}, {"shards", shards}};
        }
        j["tensors"] = ts;
        return j;
    }

    // Parses and checks a manifest; `where` names it in errors (loom::data_error).
    static checkpoint_manifest from_json(const nlohmann::json& j, const std::string& where) {
        auto fail = [&](const std::string& what) -> void {
            throw data_error("checkpoint manifest '" + where + "' " + what +
                             "; the checkpoint is damaged or was not written by loom: use an older checkpoint of the "
                             "directory, or save a new one");
        };
        checkpoint_manifest m;
        try {
            if (!j.is_object() || j.value("format", "") != "loom-checkpoint") fail("is not a loom checkpoint manifest");
            if (j.at("version").get<int>() != version)
                fail("has version " + j.at("version").dump() + " but this loom reads version " + std::to_string(version));
            m.model = j.at("model");
            m.model_signature = m.model.at("signature").get<std::string>();
            m.dtype = j.at("dtype").get<std::string>();
            m.plan = j.at("plan");
            m.step = j.at("step").get<std::int64_t>();
            m.optimizer = j.at("optimizer");
            m.schedule = j.at("schedule");
            m.data_loader = j.at("data_loader");
            m.random = j.at("random");
            for (const auto& [name, t] : j.at("tensors").items()) {
                checkpoint_tensor ct;
                ct.shape = t.at("shape").get<std::vector<std::int64_t>>();
                for (const auto& s : t.at("shards"))
                    ct.shards.push_back({s.at("rank").get<int>(), s.at("file").get<std::string>(),
                                         s.at("key").get<std::string>(), s.at("box").get<index_box>(),
                                         s.at("bytes").get<std::uint64_t>(), s.at("rows_per_block").get<std::int64_t>(),
                                         s.at("block_crc32").get<std::vector<std::uint32_t>>()});
                m.tensors.emplace(name, std::move(ct));
            }
        } catch (const nlohmann::json::exception& e) {
            fail(std::string("has a missing or mistyped field (") + e.what() + ")");
        }
        for (const auto& [name, t] : m.tensors) {
            std::int64_t whole = 1;
            for (auto e : t.shape) whole *= e;
            std::int64_t covered = 0;
            for (std::size_t i = 0; i < t.shards.size(); ++i) {
                const auto& s = t.shards[i];
                bool inside = s.box.size() == t.shape.size();
                for (std::size_t a = 0; inside && a < s.box.size(); ++a)
                    inside = 0 <= s.box[a][0] && s.box[a][0] <= s.box[a][1] && s.box[a][1] <= t.shape[a];
                if (!inside) fail("gives tensor '" + name + "' a shard [" + box_text(s.box) + "] outside its shape");
                for (std::size_t k = 0; k < i; ++k) {
                    const auto& o = t.shards[k].box;
                    bool overlap = !s.box.empty();
                    for (std::size_t a = 0; overlap && a < s.box.size(); ++a)
                        overlap = std::max(s.box[a][0], o[a][0]) < std::min(s.box[a][1], o[a][1]);
                    if (overlap || (s.box.empty() && o.empty()))
                        fail("gives tensor '" + name + "' overlapping shards [" + box_text(s.box) + "] and [" +
                             box_text(o) + "]");
                }
                const std::int64_t rows = s.box.empty() ? 1 : s.box[0][1] - s.box[0][0];
                if (s.rows_per_block < 1 ||
                    s.block_crc32.size() != static_cast<std::size_t>(std::max<std::int64_t>(1, (rows + s.rows_per_block - 1) / s.rows_per_block)))
                    fail("gives shard '" + s.key + "' of tensor '" + name + "' " + std::to_string(s.block_crc32.size()) +
                         " checksums for blocks of " + std::to_string(s.rows_per_block) + " of its " + std::to_string(rows) +
                         " rows");
                covered += box_elements(s.box);
            }
            if (covered != whole)
                fail("covers " + std::to_string(covered) + " of the " + std::to_string(whole) + " elements of tensor '" +
                     name + "'");
        }
        return m;
    }

    // Reads `dir`/manifest.json.
    static checkpoint_manifest read(const std::filesystem::path& dir) {
        const auto path = dir / file_name;
        std::ifstream in(path);
        if (!in)
            throw data_error("checkpoint '" + dir.string() + "' has no readable " + file_name +
                             ", so it is incomplete (a save that did not finish); resume from an older checkpoint");
        std::stringstream text;
        text << in.rdbuf();
        nlohmann::json j;
        try {
            j = nlohmann::json::parse(text.str());
        } catch (const nlohmann::json::parse_error& e) {
            throw data_error("checkpoint manifest '" + path.string() + "' is not valid JSON (" + e.what() +
                             "); the checkpoint is damaged: use an older checkpoint of the directory");
        }
        return from_json(j, path.string());
    }
};

}  // namespace loom::io
