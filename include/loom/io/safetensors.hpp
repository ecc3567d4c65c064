#pragma once
// safetensors: the tensor file format of the Hugging Face ecosystem, read and written
// without the Python or Rust package.
//
// Layout:
//   u64 little-endian  N, the header length in bytes
//   N bytes            a JSON object, padded with spaces so that N % 8 == 0:
//                        {"__metadata__": {"k": "v", ...},            (optional, strings only)
//                         "<name>": {"dtype": "F32", "shape": [2, 3], "data_offsets": [begin, end]}, ...}
//   the data section   every tensor's bytes, little-endian, row-major; [begin, end) is
//                      relative to the start of this section
// The data section has no holes and no overlaps: sorted by begin, each tensor starts where
// the previous one ended, the first at 0 and the last ends at the end of the file.
//
// safetensors_writer lays tensors out as the reference writer does, by descending dtype
// (8-byte types, then 4, 2 and 1) and then by name, and writes each header entry as
// {"dtype", "shape", "data_offsets"}. Because the header is padded to a multiple of 8 and
// larger dtypes come first, every tensor starts at an address aligned to its element size
// when the file is mapped, and the same tensors always give the same bytes.
//
// Example:
//   loom::io::safetensors_writer w;
//   w.add("wte", loom::io::dtype::f32, {256, 64}, weights);   // std::vector<float>
//   w.metadata("format", "pt");
//   w.write("model.safetensors");
//   loom::io::safetensors_file f("model.safetensors");
//   std::vector<float> back = f.read<float>("wte");
#include <algorithm>
#include <array>
#include <bit>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <limits>
#include <map>
#include <optional>
#include <ranges>
#include <span>
#include <string>
#include <string_view>
#include <system_error>
#include <type_traits>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include <loom/core/error.hpp>

namespace loom::io {

// Declared in the reference format's order of increasing alignment; the writer sorts on it.
enum class dtype { u8, f16, bf16, i32, f32, f64, i64 };

inline constexpr std::array<dtype, 7> all_dtypes{dtype::u8,  dtype::f16, dtype::bf16, dtype::i32,
                                                 dtype::f32, dtype::f64, dtype::i64};

// The name the format uses: dtype::bf16 -> "BF16".
constexpr std::string_view dtype_name(dtype type) noexcept {
    switch (type) {
        case dtype::u8: return "U8";
        case dtype::f16: return "F16";
        case dtype::bf16: return "BF16";
        case dtype::i32: return "I32";
        case dtype::f32: return "F32";
        case dtype::f64: return "F64";
        case dtype::i64: return "I64";
    }
    return "?";
}

constexpr std::size_t dtype_size(dtype type) noexcept {
    switch (type) {
        case dtype::u8: return 1;
        case dtype::f16:
        case dtype::bf16: return 2;
        case dtype::i32:
        case dtype::f32: return 4;
        case dtype::f64:
        case dtype::i64: return 8;
    }
    return 0;
}

constexpr std::optional<dtype> dtype_from_name(std::string_view name) noexcept {
    for (dtype type : all_dtypes) {
        if (dtype_name(type) == name) return type;
    }
    return std::nullopt;
}

// Which C++ element types may be read from / written as which dtypes. F16 and BF16 travel
// as their 16-bit patterns in std::uint16_t; a half-precision type elsewhere in loom can be
// added by specializing this template with `name` and `accepts`.
template <class T>
struct dtype_traits;

template <>
struct dtype_traits<float> {
    static constexpr std::string_view name = "float";
    static constexpr bool accepts(dtype t) noexcept { return t == dtype::f32; }
};
template <>
struct dtype_traits<double> {
    static constexpr std::string_view name = "double";
    static constexpr bool accepts(dtype t) noexcept { return t == dtype::f64; }
};
template <>
struct dtype_traits<std::int32_t> {
    static constexpr std::string_view name = "std::int32_t";
    static constexpr bool accepts(dtype t) noexcept { return t == dtype::i32; }
};
template <>
struct dtype_traits<std::int64_t> {
    static constexpr std::string_view name = "std::int64_t";
    static constexpr bool accepts(dtype t) noexcept { return t == dtype::i64; }
};
template <>
struct dtype_traits<std::uint8_t> {
    static constexpr std::string_view name = "std::uint8_t";
    static constexpr bool accepts(dtype t) noexcept { return t == dtype::u8; }
};
template <>
struct dtype_traits<std::uint16_t> {
    static constexpr std::string_view name = "std::uint16_t (F16 or BF16 bits)";
    static constexpr bool accepts(dtype t) noexcept { return t == dtype::f16 || t == dtype::bf16; }
};

template <class T>
concept safetensors_element = std::is_trivially_copyable_v<T> && requires(dtype t) {
    { dtype_traits<T>::accepts(t) } -> std::same_as<bool>;
    { dtype_traits<T>::name } -> std::convertible_to<std::string_view>;
};

// One tensor's entry in the header. begin and end are byte offsets into the data section.
struct tensor_info {
    io::dtype dtype = io::dtype::u8;
    std::vector<std::int64_t> shape;
    std::uint64_t begin = 0;
    std::uint64_t end = 0;

