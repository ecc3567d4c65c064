#pragma once
// Sharded training checkpoints: save, resume bit-identically, and load under another plan.
//
// A checkpoint is a directory DIR/step-00000010/ holding
//   rank-00003.safetensors   the pieces rank 3 writes: parameters, AdamW moments (or SGD
//                            momentum), each a box of a logical tensor ("wte@0:128,0:64")
//   rank-00003.json          the boxes, byte counts and CRC-32s of those pieces
//   manifest.json            everything else (io/checkpoint_manifest.hpp), written last
// Every element of every tensor is written by exactly one rank: a replicated piece by the
// lowest rank that holds it (train/ownership.hpp), a ZeRO shard by the rank that updates it.
//
// Saving is atomic: every file goes through io::write_file_durably into step-N.tmp/, the
// manifest last, then the directory is renamed to step-N and the parent flushed. A crash at
// any moment leaves step-N.tmp (ignored, removed by the next save) and every older
// checkpoint as it was. Ranks agree after each phase (a sum over the communicator), so a
// rank whose write fails makes every rank throw, and no manifest is written.
//
// Loading knows nothing of the saving plan: each rank asks, for each piece it holds now,
// which shards intersect its box, reads only the blocks of rows of those shards that hold
// the intersection (each block has its own CRC-32, checked) and copies the intersections. So a checkpoint saved under any plan loads under any other plan
// of the same model. Everything is read and checked before anything in the trainer is
// changed: a damaged checkpoint throws loom::data_error and leaves the trainer as it was.
//
// Bit-identical resume: the state is the parameters, the optimizer's buffers and step
// count, the trainer's step (which is also the learning-rate schedule's position and the
// dropout counter: masks are a pure function of (seed, step, element), ops/dropout.hpp)
// and, when given, the data loader's position. Restore them all and the next steps
// compute the same bits as the run that never stopped, under the same plan.
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <bit>
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <sstream>
#include <string>
#include <type_traits>
#include <variant>
#include <vector>

#include <nlohmann/json.hpp>

#include <loom/core/error.hpp>
#include <loom/core/linkage.hpp>
#include <loom/graph/fingerprint.hpp>
#include <loom/io/checkpoint_manifest.hpp>
#include <loom/io/crc32.hpp>
#include <loom/io/durable_file.hpp>
#include <loom/io/safetensors.hpp>
#include <loom/partition/partitioned_graph.hpp>
#include <loom/partition/region_copy.hpp>
#include <loom/runtime/comm/communicator.hpp>
#include <loom/train/data_loader.hpp>
#include <loom/train/distributed_trainer.hpp>
#include <loom/train/ownership.hpp>
#include <loom/train/trainer.hpp>

