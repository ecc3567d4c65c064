#pragma once
// op-assign and recompute: where the pieces of a rule's ops run, and whether their outputs
// are kept for the backward pass.
//
//   assign<0, 1, 2, 3>    piece i on the i-th listed device (one device per piece)
//   colocate<2>           pieces 2i and 2i+1 on device i, run one after another
//   coshard<2>            Coshard (nnScaler): each device's piece of the last split cut in 2
//                         more, both on that device one after another; the degrees still count
//                         devices, so trans<Split<Dim::Head>, open<..., "tp">> with
//                         coshard<open<OneOf<1, 2, 4>, "cs">> runs tp * cs pieces on tp devices
//   recompute             recompute the outputs in the backward pass instead of keeping them
//   recompute_choice<"r"> recompute or not, an open choice named r (0: keep, 1: recompute)
//
// Each is a value: on<ops::Attention>(trans<Split<Dim::Head>, 8>{}, colocate<2>, recompute).
// The count of colocate and coshard may be open<Range, "name">; unnamed, it is the open
// parameter "colocate" or "coshard", one value for every unnamed one in the plan.
#include <array>
#include <cstdint>

#include <loom/core/fixed_string.hpp>
#include <loom/core/static_text.hpp>
#include <loom/plan/degree.hpp>
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

template <auto PiecesPerDevice, bool Coshard>
struct colocation_t {
    static constexpr detail::piece_kind piece = detail::piece_kind::colocate;
    static constexpr detail::degree_view pieces_per_device = detail::degree_view_of<PiecesPerDevice>();
    static constexpr bool coshard = Coshard;
    static_assert(pieces_per_device.kind == detail::degree_kind::fixed || pieces_per_device.kind == detail::degree_kind::open,
                  "plan::colocate<C> / plan::coshard<C>: give a number or open<...>");
    static constexpr detail::static_text spelling{
        detail::concat(Coshard ? "plan::coshard<" : "plan::colocate<", detail::degree_spelling<PiecesPerDevice>(), ">")};
};

template <auto PiecesPerDevice>
inline constexpr colocation_t<PiecesPerDevice, false> colocate{};

template <auto PiecesPerDevice>
inline constexpr colocation_t<PiecesPerDevice, true> coshard{};

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