    // The product of the shape; 1 for a scalar (shape []).
    std::uint64_t element_count() const noexcept {
        std::uint64_t n = 1;
        for (std::int64_t d : shape) n *= static_cast<std::uint64_t>(d);
        return n;
    }
    std::uint64_t byte_size() const noexcept { return end - begin; }
};

namespace detail {

// The reference reader refuses headers above this size; so do we, so that a corrupt
// length cannot make us allocate gigabytes.
inline constexpr std::uint64_t safetensors_max_header_bytes = 100'000'000;

inline std::string safetensors_quote(const std::filesystem::path& path) { return "'" + path.string() + "'"; }

inline std::string safetensors_shape_text(const std::vector<std::int64_t>& shape) {
    std::string text = "[";
    for (std::size_t i = 0; i < shape.size(); ++i) text += (i ? ", " : "") + std::to_string(shape[i]);
    return text + "]";
}

// Copies elements to or from little-endian bytes; a plain copy on little-endian hosts.
template <class T>
void safetensors_copy_le(const void* from, void* to, std::size_t count) noexcept {
    if (count == 0) return;  // an empty vector's data() may be null, which memcpy forbids
    std::memcpy(to, from, count * sizeof(T));
    if constexpr (std::endian::native == std::endian::big && sizeof(T) > 1) {
        auto* bytes = static_cast<unsigned char*>(to);
        for (std::size_t i = 0; i < count; ++i) std::reverse(bytes + i * sizeof(T), bytes + (i + 1) * sizeof(T));
    }
}

inline constexpr std::string_view safetensors_rewrite =
    "write it again with loom::io::safetensors_writer or safetensors.torch.save_file";
inline constexpr std::string_view safetensors_fix =
    "the file is corrupt or was not written by a safetensors writer; write it again with "
    "loom::io::safetensors_writer or safetensors.torch.save_file";

}  // namespace detail

class safetensors_writer {
public:
    // Adds a tensor from raw little-endian bytes. Throws loom::usage_error for an empty,
    // reserved or repeated name, a negative extent, or a byte count that is not
    // product(shape) * dtype_size(type).
    void add(std::string name, dtype type, std::vector<std::int64_t> shape, std::span<const std::byte> bytes) {
        check_name(name);
        std::uint64_t elements = 1;
        for (std::int64_t d : shape) {
            if (d < 0) {
                throw usage_error("safetensors_writer::add: tensor '" + name + "' has negative extent " + std::to_string(d) +
                                  " in shape " + detail::safetensors_shape_text(shape) + "; extents must be >= 0");
            }
            elements *= static_cast<std::uint64_t>(d);
        }
        if (elements * dtype_size(type) != bytes.size()) {
            throw usage_error("safetensors_writer::add: tensor '" + name + "' of dtype " + std::string(dtype_name(type)) +
                              " and shape " + detail::safetensors_shape_text(shape) + " needs " +
                              std::to_string(elements * dtype_size(type)) + " bytes but " + std::to_string(bytes.size()) +
                              " were given; pass data of exactly product(shape) elements");
        }
        entries_.emplace(std::move(name), entry{type, std::move(shape), std::vector<std::byte>(bytes.begin(), bytes.end())});
    }