namespace loom::train {

static_assert(std::endian::native == std::endian::little,
              "train/checkpoint.hpp: shards are stored as the little-endian bytes of the values in memory; "
              "a big-endian host would need a byte swap on save and load");

struct checkpoint_options {
    int keep_last = 3;                           // complete checkpoints kept in the directory (>= 1)
    const io::write_faults* faults = nullptr;    // tests: stop a save at a chosen point
};

// What save_checkpoint wrote, or what load_checkpoint resumed from.
struct checkpoint_info {
    std::filesystem::path path;                  // DIR/step-00000010
    std::int64_t step = 0;                       // steps completed when it was saved
    std::uint64_t bytes = 0;                     // tensor bytes this rank wrote (save) or read (load)
    std::optional<data_loader_state> data;       // the data loader's position, if it was saved
};

// One piece of training state a rank holds: the values of box `region` of logical tensor
// `tensor`, and the parts of it (`written`) that this rank saves.
template <class T>
struct state_piece {
    std::string tensor;
    std::vector<std::int64_t> shape;
    partition::box region;
    std::span<T> values;
    std::vector<partition::box> written;
};

namespace detail {

inline std::string checkpoint_name(std::int64_t step) {
    char text[32];
    std::snprintf(text, sizeof text, "step-%08lld", static_cast<long long>(step));
    return text;
}

inline std::string rank_stem(int rank) {
    char text[32];
    std::snprintf(text, sizeof text, "rank-%05d", rank);
    return text;
}

inline io::index_box to_index_box(const partition::box& b) {
    io::index_box out;
    for (const auto& r : b.ranges) out.push_back({r.begin, r.end});
    return out;
}

inline partition::box to_box(const io::index_box& b) {
    partition::box out;
    for (const auto& r : b) out.ranges.push_back({r[0], r[1]});
    return out;
}

template <class T>
constexpr io::dtype element_dtype() {
    return std::is_same_v<T, float> ? io::dtype::f32 : io::dtype::f64;
}

// The model's identity: its parameters' names and shapes (with dims), in graph order, which
// no plan rewrites, and its op graph's fingerprint (graph/fingerprint.hpp), taken from the
// model before the plan rewrote it (partition::apply_plan records it).
LOOM_INLINE nlohmann::json model_parameters(const graph& g);

LOOM_INLINE std::string model_signature(const graph& g);

template <class T>
nlohmann::json optimizer_json(const std::variant<adamw<T>, sgd<T>>& opt) {
    return std::visit(
        [](const auto& o) -> nlohmann::json {
            if constexpr (std::is_same_v<std::decay_t<decltype(o)>, adamw<T>>) {
                const auto& x = o.options();
                return {{"kind", "adamw"},       {"steps", o.steps()}, {"beta1", x.beta1},
                        {"beta2", x.beta2},      {"eps", x.eps},       {"weight_decay", x.weight_decay}};
            } else {
                return {{"kind", "sgd"}, {"steps", o.steps()}};
            }
        },
        opt);
}

// The optimizer's buffers of slot s, with the suffix that names them in a checkpoint.
template <class T>
std::vector<std::pair<std::string, std::vector<T>*>> optimizer_buffers(std::variant<adamw<T>, sgd<T>>& opt, std::size_t s) {
    return std::visit(
        [&](auto& o) -> std::vector<std::pair<std::string, std::vector<T>*>> {
            if constexpr (std::is_same_v<std::decay_t<decltype(o)>, adamw<T>>)
                return {{".adam_m", &o.first_moment(s)}, {".adam_v", &o.second_moment(s)}};
            else
                return {{".momentum", &o.momentum(s)}};
        },
        opt);
}

inline nlohmann::json schedule_json(const lr_schedule& s) {
    return {{"peak", s.peak}, {"min_lr", s.min_lr}, {"warmup_steps", s.warmup_steps}, {"total_steps", s.total_steps}};
}

// Everything one rank saves or restores.
template <class T>
struct rank_state {
    std::vector<state_piece<T>> pieces;
    std::variant<adamw<T>, sgd<T>>* optimizer = nullptr;
    const graph* model = nullptr;     // the logical graph (parameters name the tensors)
    std::string op_graph;             // the model's fingerprint (graph/fingerprint.hpp): its forward ops
    nlohmann::json plan;
    trainer_options options;
    std::int64_t step = 0;
    int rank = 0;
    int world = 1;
    comm::communicator* comm = nullptr;  // null: one device
};

// A sum over ranks of a failure flag: every rank learns whether any rank failed a phase.
LOOM_INLINE bool any_rank_failed(comm::communicator* c, int world, bool failed);

// The bytes of one row (one index of the first dim) of a shard of box `region`.
template <class T>
std::size_t row_bytes_of(const partition::box& region) {
    if (region.rank() == 0) return sizeof(T);
    const std::int64_t rows = std::max<std::int64_t>(region.ranges[0].size(), 1);
    return std::max<std::size_t>(static_cast<std::size_t>(region.numel() / rows) * sizeof(T), sizeof(T));
}

// How a shard of box `region` is cut into checksummed blocks: whole rows of its first dim,
// at most 64 KiB each and at least 8 blocks where the shard has the rows, so that a reader
// needing a quarter of the rows of a small shard (a tensor-parallel slice loaded under
// ZeRO-3) reads about a quarter of it. Returns rows per block and bytes per block. Readers
// take the rows per block from the manifest, so the choice may change between versions.
template <class T>
std::pair<std::int64_t, std::size_t> checksum_blocks(const partition::box& region) {
    if (region.rank() == 0) return {1, sizeof(T)};
    const std::int64_t rows = std::max<std::int64_t>(region.ranges[0].size(), 1);
    const std::size_t row_bytes = row_bytes_of<T>(region);
    const auto by_size = static_cast<std::int64_t>((std::size_t{1} << 16) / row_bytes);
    const std::int64_t per_block = std::clamp<std::int64_t>(std::min(by_size, rows / 8), 1, rows);
    return {per_block, static_cast<std::size_t>(per_block) * row_bytes};
}

template <class T>
checkpoint_info save_state(rank_state<T>& s, const std::filesystem::path& directory, const checkpoint_options& options,
                           const data_loader_state* data) {
    namespace fs = std::filesystem;
    if (options.keep_last < 1)
        throw usage_error("save_checkpoint: keep_last is " + std::to_string(options.keep_last) +
                          "; keep at least the checkpoint being written (keep_last >= 1)");
    const fs::path final_dir = directory / checkpoint_name(s.step);
    fs::path staging = final_dir;
    staging += ".tmp";
    const std::string where = "save_checkpoint: rank " + std::to_string(s.rank) + " of " + std::to_string(s.world);

    // Phase 1 (rank 0): a fresh staging directory.
    std::string failure;
    if (s.rank == 0) {
        try {
            std::error_code ec;
            fs::create_directories(directory, ec);
            if (ec || !fs::is_directory(directory))
                throw data_error("cannot create the checkpoint directory '" + directory.string() + "': " +
                                 (ec ? ec.message() : std::string("a file of that name is in the way")) +
                                 "; pass a writable directory to --checkpoint / save_checkpoint");
            fs::remove_all(staging, ec);
            if (!fs::create_directory(staging, ec) || ec)
                throw data_error("cannot create '" + staging.string() + "': " + ec.message() +
                                 "; check that the checkpoint directory is writable and the disk not full");
        } catch (const std::exception& e) {
            failure = e.what();
        }
    }
    if (any_rank_failed(s.comm, s.world, !failure.empty()))
        throw data_error(where + ": " + (failure.empty() ? "rank 0 could not prepare " + staging.string() : failure) +
                         "; the previous checkpoints are intact");

    // Phase 2 (every rank): its shard file and its shard list. The safetensors file is
    // streamed: header first, then each shard copied out of its piece into one buffer,
    // checksummed and written, so no second copy of the rank's state is made.
    std::uint64_t written_bytes = 0;
    try {
        struct entry {
            const state_piece<T>* piece;
            partition::box region;
            std::uint64_t begin, end;
        };
        std::map<std::string, entry> entries;  // by key: the order safetensors writers use
        for (const auto& p : s.pieces)
            for (const auto& region : p.written) {
                if (region.numel() == 0 && region.rank() > 0) continue;
                entries.emplace(p.tensor + "@" + io::box_text(to_index_box(region)), entry{&p, region, 0, 0});
            }
        nlohmann::ordered_json header = nlohmann::ordered_json::object();
        std::uint64_t offset = 0;
        for (auto& [key, e] : entries) {
            std::vector<std::int64_t> extents;
            for (const auto& r : e.region.ranges) extents.push_back(r.size());
            e.begin = offset;
            offset += static_cast<std::uint64_t>(e.region.numel()) * sizeof(T);
            e.end = offset;
            header[key] = {{"dtype", io::dtype_name(element_dtype<T>())}, {"shape", extents},
                           {"data_offsets", {e.begin, e.end}}};
        }
        std::string text = header.dump();
        text.append((8 - text.size() % 8) % 8, ' ');
        const std::string file = rank_stem(s.rank) + ".safetensors";
        nlohmann::json shards = nlohmann::json::array();
        io::write_file_durably_by_parts(
            staging / file,
            [&](auto& append) {
                std::array<std::byte, 8> length{};
                for (int i = 0; i < 8; ++i) length[static_cast<std::size_t>(i)] = static_cast<std::byte>((text.size() >> (8 * i)) & 0xFF);
                append(std::span<const std::byte>(length));
                append(std::as_bytes(std::span(text.data(), text.size())));
                std::vector<T> buffer;
                for (const auto& [key, e] : entries) {
                    buffer.resize(static_cast<std::size_t>(e.region.numel()));
                    partition::copy_region(e.piece->values.data(), e.piece->region, buffer.data(), e.region, e.region);
                    const auto bytes = std::as_bytes(std::span<const T>(buffer));
                    append(bytes);
                    const auto [rows_per_block, block_bytes] = checksum_blocks<T>(e.region);
                    std::vector<std::uint32_t> block_crc;
                    for (std::size_t at = 0; at < bytes.size() || block_crc.empty(); at += block_bytes)
                        block_crc.push_back(io::crc32(bytes.subspan(at, std::min(block_bytes, bytes.size() - at))));
                    shards.push_back({{"tensor", e.piece->tensor}, {"shape", e.piece->shape}, {"key", key},
                                      {"file", file}, {"box", to_index_box(e.region)}, {"bytes", bytes.size()},
                                      {"rows_per_block", rows_per_block}, {"block_crc32", block_crc}});
                    written_bytes += bytes.size();
                }
            },
            options.faults);
        io::write_file_durably(staging / (rank_stem(s.rank) + ".json"), nlohmann::json{{"shards", shards}}.dump(),
                               options.faults);
    } catch (const std::exception& e) {
        failure = e.what();
    }
    if (any_rank_failed(s.comm, s.world, !failure.empty()))
        throw data_error(where + ": " + (failure.empty() ? "another rank could not write its shards" : failure) +
                         "; the previous checkpoints are intact");

    // Phase 3 (rank 0): the manifest, last, then the rename that makes the checkpoint exist.
    if (s.rank == 0) {
        try {
            io::checkpoint_manifest m;
            m.model_signature = model_signature(*s.model);
            m.model["parameters"] = model_parameters(*s.model);
            m.model["op_graph"] = s.op_graph;
            m.dtype = std::string(io::dtype_name(element_dtype<T>()));
            m.plan = s.plan;
            m.step = s.step;
            m.optimizer = optimizer_json(*s.optimizer);
            m.optimizer["clip_norm"] = s.options.clip_norm;
            m.schedule = schedule_json(s.options.schedule);
            m.schedule["position"] = s.step;
            if (data)
                m.data_loader = {{"seed", data->seed},
                                 {"epoch", data->epoch},
                                 {"cursor", data->cursor},
                                 {"window_count", data->window_count},
                                 {"shuffle", data->shuffle}};
            m.random = {{"init_seed", s.options.init_seed},
                        {"dropout_counter", s.step},
                        {"law", "dropout masks are a function of (op seed, dropout_counter, element index)"}};
            for (int r = 0; r < s.world; ++r) {
                const fs::path part = staging / (rank_stem(r) + ".json");
                std::ifstream in(part);
                if (!in) throw data_error("rank " + std::to_string(r) + "'s shard list '" + part.string() + "' is missing");
                const auto j = nlohmann::json::parse(in);
                for (const auto& sh : j.at("shards")) {
                    auto& t = m.tensors[sh.at("tensor").get<std::string>()];
                    t.shape = sh.at("shape").get<std::vector<std::int64_t>>();
                    t.shards.push_back({r, sh.at("file").get<std::string>(), sh.at("key").get<std::string>(),
                                        sh.at("box").get<io::index_box>(), sh.at("bytes").get<std::uint64_t>(),
                                        sh.at("rows_per_block").get<std::int64_t>(),
                                        sh.at("block_crc32").get<std::vector<std::uint32_t>>()});
                }
            }
            // Checked as a reader will check it: a manifest that does not tile every tensor
            // is a bug here, not a file to leave for a later run to trip over.
            (void)io::checkpoint_manifest::from_json(m.to_json(), (staging / io::checkpoint_manifest::file_name).string());
            io::write_file_durably(staging / io::checkpoint_manifest::file_name, m.to_json().dump(1), options.faults);
            if (options.faults && options.faults->before_rename) options.faults->before_rename(final_dir);
            std::error_code ec;
            fs::path replaced;
            if (fs::exists(final_dir)) {  // the same step saved again: swap, then drop the old one
                replaced = final_dir;
                replaced += ".old";
                fs::remove_all(replaced, ec);
                fs::rename(final_dir, replaced, ec);
                if (ec) throw data_error("cannot move the older '" + final_dir.string() + "' aside: " + ec.message());
            }
            fs::rename(staging, final_dir, ec);
            if (ec) throw data_error("cannot rename '" + staging.string() + "' to '" + final_dir.string() + "': " + ec.message());
            io::fsync_directory(directory);
            if (!replaced.empty()) fs::remove_all(replaced, ec);
            // Keep the newest keep_last complete checkpoints; drop stale staging directories.
            std::vector<std::pair<std::int64_t, fs::path>> complete;
            for (const auto& entry : fs::directory_iterator(directory)) {
                const std::string name = entry.path().filename().string();
                if (name.rfind("step-", 0) != 0 || !entry.is_directory()) continue;
                if (name.size() > 4 && (name.ends_with(".tmp") || name.ends_with(".old"))) {
                    fs::remove_all(entry.path(), ec);
                    continue;
                }
                if (fs::exists(entry.path() / io::checkpoint_manifest::file_name))
                    complete.emplace_back(std::stoll(name.substr(5)), entry.path());
            }
            std::sort(complete.begin(), complete.end());
            for (std::size_t i = 0; i + static_cast<std::size_t>(options.keep_last) < complete.size(); ++i)
                fs::remove_all(complete[i].second, ec);
        } catch (const std::exception& e) {
            failure = e.what();
        }
    }
    if (any_rank_failed(s.comm, s.world, !failure.empty()))
        throw data_error(where + ": " + (failure.empty() ? "rank 0 could not write the manifest" : failure) +
                         "; the previous checkpoints are intact");
    return {final_dir, s.step, written_bytes, data ? std::optional(*data) : std::nullopt};
}

// Reads bytes [offset, offset + out.size()) of a file.
LOOM_INLINE void read_range(const std::filesystem::path& path, std::uint64_t offset, std::span<std::byte> out);

// Reads every shard that meets this rank's pieces and checks it; changes nothing in `s`.
template <class T>
std::vector<std::vector<T>> read_pieces(const rank_state<T>& s, const std::filesystem::path& dir,
                                        const io::checkpoint_manifest& m, std::uint64_t& bytes_read) {
    const std::string manifest_path = (dir / io::checkpoint_manifest::file_name).string();
    const std::string expected_dtype(io::dtype_name(element_dtype<T>()));
    if (m.dtype != expected_dtype)
        throw data_error("checkpoint '" + dir.string() + "' holds " + m.dtype + " tensors but this trainer is " +
                         expected_dtype + "; resume with the precision it was saved in (float32: F32, float64: F64)");
    if (m.model_signature != model_signature(*s.model)) {
        const auto here = model_parameters(*s.model);
        const auto& there = m.model.at("parameters");
        std::string difference;
        for (const auto& [name, shape] : here.items()) {
            if (!there.contains(name)) {
                difference = "parameter '" + name + "' is not in the checkpoint";
                break;
            }
            if (there.at(name) != shape) {
                difference = "parameter '" + name + "' is " + shape.dump() + " here but " + there.at(name).dump() +
                             " in the checkpoint (another vocabulary, width or length?)";
                break;
            }
        }
        if (difference.empty()) difference = "the checkpoint's parameters are " + std::to_string(there.size()) +
                                             ", this model's " + std::to_string(here.size());
        throw data_error("checkpoint '" + dir.string() + "' was saved from another model: " + difference +
                         "; build the model with the configuration it was saved from, or start a new checkpoint "
                         "directory");
    }
    // The same parameters in another op graph (another activation, norm or wiring) is
    // another model too.
    if (m.model.contains("op_graph") && !s.op_graph.empty() && m.model.at("op_graph") != s.op_graph)
        throw data_error("checkpoint '" + dir.string() + "' was saved from another model: its op graph has fingerprint " +
                         m.model.at("op_graph").get<std::string>() + ", this model's is " + s.op_graph +
                         " (the same parameters, other ops); build the model it was saved from, or start a new "
                         "checkpoint directory");
    std::map<std::string, std::unique_ptr<io::safetensors_file>> files;
    std::vector<std::vector<T>> out;
    std::vector<T> part;
    for (const auto& p : s.pieces) {
        const auto t = m.tensors.find(p.tensor);
        if (t == m.tensors.end())
            throw data_error("checkpoint '" + dir.string() + "' has no tensor '" + p.tensor + "' (" + manifest_path +
                             "); it was saved with another optimizer or model; resume with the settings it was saved with");
        if (t->second.shape != p.shape)
            throw data_error("checkpoint '" + dir.string() + "': tensor '" + p.tensor + "' has another shape than here; "
                             "build the model it was saved from");
        std::vector<T> values(static_cast<std::size_t>(p.region.numel()));
        for (const auto& shard : t->second.shards) {
            const partition::box sb = to_box(shard.box);
            const partition::box common = partition::intersect(sb, p.region);
            if (p.region.rank() > 0 && common.empty()) continue;
            auto& f = files[shard.file];
            const auto path = dir / shard.file;
            if (!f) f = std::make_unique<io::safetensors_file>(path);
            const io::tensor_info& info = f->info(shard.key);
            if (info.dtype != element_dtype<T>() || info.byte_size() != shard.bytes)
                throw data_error("checkpoint file '" + path.string() + "': tensor '" + shard.key +
                                 "' does not match the manifest (dtype or size); the checkpoint is damaged: use an "
                                 "older one");
            // Only the checksummed blocks of rows this piece needs are read, straight into place.
            // The manifest's own blocks (checked when it was read: at least a row each, one
            // checksum per block), whatever size the loom that wrote it chose.
            const std::int64_t rows_per_block = shard.rows_per_block;
            const std::size_t block_bytes = static_cast<std::size_t>(rows_per_block) * row_bytes_of<T>(sb);
            partition::box read_box = sb;
            std::size_t first_block = 0, last_block = 1;
            if (sb.rank() > 0) {
                const std::int64_t first_row = common.ranges[0].begin - sb.ranges[0].begin;
                const std::int64_t end_row = common.ranges[0].end - sb.ranges[0].begin;
                first_block = static_cast<std::size_t>(first_row / rows_per_block);
                last_block = static_cast<std::size_t>((end_row + rows_per_block - 1) / rows_per_block);
                read_box.ranges[0].begin = sb.ranges[0].begin + static_cast<std::int64_t>(first_block) * rows_per_block;
                read_box.ranges[0].end =
                    std::min(sb.ranges[0].end, sb.ranges[0].begin + static_cast<std::int64_t>(last_block) * rows_per_block);
            }
            part.resize(static_cast<std::size_t>(read_box.numel()));
            const auto bytes = std::as_writable_bytes(std::span<T>(part));
            read_range(path, f->data_start() + info.begin + first_block * block_bytes, bytes);
            for (std::size_t k = first_block, at = 0; k < last_block; ++k, at += block_bytes) {
                const auto block = std::span<const std::byte>(bytes).subspan(at, std::min(block_bytes, bytes.size() - at));
                if (k >= shard.block_crc32.size() || io::crc32(block) != shard.block_crc32[k])
                    throw data_error("checkpoint file '" + path.string() + "': tensor '" + shard.key + "' block " +
                                     std::to_string(k) + " fails its CRC-32 check (the bytes changed after the save); "
                                     "the checkpoint is damaged: use an older one");
            }
            bytes_read += bytes.size();
            partition::copy_region(part.data(), read_box, values.data(), p.region, p.region.rank() ? common : sb);
        }
        out.push_back(std::move(values));
    }
    return out;
}

template <class T>
checkpoint_info load_state(rank_state<T>& s, const std::filesystem::path& dir, std::int64_t& step) {
    const io::checkpoint_manifest m = io::checkpoint_manifest::read(dir);
    const std::string kind = s.optimizer->index() == 0 ? "adamw" : "sgd";
    if (m.optimizer.value("kind", "") != kind)
        throw data_error("checkpoint '" + dir.string() + "' holds " + m.optimizer.value("kind", std::string("?")) +
                         " state but this trainer uses " + kind + "; resume with the optimizer it was saved with");
    checkpoint_info info{dir, m.step, 0, std::nullopt};
    auto values = read_pieces(s, dir, m, info.bytes);
    if (!m.data_loader.empty())
        info.data = data_loader_state{m.data_loader.at("seed").get<std::uint64_t>(), m.data_loader.at("epoch").get<std::uint64_t>(),
                                      m.data_loader.at("cursor").get<std::uint64_t>(),
                                      m.data_loader.at("window_count").get<std::uint64_t>(),
                                      m.data_loader.at("shuffle").get<std::uint64_t>()};
    // Everything is read and checked: now change the trainer.
    for (std::size_t i = 0; i < s.pieces.size(); ++i)
        std::copy(values[i].begin(), values[i].end(), s.pieces[i].values.begin());
    const auto optimizer_steps = m.optimizer.at("steps").get<std::int64_t>();
    std::visit([&](auto& o) { o.set_steps(optimizer_steps); }, *s.optimizer);
    step = m.step;
    return info;
}

template <class T>
rank_state<T> state_of(trainer<T>& t) {
    rank_state<T> s;
    s.optimizer = &t.optimizer();
    s.model = &t.ir();
    s.op_graph = model_fingerprint(t.ir());
    s.plan = {{"world", 1}, {"plan", "one device"}};
    s.step = t.steps();
    const graph& g = t.ir();
    auto shape_of = [&](tensor_id p) {
        std::vector<std::int64_t> e;
        for (const auto& a : g.tensor(p).dims) e.push_back(a.extent);
        return e;
    };
    for (tensor_id p : g.parameters) {
        const auto& d = g.tensor(p);
        const auto whole = partition::box::whole(d.dims);
        s.pieces.push_back({d.name, shape_of(p), whole, t.parameter(d.name), {whole}});
    }
    const std::size_t slots = std::visit([](auto& o) { return o.slots().size(); }, t.optimizer());
    for (std::size_t k = 0; k < slots; ++k) {
        const std::string name = std::visit([&](auto& o) { return o.slots()[k].name; }, t.optimizer());
        tensor_id p = no_id;
        for (tensor_id q : g.parameters)
            if (g.tensor(q).name == name) p = q;
        const auto whole = partition::box::whole(g.tensor(p).dims);
        for (auto [suffix, buffer] : optimizer_buffers(t.optimizer(), k))
            s.pieces.push_back({name + suffix, shape_of(p), whole, std::span<T>(*buffer), {whole}});
    }
    return s;
}

// The parts of `region` (an optimizer slot's box of parameter p on `rank`) that no lower
// rank's slot holds.
LOOM_INLINE std::vector<partition::box> owned_update_regions(const partition::partitioned_graph& plan, int rank, tensor_id p,
                                                             const partition::box& region);

}  // namespace detail

// How the saving run was partitioned, for the manifest (informative: loading reads only the
// boxes of the tensors). The one place that turns a plan into JSON for checkpoints.
LOOM_INLINE nlohmann::json plan_description(const partition::partitioned_graph& plan);

template <class T>
detail::rank_state<T> state_of(distributed_trainer<T>& t) {
    detail::rank_state<T> s;
    const auto& plan = t.plan();
    const graph& g = plan.ir();
    s.optimizer = &t.optimizer();
    s.model = &g;
    s.op_graph = plan.model_fingerprint;
    s.plan = plan_description(plan);
    s.options = t.options();
    s.step = t.steps();
    s.rank = t.rank();
    s.world = plan.world;
    s.comm = &t.communicator();
    auto shape_of = [&](tensor_id p) {
        std::vector<std::int64_t> e;
        for (const auto& a : g.tensor(p).dims) e.push_back(a.extent);
        return e;
    };
    for (const auto& piece : t.part().parameters) {
        const auto& d = g.tensor(piece.logical);
        s.pieces.push_back({d.name, shape_of(piece.logical), piece.region, t.local_values(piece.local),
                            owned_regions(plan, t.rank(), piece.logical, piece.region, false)});
    }
    const auto& regions = t.optimizer_regions();
    for (std::size_t k = 0; k < regions.size(); ++k) {
        const auto& [p, region] = regions[k];
        const auto owned = detail::owned_update_regions(plan, t.rank(), p, region);
        for (auto [suffix, buffer] : detail::optimizer_buffers(t.optimizer(), k))
            s.pieces.push_back({g.tensor(p).name + suffix, shape_of(p), region, std::span<T>(*buffer), owned});
    }
    return s;
}

// Saves one device's training state as DIR/step-<steps>. `data`: the loader's position
// after the last batch trained on, so that a resumed run draws the next one.
template <class T>
checkpoint_info save_checkpoint(trainer<T>& t, const std::filesystem::path& directory, const data_loader_state* data = nullptr,
                                const checkpoint_options& options = {}) {
    auto s = detail::state_of(t);
    s.options = t.options();
    return detail::save_state(s, directory, options, data);
}

// Collective: every rank of the plan calls it with the same directory (on a file system all
// ranks see) after the same step.
template <class T>
checkpoint_info save_checkpoint(distributed_trainer<T>& t, const std::filesystem::path& directory,
                                const data_loader_state* data = nullptr, const checkpoint_options& options = {}) {
    auto s = state_of(t);
    return detail::save_state(s, directory, options, data);
}

// Loads a checkpoint directory (DIR/step-N) into a trainer built for the same model and
// precision, under any plan. Throws loom::data_error, changing nothing, when it is
// incomplete, damaged or from another model. Restore the returned data state into the
// data loader to continue the same stream.
template <class T>
checkpoint_info load_checkpoint(trainer<T>& t, const std::filesystem::path& checkpoint) {
    auto s = detail::state_of(t);
    std::int64_t step = 0;
    auto info = detail::load_state(s, checkpoint, step);
    t.set_steps(step);
    return info;
}

template <class T>
checkpoint_info load_checkpoint(distributed_trainer<T>& t, const std::filesystem::path& checkpoint) {
    auto s = state_of(t);
    std::int64_t step = 0;
    auto info = detail::load_state(s, checkpoint, step);
    t.set_steps(step);
    return info;
}

// The newest complete checkpoint (one with a manifest) in `directory`, if any. Half-written
// saves (step-N.tmp) are never chosen.
LOOM_INLINE std::optional<std::filesystem::path> latest_checkpoint(const std::filesystem::path& directory);

}  // namespace loom::train

