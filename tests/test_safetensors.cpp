// safetensors: round trips for every dtype, byte-for-byte agreement with the reference
// writer, and a clear loom::data_error for every kind of corrupt file.
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include <catch2/catch.hpp>

#include <loom/io/safetensors.hpp>

namespace {

using Catch::Contains;
using loom::io::dtype;
using loom::io::safetensors_file;
using loom::io::safetensors_writer;

std::filesystem::path temp_file(const std::string& name) {
    const auto dir = std::filesystem::temp_directory_path() / "loom-test-safetensors";
    std::filesystem::create_directories(dir);
    return dir / name;
}

std::vector<std::byte> from_hex(std::string_view hex) {
    std::vector<std::byte> bytes;
    for (std::size_t i = 0; i + 1 < hex.size(); i += 2) {
        bytes.push_back(static_cast<std::byte>(std::stoi(std::string(hex.substr(i, 2)), nullptr, 16)));
    }
    return bytes;
}

void write_bytes(const std::filesystem::path& path, const std::vector<std::byte>& bytes) {
    std::ofstream out(path, std::ios::binary | std::ios::trunc);
    out.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
}

std::vector<std::byte> read_all(const std::filesystem::path& path) {
    std::ifstream in(path, std::ios::binary);
    std::vector<char> chars((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    std::vector<std::byte> bytes(chars.size());
    if (!chars.empty()) std::memcpy(bytes.data(), chars.data(), chars.size());
    return bytes;
}

// A file with the given header text (padded to a multiple of 8 as the format asks) and
// `data_bytes` zero bytes of data.
void write_raw(const std::filesystem::path& path, std::string header, std::size_t data_bytes) {
    header.append((8 - header.size() % 8) % 8, ' ');
    std::vector<std::byte> bytes(8 + header.size() + data_bytes);
    for (int i = 0; i < 8; ++i) bytes[static_cast<std::size_t>(i)] = static_cast<std::byte>((header.size() >> (8 * i)) & 0xFF);
    std::memcpy(bytes.data() + 8, header.data(), header.size());
    write_bytes(path, bytes);
}

// Written by the reference implementation (Python safetensors 0.8.0, save_file) from
//   {"a": arange(6, float32).reshape(2, 3), "b": int64 [1, -2, 3], "c": uint8 [7, 8, 9, 250, 0],
//    "d": bfloat16 [1.5, -2.0], "e": float64 scalar 3.25}, metadata {"format": "pt"}.
// Regenerate with that script if the test inputs change.
constexpr std::string_view reference_file_hex =
    "38010000000000007b225f5f6d657461646174615f5f223a7b22666f726d6174223a227074227d2c2262223a7b2264747970"
    "65223a22493634222c227368617065223a5b335d2c22646174615f6f666673657473223a5b302c32345d7d2c2265223a7b22"
    "6474797065223a22463634222c227368617065223a5b5d2c22646174615f6f666673657473223a5b32342c33325d7d2c2261"
    "223a7b226474797065223a22463332222c227368617065223a5b322c335d2c22646174615f6f666673657473223a5b33322c"
    "35365d7d2c2264223a7b226474797065223a2242463136222c227368617065223a5b325d2c22646174615f6f666673657473"
    "223a5b35362c36305d7d2c2263223a7b226474797065223a225538222c227368617065223a5b355d2c22646174615f6f6666"
    "73657473223a5b36302c36355d7d7d20202020200100000000000000feffffffffffffff0300000000000000000000000000"
    "0a40000000000000803f0000004000004040000080400000a040c03f00c0070809fa00";

safetensors_writer reference_inputs() {
    safetensors_writer w;
    w.add("a", dtype::f32, {2, 3}, std::vector<float>{0, 1, 2, 3, 4, 5});
    w.add("b", dtype::i64, {3}, std::vector<std::int64_t>{1, -2, 3});
    w.add("c", dtype::u8, {5}, std::vector<std::uint8_t>{7, 8, 9, 250, 0});
    w.add("d", dtype::bf16, {2}, std::vector<std::uint16_t>{0x3fc0, 0xc000});  // 1.5, -2.0
    w.add("e", dtype::f64, {}, std::vector<double>{3.25});
    w.metadata("format", "pt");
    return w;
}

}  // namespace

TEST_CASE("safetensors: dtype names and sizes", "[safetensors]") {
    for (dtype t : loom::io::all_dtypes) REQUIRE(loom::io::dtype_from_name(loom::io::dtype_name(t)) == t);
    REQUIRE(loom::io::dtype_size(dtype::bf16) == 2);
    REQUIRE(loom::io::dtype_size(dtype::i64) == 8);
    REQUIRE_FALSE(loom::io::dtype_from_name("F8_E4M3").has_value());
    STATIC_REQUIRE(loom::io::safetensors_element<float>);
    STATIC_REQUIRE_FALSE(loom::io::safetensors_element<char>);
}

TEST_CASE("safetensors: every dtype round-trips", "[safetensors]") {
    const std::vector<float> f32{1.5f, -2.25f, 3e10f, -0.0f, 7.0f, 8.0f};
    const std::vector<double> f64{3.141592653589793, -1e-300};
    const std::vector<std::int32_t> i32{-2147483647 - 1, 0, 2147483647};
    const std::vector<std::int64_t> i64{-9223372036854775807LL - 1, 42, 9223372036854775807LL};
    const std::vector<std::uint8_t> u8{0, 1, 127, 128, 255};
    const std::vector<std::uint16_t> f16{0x3c00, 0xc000, 0x7bff, 0x0001};  // 1, -2, max, min subnormal
    const std::vector<std::uint16_t> bf16{0x3f80, 0x4049, 0xff80};         // 1, ~3.14, -inf

    safetensors_writer w;
    w.add("layer.0.weight", dtype::f32, {2, 3}, f32);
    w.add("layer.0.scale", dtype::f64, {2}, f64);
    w.add("ids", dtype::i32, {3}, i32);
    w.add("step", dtype::i64, {3}, i64);
    w.add("mask", dtype::u8, {5}, u8);
    w.add("half", dtype::f16, {2, 2}, f16);
    w.add("brain", dtype::bf16, {3}, bf16);
    w.add("empty", dtype::f32, {0, 4}, std::vector<float>{});
    w.add("scalar", dtype::f32, {}, std::vector<float>{0.5f});
    w.metadata("format", "pt");
    w.metadata("step", "1200");
    const auto path = temp_file("all_dtypes.safetensors");
    w.write(path);

    const safetensors_file f(path);
    REQUIRE(f.names() == std::vector<std::string>{"brain", "empty", "half", "ids", "layer.0.scale", "layer.0.weight",
                                                  "mask", "scalar", "step"});
    REQUIRE(f.read<float>("layer.0.weight") == f32);
    REQUIRE(f.read<double>("layer.0.scale") == f64);
    REQUIRE(f.read<std::int32_t>("ids") == i32);
    REQUIRE(f.read<std::int64_t>("step") == i64);
    REQUIRE(f.read<std::uint8_t>("mask") == u8);
    REQUIRE(f.read<std::uint16_t>("half") == f16);
    REQUIRE(f.read<std::uint16_t>("brain") == bf16);
    REQUIRE(f.read<float>("empty").empty());
    REQUIRE(f.read<float>("scalar") == std::vector<float>{0.5f});

    REQUIRE(f.info("layer.0.weight").dtype == dtype::f32);
    REQUIRE(f.info("layer.0.weight").shape == std::vector<std::int64_t>{2, 3});
    REQUIRE(f.info("half").dtype == dtype::f16);
    REQUIRE(f.info("brain").dtype == dtype::bf16);
    REQUIRE(f.info("scalar").shape.empty());
    REQUIRE(f.info("scalar").element_count() == 1);
    REQUIRE(f.info("empty").byte_size() == 0);
    REQUIRE(f.metadata() == std::map<std::string, std::string>{{"format", "pt"}, {"step", "1200"}});
}

TEST_CASE("safetensors: layout is the reference writer's, byte for byte", "[safetensors]") {
    const std::vector<std::byte> expected = from_hex(reference_file_hex);
    REQUIRE(reference_inputs().serialize() == expected);

    const auto path = temp_file("reference.safetensors");
    reference_inputs().write(path);
    REQUIRE(read_all(path) == expected);
}

TEST_CASE("safetensors: reads a file written by the reference implementation", "[safetensors]") {
    const auto path = temp_file("from_reference.safetensors");
    write_bytes(path, from_hex(reference_file_hex));
    const safetensors_file f(path);
    REQUIRE(f.names() == std::vector<std::string>{"a", "b", "c", "d", "e"});
    REQUIRE(f.read<float>("a") == std::vector<float>{0, 1, 2, 3, 4, 5});
    REQUIRE(f.info("a").shape == std::vector<std::int64_t>{2, 3});
    REQUIRE(f.read<std::int64_t>("b") == std::vector<std::int64_t>{1, -2, 3});
    REQUIRE(f.read<std::uint8_t>("c") == std::vector<std::uint8_t>{7, 8, 9, 250, 0});
    REQUIRE(f.read<std::uint16_t>("d") == std::vector<std::uint16_t>{0x3fc0, 0xc000});
    REQUIRE(f.info("d").dtype == dtype::bf16);
    REQUIRE(f.read<double>("e") == std::vector<double>{3.25});
    REQUIRE(f.info("e").shape.empty());
    REQUIRE(f.metadata().at("format") == "pt");
}

TEST_CASE("safetensors: header padded to 8 bytes and every tensor aligned to its element size", "[safetensors]") {
    safetensors_writer w;
    // Odd sizes that would misalign the wider tensors if they were laid out by name only.
    w.add("a_bytes", dtype::u8, {3}, std::vector<std::uint8_t>{1, 2, 3});
    w.add("b_half", dtype::f16, {1}, std::vector<std::uint16_t>{0x3c00});
    w.add("c_float", dtype::f32, {1}, std::vector<float>{1.0f});
    w.add("d_double", dtype::f64, {1}, std::vector<double>{1.0});
    w.add("x", dtype::u8, {1}, std::vector<std::uint8_t>{9});
    const auto path = temp_file("aligned.safetensors");
    w.write(path);

    const std::vector<std::byte> bytes = read_all(path);
    std::uint64_t header = 0;
    for (int i = 0; i < 8; ++i) header |= static_cast<std::uint64_t>(bytes[static_cast<std::size_t>(i)]) << (8 * i);
    REQUIRE(header % 8 == 0);

    const safetensors_file f(path);
    for (const std::string& name : f.names()) {
        const auto& info = f.info(name);
        CAPTURE(name);
        REQUIRE((8 + header + info.begin) % loom::io::dtype_size(info.dtype) == 0);
    }
    // Wider dtypes first, then by name.
    REQUIRE(f.info("d_double").begin == 0);
    REQUIRE(f.info("c_float").begin == 8);
    REQUIRE(f.info("b_half").begin == 12);
    REQUIRE(f.info("a_bytes").begin == 14);
    REQUIRE(f.info("x").begin == 17);
}

TEST_CASE("safetensors: reading with the wrong element type names tensor, dtype and type", "[safetensors]") {
    const auto path = temp_file("wrong_type.safetensors");
    reference_inputs().write(path);
    const safetensors_file f(path);
    REQUIRE_THROWS_AS(f.read<double>("a"), loom::data_error);
    REQUIRE_THROWS_WITH(f.read<double>("a"),
                        Contains("'a'") && Contains("F32") && Contains("double") && Contains(path.string()));
    REQUIRE_THROWS_WITH(f.read<float>("missing"), Contains("no tensor 'missing'") && Contains("a, b, c, d, e"));
}

TEST_CASE("safetensors: writer rejects inconsistent tensors", "[safetensors]") {
    safetensors_writer w;
    REQUIRE_THROWS_AS(w.add("w", dtype::f32, {2, 3}, std::vector<float>{1, 2, 3}), loom::usage_error);
    REQUIRE_THROWS_WITH(w.add("w", dtype::f32, {2, 3}, std::vector<float>{1, 2, 3}),
                        Contains("'w'") && Contains("[2, 3]") && Contains("24 bytes") && Contains("12"));
    REQUIRE_THROWS_WITH(w.add("w", dtype::f64, {1}, std::vector<float>{1}), Contains("F64") && Contains("float"));
    REQUIRE_THROWS_WITH(w.add("w", dtype::f32, {-1}, std::vector<float>{}), Contains("negative extent -1"));
    REQUIRE_THROWS_WITH(w.add("__metadata__", dtype::u8, {0}, std::vector<std::uint8_t>{}), Contains("reserved"));
    w.add("w", dtype::u8, {1}, std::vector<std::uint8_t>{1});
    REQUIRE_THROWS_WITH(w.add("w", dtype::u8, {1}, std::vector<std::uint8_t>{1}), Contains("already added"));
}

TEST_CASE("safetensors: corrupt files are rejected with the file, the tensor and the fix", "[safetensors]") {
    const auto path = temp_file("corrupt.safetensors");
    const std::string p = path.string();
    const std::vector<std::byte> good = from_hex(reference_file_hex);

    SECTION("missing file") {
        std::filesystem::remove(path);
        REQUIRE_THROWS_AS(safetensors_file(path), loom::data_error);
        REQUIRE_THROWS_WITH(safetensors_file(path), Contains(p) && Contains("does not exist"));
    }
    SECTION("shorter than the length field") {
        write_bytes(path, {good.begin(), good.begin() + 5});
        REQUIRE_THROWS_WITH(safetensors_file(path), Contains(p) && Contains("5 bytes long") && Contains("write it again"));
    }
    SECTION("truncated data") {
        write_bytes(path, {good.begin(), good.end() - 3});
        REQUIRE_THROWS_AS(safetensors_file(path), loom::data_error);
        REQUIRE_THROWS_WITH(safetensors_file(path),
                            Contains(p) && Contains("tensor 'c'") && Contains("[60, 65)") && Contains("62 bytes"));
    }
    SECTION("truncated inside the header") {
        write_bytes(path, {good.begin(), good.begin() + 100});
        REQUIRE_THROWS_WITH(safetensors_file(path), Contains(p) && Contains("header of 312 bytes") &&
                                                        Contains("only 92 bytes follow"));
    }
    SECTION("header length beyond the file") {
        std::vector<std::byte> bad = good;
        bad[5] = std::byte{0x7f};
        write_bytes(path, bad);
        REQUIRE_THROWS_WITH(safetensors_file(path), Contains(p) && Contains("declares a header of") &&
                                                        Contains("truncated or is not a safetensors file"));
    }
    SECTION("trailing bytes after the last tensor") {
        std::vector<std::byte> bad = good;
        bad.push_back(std::byte{0});
        write_bytes(path, bad);
        REQUIRE_THROWS_WITH(safetensors_file(path), Contains(p) && Contains("1 bytes after the last tensor 'c'"));
    }
    SECTION("invalid JSON") {
        write_raw(path, R"({"w": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]})", 4);  // missing brace
        REQUIRE_THROWS_WITH(safetensors_file(path), Contains(p) && Contains("not valid JSON") && Contains("write it again"));
    }
    SECTION("header that is not an object") {
        write_raw(path, "[1, 2]", 0);
        REQUIRE_THROWS_WITH(safetensors_file(path), Contains("is a array, not an object"));
    }
    SECTION("unknown dtype") {
        write_raw(path, R"({"w": {"dtype": "F8_E4M3", "shape": [4], "data_offsets": [0, 4]}})", 4);
        REQUIRE_THROWS_WITH(safetensors_file(path), Contains(p) && Contains("tensor 'w'") && Contains("\"F8_E4M3\"") &&
                                                        Contains("convert the tensor"));
    }
    SECTION("byte size that disagrees with shape and dtype") {
        write_raw(path, R"({"w": {"dtype": "F32", "shape": [2, 3], "data_offsets": [0, 20]}})", 20);
        REQUIRE_THROWS_WITH(safetensors_file(path), Contains(p) && Contains("tensor 'w'") && Contains("20 bytes") &&
                                                        Contains("6 x 4 = 24 bytes"));
    }
    SECTION("offsets beyond the data section") {
        write_raw(path, R"({"w": {"dtype": "U8", "shape": [8], "data_offsets": [0, 8]}})", 4);
        REQUIRE_THROWS_WITH(safetensors_file(path), Contains("tensor 'w'") && Contains("beyond the data section of 4 bytes"));
    }
    SECTION("overlapping offsets") {
        write_raw(path,
                  R"({"u": {"dtype": "U8", "shape": [4], "data_offsets": [0, 4]},)"
                  R"( "v": {"dtype": "U8", "shape": [4], "data_offsets": [2, 6]}})",
                  6);
        REQUIRE_THROWS_WITH(safetensors_file(path), Contains(p) && Contains("tensor 'v'") && Contains("overlap tensor 'u'"));
    }
    SECTION("a hole between tensors") {
        write_raw(path,
                  R"({"u": {"dtype": "U8", "shape": [4], "data_offsets": [0, 4]},)"
                  R"( "v": {"dtype": "U8", "shape": [2], "data_offsets": [6, 8]}})",
                  8);
        REQUIRE_THROWS_WITH(safetensors_file(path), Contains("tensor 'v'") && Contains("hole after tensor 'u' at 4"));
    }
    SECTION("offsets that end before they begin") {
        write_raw(path, R"({"w": {"dtype": "U8", "shape": [0], "data_offsets": [4, 0]}})", 4);
        REQUIRE_THROWS_WITH(safetensors_file(path), Contains("tensor 'w'") && Contains("end before they begin"));
    }
    SECTION("negative extent") {
        write_raw(path, R"({"w": {"dtype": "U8", "shape": [-1], "data_offsets": [0, 0]}})", 0);
        REQUIRE_THROWS_WITH(safetensors_file(path), Contains("tensor 'w'") && Contains("not a non-negative integer"));
    }
    SECTION("shape whose size overflows") {
        write_raw(path, R"({"w": {"dtype": "F64", "shape": [4294967296, 4294967296], "data_offsets": [0, 0]}})", 0);
        REQUIRE_THROWS_WITH(safetensors_file(path), Contains("tensor 'w'") && Contains("overflows 64 bits"));
    }
    SECTION("metadata that is not a string map") {
        write_raw(path, R"({"__metadata__": {"step": 3}})", 0);
        REQUIRE_THROWS_WITH(safetensors_file(path), Contains(p) && Contains("metadata \"step\"") && Contains("strings"));
    }
}

TEST_CASE("safetensors: an empty file of tensors is valid", "[safetensors]") {
    safetensors_writer w;
    REQUIRE(w.serialize() == from_hex("08000000000000007b7d202020202020"));  // {} padded to 8
    const auto path = temp_file("empty.safetensors");
    w.write(path);
    const safetensors_file f(path);
    REQUIRE(f.size() == 0);
    REQUIRE(f.metadata().empty());
}