    // Adds a tensor from typed values, e.g. a std::vector<float> as dtype::f32. The element
    // type must match the dtype (dtype_traits<T>::accepts).
    template <std::ranges::contiguous_range R>
        requires safetensors_element<std::ranges::range_value_t<R>>
    void add(std::string name, dtype type, std::vector<std::int64_t> shape, const R& values) {
        using T = std::ranges::range_value_t<R>;
        if (!dtype_traits<T>::accepts(type)) {
            throw usage_error("safetensors_writer::add: tensor '" + name + "' is declared " + std::string(dtype_name(type)) +
                              " but its elements are " + std::string(dtype_traits<T>::name) +
                              "; pass elements of the matching type (F32 float, F64 double, I32 std::int32_t, "
                              "I64 std::int64_t, U8 std::uint8_t, F16/BF16 std::uint16_t)");
        }
        const std::size_t count = static_cast<std::size_t>(std::ranges::size(values));
        std::vector<std::byte> bytes(count * sizeof(T));
        detail::safetensors_copy_le<T>(std::ranges::data(values), bytes.data(), count);
        add(std::move(name), type, std::move(shape), std::span<const std::byte>(bytes));
    }

    // Sets a "__metadata__" entry; a later call with the same key replaces the value.
    void metadata(std::string key, std::string value) { metadata_[std::move(key)] = std::move(value); }

    std::size_t size() const noexcept { return entries_.size(); }

    // The whole file, as write() stores it.
    std::vector<std::byte> serialize() const {
        std::vector<std::pair<const std::string*, const entry*>> order;
        order.reserve(entries_.size());
        for (const auto& [name, e] : entries_) order.emplace_back(&name, &e);
        std::stable_sort(order.begin(), order.end(), [](const auto& a, const auto& b) {
            return static_cast<int>(a.second->type) > static_cast<int>(b.second->type);
        });  // entries_ is already sorted by name, so ties stay in name order

        nlohmann::ordered_json header = nlohmann::ordered_json::object();
        if (!metadata_.empty()) header["__metadata__"] = metadata_;
        std::uint64_t offset = 0;
        for (const auto& [name, e] : order) {
            nlohmann::ordered_json info = nlohmann::ordered_json::object();
            info["dtype"] = dtype_name(e->type);
            info["shape"] = e->shape;
            info["data_offsets"] = {offset, offset + e->bytes.size()};
            header[*name] = std::move(info);
            offset += e->bytes.size();
        }
        std::string text;
        try {
            text = header.dump();
        } catch (const nlohmann::json::exception& ex) {
            throw usage_error(std::string("safetensors_writer: a tensor name or metadata string is not valid UTF-8 (") +
                              ex.what() + "); use UTF-8 names and values");
        }
        text.append((8 - text.size() % 8) % 8, ' ');

        std::vector<std::byte> file(8 + text.size() + offset);
        const std::uint64_t n = text.size();
        for (int i = 0; i < 8; ++i) file[static_cast<std::size_t>(i)] = static_cast<std::byte>((n >> (8 * i)) & 0xFF);
        std::memcpy(file.data() + 8, text.data(), text.size());
        std::size_t at = 8 + text.size();
        for (const auto& [name, e] : order) {
            if (!e->bytes.empty()) std::memcpy(file.data() + at, e->bytes.data(), e->bytes.size());
            at += e->bytes.size();
        }
        return file;
    }

    // Writes beside `path` and renames into place, so a reader never sees half a file.
    // Throws loom::data_error when the file cannot be written.
    void write(const std::filesystem::path& path) const {
        const std::vector<std::byte> file = serialize();
        std::filesystem::path partial = path;
        partial += ".partial";
        {
            std::ofstream out(partial, std::ios::binary | std::ios::trunc);
            if (!out) {
                throw data_error("safetensors_writer::write: cannot create " + detail::safetensors_quote(partial) +
                                 "; check that the directory exists and is writable");
            }
            out.write(reinterpret_cast<const char*>(file.data()), static_cast<std::streamsize>(file.size()));
            out.close();
            if (!out) {
                throw data_error("safetensors_writer::write: writing " + std::to_string(file.size()) + " bytes to " +
                                 detail::safetensors_quote(partial) + " failed; check free disk space");
            }
        }
        std::error_code ec;
        std::filesystem::rename(partial, path, ec);
        if (ec) {
            throw data_error("safetensors_writer::write: cannot rename " + detail::safetensors_quote(partial) + " to " +
                             detail::safetensors_quote(path) + ": " + ec.message() + "; check that the target is writable");
        }
    }

private:
    struct entry {
        dtype type;
        std::vector<std::int64_t> shape;
        std::vector<std::byte> bytes;
    };