// Definitions: compiled here (header-only) or once in loom::compiled (core/linkage.hpp).
#if LOOM_HEADER_DEFINITIONS

namespace loom::train::detail {

LOOM_INLINE nlohmann::json model_parameters(const graph& g) {
    nlohmann::json params = nlohmann::json::object();
    for (tensor_id p : g.parameters) {
        std::vector<std::int64_t> extents;
        for (const auto& a : g.tensor(p).dims) extents.push_back(a.extent);
        params[g.tensor(p).name] = extents;
    }
    return params;
}

LOOM_INLINE std::string model_signature(const graph& g) {
    std::string text;
    for (tensor_id p : g.parameters) text += g.tensor(p).name + g.tensor(p).dims.to_string() + ";";
    char hex[16];
    std::snprintf(hex, sizeof hex, "%08x", io::crc32(text));
    return hex;
}

LOOM_INLINE bool any_rank_failed(comm::communicator* c, int world, bool failed) {
    if (!c) return failed;
    double flag = failed ? 1.0 : 0.0;
    c->all_reduce_sum(&flag, 1, comm::dtype::f64, comm::group::world(world));
    return flag > 0;
}

LOOM_INLINE void read_range(const std::filesystem::path& path, std::uint64_t offset, std::span<std::byte> out) {
    const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        throw data_error("checkpoint file '" + path.string() + "' cannot be opened: " + std::strerror(errno) +
                         "; check that it exists and is readable");
    std::size_t done = 0;
    while (done < out.size()) {
        const ssize_t n = ::pread(fd, out.data() + done, out.size() - done, static_cast<off_t>(offset + done));
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) {
            ::close(fd);
            throw data_error("checkpoint file '" + path.string() + "' ended at byte " + std::to_string(offset + done) +
                             " while " + std::to_string(out.size()) + " bytes were read from " + std::to_string(offset) +
                             "; it was truncated: use an older checkpoint");
        }
        done += static_cast<std::size_t>(n);
    }
    ::close(fd);
}

