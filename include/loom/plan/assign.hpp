#pragma once
// op-assign and recompute: where the pieces of a rule's ops run, and whether their outputs
// are kept for the backward pass.
//
//   assign<0, 1, 2, 3>    piece i on the i-th listed device (one device per piece)
//   colocate<2>           pieces 2i and 2i+1 on device i, run one after another (Coshard)
//   recompute             recompute the outputs in the backward pass instead of keeping them
//   recompute_choice<"r"> recompute or not, an open choice named r (0: keep, 1: recompute)
//
// Each is a value: on<ops::Attention>(trans<Split<Dim::Head>, 8>{}, colocate<2>, recompute).
#include <array>
#include <cstdint>

#include <loom/core/fixed_string.hpp>
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

// Whether to recompute, left open: the choice `Name` is 1 (recompute) or 0 (keep), filled
// by choose() or the searcher. One per class of layers lets the search pick a recompute
// policy: on_scope<"*.attn.core">(recompute_choice<"attn">), on_layers<...>(...).
template <fixed_string Name>
struct recompute_choice_t {
    static constexpr detail::piece_kind piece = detail::piece_kind::recompute;
    static constexpr std::string_view open = Name.view();
};

template <fixed_string Name>
inline constexpr recompute_choice_t<Name> recompute_choice{};

}  // namespace loom::plan