    void check_name(const std::string& name) const {
        if (name.empty()) throw usage_error("safetensors_writer::add: a tensor name is empty; give every tensor a name");
        if (name == "__metadata__") {
            throw usage_error("safetensors_writer::add: '__metadata__' is reserved for the metadata map; rename the "
                              "tensor and use safetensors_writer::metadata for string entries");
        }
        if (entries_.contains(name)) {
            throw usage_error("safetensors_writer::add: tensor '" + name + "' was already added; tensor names must be unique");
        }
    }

    std::map<std::string, entry, std::less<>> entries_;
    std::map<std::string, std::string> metadata_;
};

// A safetensors file whose header is read and fully validated on construction; tensor
// data is read on demand. Every error is a loom::data_error naming the file, the tensor
// where there is one, what is wrong and how to get a good file.
class safetensors_file {
public:
    explicit safetensors_file(std::filesystem::path path) : path_(std::move(path)) { load(); }

    const std::filesystem::path& path() const noexcept { return path_; }

    // Tensor names in sorted order.
    std::vector<std::string> names() const {
        std::vector<std::string> out;
        out.reserve(tensors_.size());
        for (const auto& [name, info] : tensors_) out.push_back(name);
        return out;
    }

    std::size_t size() const noexcept { return tensors_.size(); }
    bool contains(std::string_view name) const { return tensors_.find(name) != tensors_.end(); }

    const tensor_info& info(std::string_view name) const {
        const auto it = tensors_.find(name);
        if (it == tensors_.end()) {
            std::string known;
            std::size_t shown = 0;
            for (const auto& [n, i] : tensors_) {
                if (shown++ == 8) {
                    known += ", ...";
                    break;
                }
                known += (known.empty() ? "" : ", ") + n;
            }
            fail("has no tensor '" + std::string(name) + "'; it holds " + std::to_string(tensors_.size()) + " tensors" +
                 (known.empty() ? std::string() : ": " + known) + "; check the name");
        }
        return it->second;
    }

    const std::map<std::string, std::string>& metadata() const noexcept { return metadata_; }

    // Where the data section starts in the file: tensor t's bytes are at
    // [data_start() + t.begin, data_start() + t.end), for readers that read ranges themselves.
    std::uint64_t data_start() const noexcept { return data_start_; }