LOOM_INLINE std::vector<partition::box> owned_update_regions(const partition::partitioned_graph& plan, int rank, tensor_id p,
                                                             const partition::box& region) {
    std::vector<partition::box> mine{region};
    for (int r = 0; r < rank; ++r)
        for (const auto& gp : plan.devices[static_cast<std::size_t>(r)].gradients) {
            if (gp.logical != p) continue;
            const partition::box other = update_region(plan, r, gp.logical, gp.region);
            std::vector<partition::box> next;
            for (const auto& b : mine) subtract_box(b, other, next);
            mine = std::move(next);
        }
    return mine;
}
}  // namespace loom::train::detail

namespace loom::train {

LOOM_INLINE nlohmann::json plan_description(const partition::partitioned_graph& plan) {
    nlohmann::json devices = nlohmann::json::array();
    for (const auto& d : plan.devices) {
        nlohmann::json pieces = nlohmann::json::object();
        for (const auto& s : d.parameters) pieces[plan.ir().tensor(s.logical).name].push_back(s.region.to_string());
        devices.push_back(pieces);
    }
    return {{"world", plan.world}, {"plan", plan.plan_name}, {"zero", static_cast<int>(plan.zero)}, {"parameters", devices}};
}

LOOM_INLINE std::optional<std::filesystem::path> latest_checkpoint(const std::filesystem::path& directory) {
    namespace fs = std::filesystem;
    std::error_code ec;
    if (!fs::is_directory(directory, ec)) return std::nullopt;
    std::optional<std::pair<std::int64_t, fs::path>> best;
    for (const auto& entry : fs::directory_iterator(directory, ec)) {
        const std::string name = entry.path().filename().string();
        if (name.rfind("step-", 0) != 0 || name.find('.') != std::string::npos) continue;
        if (!fs::exists(entry.path() / io::checkpoint_manifest::file_name)) continue;
        std::int64_t step = 0;
        try {
            step = std::stoll(name.substr(5));
        } catch (const std::exception&) {
            continue;
        }
        if (!best || step > best->first) best = std::pair(step, entry.path());
    }
    if (!best) return std::nullopt;
    return best->second;
}

}  // namespace loom::train
#endif  // LOOM_HEADER_DEFINITIONS
