#pragma once
// op-assign and recompute: where the pieces of a rule's ops run, and whether their outputs
// are kept for the backward pass.
//
//   assign<0, 1, 2, 3>    piece i on the i-th listed device (one device per piece)
//   colocate<2>           pieces 2i and 2i+1 on device i, run one after another (Coshard)
//   recompute             recompute the outputs in the backward pass instead of keeping them
//
// Each is a value: on<ops::Attention>(trans<Split<Dim::Head>, 8>{}, colocate<2>, recompute).
#include <array>
#include <cstdint>

#include <loom/core/static_text.hpp>
#include <loom/plan/trans.hpp>

namespace loom::plan {

template <int... Devices>
struct assign_t {
    static constexpr detail::piece_kind piece = detail::piece_kind::assign;
    static constexpr std::array<std::int64_t, sizeof...(Devices)> devices{Devices...};
    static constexpr detail::static_text spelling{detail::concat("plan::assign<", detail::join(devices), ">")};
};

template <int... Devices>
inline constexpr assign_t<Devices...> assign{};

template <std::int64_t PiecesPerDevice>
struct colocate_t {
    static constexpr detail::piece_kind piece = detail::piece_kind::colocate;
    static constexpr std::int64_t pieces_per_device = PiecesPerDevice;
    static constexpr detail::static_text spelling{detail::concat("plan::colocate<", PiecesPerDevice, ">")};
};

template <std::int64_t PiecesPerDevice>
inline constexpr colocate_t<PiecesPerDevice> colocate{};

struct recompute_t {
    static constexpr detail::piece_kind piece = detail::piece_kind::recompute;
};

inline constexpr recompute_t recompute{};

}  // namespace loom::plan