    // The tensor's bytes as stored (little-endian, row-major).
    std::vector<std::byte> read_bytes(std::string_view name) const {
        const tensor_info& t = info(name);
        std::vector<std::byte> bytes(static_cast<std::size_t>(t.byte_size()));
        if (bytes.empty()) return bytes;
        std::ifstream in(path_, std::ios::binary);
        if (!in) fail("cannot be opened to read tensor '" + std::string(name) + "'; check that it still exists");
        in.seekg(static_cast<std::streamoff>(data_start_ + t.begin));
        in.read(reinterpret_cast<char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
        if (static_cast<std::size_t>(in.gcount()) != bytes.size()) {
            fail("ended while reading tensor '" + std::string(name) + "' (bytes " + std::to_string(data_start_ + t.begin) +
                 " to " + std::to_string(data_start_ + t.end) + "); it was truncated after it was opened, " +
                 std::string(detail::safetensors_fix));
        }
        return bytes;
    }

    // The tensor's elements; T must match its dtype (see dtype_traits).
    template <safetensors_element T>
    std::vector<T> read(std::string_view name) const {
        const tensor_info& t = info(name);
        if (!dtype_traits<T>::accepts(t.dtype)) {
            fail("stores tensor '" + std::string(name) + "' as " + std::string(dtype_name(t.dtype)) + " but it was read as " +
                 std::string(dtype_traits<T>::name) + "; read it with the element type of its dtype (F32 float, F64 double, "
                 "I32 std::int32_t, I64 std::int64_t, U8 std::uint8_t, F16/BF16 std::uint16_t)");
        }
        const std::vector<std::byte> bytes = read_bytes(name);
        std::vector<T> values(bytes.size() / sizeof(T));
        detail::safetensors_copy_le<T>(bytes.data(), values.data(), values.size());
        return values;
    }

private:
    [[noreturn]] void fail(const std::string& what) const {
        throw data_error("safetensors_file: " + detail::safetensors_quote(path_) + " " + what);
    }

    [[noreturn]] void fail_tensor(const std::string& name, const std::string& what) const {
        fail("tensor '" + name + "' " + what + "; " + std::string(detail::safetensors_fix));
    }

    void load() {
        std::error_code ec;
        const auto status = std::filesystem::status(path_, ec);
        if (!std::filesystem::exists(status)) {
            fail("does not exist; check the path or write it with loom::io::safetensors_writer");
        }
        if (!std::filesystem::is_regular_file(status)) fail("is not a regular file; pass the path of a .safetensors file");
        const std::uint64_t file_bytes = std::filesystem::file_size(path_, ec);
        if (ec) fail("cannot be sized: " + ec.message());
        if (file_bytes < 8) {
            fail("is " + std::to_string(file_bytes) + " bytes long, too short for the 8-byte header length; " +
                 std::string(detail::safetensors_fix));
        }
        std::ifstream in(path_, std::ios::binary);
        if (!in) fail("cannot be opened for reading; check its permissions");
        unsigned char length_bytes[8] = {};
        in.read(reinterpret_cast<char*>(length_bytes), 8);
        std::uint64_t header_bytes = 0;
        for (int i = 0; i < 8; ++i) header_bytes |= static_cast<std::uint64_t>(length_bytes[i]) << (8 * i);
        if (header_bytes > file_bytes - 8) {
            fail("declares a header of " + std::to_string(header_bytes) + " bytes, but only " +
                 std::to_string(file_bytes - 8) + " bytes follow the length field, so the file is truncated or is not "
                 "a safetensors file; " + std::string(detail::safetensors_rewrite));
        }
        if (header_bytes > detail::safetensors_max_header_bytes) {
            fail("declares a header of " + std::to_string(header_bytes) + " bytes, above the " +
                 std::to_string(detail::safetensors_max_header_bytes) + "-byte limit that safetensors readers enforce; " +
                 std::string(detail::safetensors_fix));
        }
        std::string text(static_cast<std::size_t>(header_bytes), '\0');
        in.read(text.data(), static_cast<std::streamsize>(text.size()));
        if (static_cast<std::size_t>(in.gcount()) != text.size()) fail("could not be read; check the disk");
        data_start_ = 8 + header_bytes;

        nlohmann::json header;
        try {
            header = nlohmann::json::parse(text);
        } catch (const nlohmann::json::parse_error& ex) {
            fail("has a header that is not valid JSON (" + std::string(ex.what()) + "); " +
                 std::string(detail::safetensors_fix));
        }
        if (!header.is_object()) {
            fail("has a JSON header that is a " + std::string(header.type_name()) + ", not an object; " +
                 std::string(detail::safetensors_fix));
        }

        std::vector<std::pair<std::string, const tensor_info*>> by_offset;
        for (const auto& [name, value] : header.items()) {
            if (name == "__metadata__") {
                read_metadata(value);
                continue;
            }
            const auto [it, inserted] = tensors_.emplace(name, parse_entry(name, value));
            by_offset.emplace_back(name, &it->second);
        }
        std::sort(by_offset.begin(), by_offset.end(), [](const auto& a, const auto& b) {
            return std::pair(a.second->begin, a.second->end) < std::pair(b.second->begin, b.second->end);
        });

        const std::uint64_t data_bytes = file_bytes - data_start_;
        std::uint64_t expected_begin = 0;
        std::string previous;
        for (const auto& [name, t] : by_offset) {
            if (t->end > data_bytes) {
                fail_tensor(name, "has data_offsets [" + std::to_string(t->begin) + ", " + std::to_string(t->end) +
                                      ") beyond the data section of " + std::to_string(data_bytes) + " bytes");
            }
            if (t->begin < expected_begin) {
                fail_tensor(name, "has data_offsets [" + std::to_string(t->begin) + ", " + std::to_string(t->end) +
                                      ") that overlap tensor '" + previous + "', which ends at " +
                                      std::to_string(expected_begin));
            }
            if (t->begin > expected_begin) {
                fail_tensor(name, "starts at data offset " + std::to_string(t->begin) + ", leaving a hole after " +
                                      (previous.empty() ? std::string("the start of the data section")
                                                        : "tensor '" + previous + "'") +
                                      " at " + std::to_string(expected_begin) + "; the data section must have no gaps");
            }
            expected_begin = t->end;
            previous = name;
        }
        if (expected_begin != data_bytes) {
            fail("has " + std::to_string(data_bytes - expected_begin) + " bytes after the last tensor" +
                 (previous.empty() ? std::string() : " '" + previous + "'") + " (data section of " +
                 std::to_string(data_bytes) + " bytes, tensors cover " + std::to_string(expected_begin) + "); " +
                 std::string(detail::safetensors_fix));
        }
    }

    void read_metadata(const nlohmann::json& value) {
        if (!value.is_object()) {
            fail("has a \"__metadata__\" entry that is a " + std::string(value.type_name()) +
                 ", not an object of strings; " + std::string(detail::safetensors_fix));
        }
        for (const auto& [key, v] : value.items()) {
            if (!v.is_string()) {
                fail("has metadata \"" + key + "\" that is a " + std::string(v.type_name()) +
                     ", but metadata values must be strings; " + std::string(detail::safetensors_fix));
            }
            metadata_[key] = v.get<std::string>();
        }
    }

    tensor_info parse_entry(const std::string& name, const nlohmann::json& value) const {
        if (!value.is_object()) fail_tensor(name, "is a " + std::string(value.type_name()) + ", not an object");
        tensor_info t;

        const auto dtype_it = value.find("dtype");
        if (dtype_it == value.end() || !dtype_it->is_string()) fail_tensor(name, "has no string \"dtype\"");
        const std::string type_name = dtype_it->get<std::string>();
        const std::optional<dtype> type = dtype_from_name(type_name);
        if (!type) {
            fail("tensor '" + name + "' has dtype \"" + type_name +
                 "\", which loom does not read (it reads F32, F64, I32, I64, BF16, F16, U8); convert the tensor to one of "
                 "these before saving");
        }
        t.dtype = *type;

        const auto shape_it = value.find("shape");
        if (shape_it == value.end() || !shape_it->is_array()) fail_tensor(name, "has no array \"shape\"");
        std::uint64_t elements = 1;
        bool overflow = false;
        for (const auto& d : *shape_it) {
            if (!d.is_number_unsigned() || d.get<std::uint64_t>() > static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max())) {
                fail_tensor(name, "has shape " + shape_it->dump() + " with an extent that is not a non-negative integer");
            }
            const std::uint64_t extent = d.get<std::uint64_t>();
            if (extent != 0 && elements > std::numeric_limits<std::uint64_t>::max() / extent) overflow = true;
            elements *= extent;
            t.shape.push_back(static_cast<std::int64_t>(extent));
        }
        const std::size_t width = dtype_size(t.dtype);
        if (overflow || elements > std::numeric_limits<std::uint64_t>::max() / width) {
            fail_tensor(name, "has shape " + shape_it->dump() + ", whose byte size overflows 64 bits");
        }

        const auto offsets_it = value.find("data_offsets");
        if (offsets_it == value.end() || !offsets_it->is_array() || offsets_it->size() != 2 ||
            !(*offsets_it)[0].is_number_unsigned() || !(*offsets_it)[1].is_number_unsigned()) {
            fail_tensor(name, "has no \"data_offsets\" of two non-negative integers [begin, end)");
        }
        t.begin = (*offsets_it)[0].get<std::uint64_t>();
        t.end = (*offsets_it)[1].get<std::uint64_t>();
        if (t.end < t.begin) {
            fail_tensor(name, "has data_offsets [" + std::to_string(t.begin) + ", " + std::to_string(t.end) +
                                  ") that end before they begin");
        }
        if (t.end - t.begin != elements * width) {
            fail_tensor(name, "has " + std::to_string(t.end - t.begin) + " bytes (data_offsets [" + std::to_string(t.begin) +
                                  ", " + std::to_string(t.end) + ")) but dtype " + type_name + " and shape " +
                                  detail::safetensors_shape_text(t.shape) + " need " + std::to_string(elements) + " x " +
                                  std::to_string(width) + " = " + std::to_string(elements * width) + " bytes");
        }
        return t;
    }

    std::filesystem::path path_;
    std::map<std::string, tensor_info, std::less<>> tensors_;
    std::map<std::string, std::string> metadata_;
    std::uint64_t data_start_ = 0;
};

}  // namespace loom::io
