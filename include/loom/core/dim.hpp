#pragma once
// Named dimensions. A dimension is known to the type system as a tag type
// (`Dim::Batch`, or a user's `named_dim<"Expert">`) and to run-time code as a `dim_id`,
// which is just its name. The two meet in `dim_id_of<Tag>`:
//   dim_id_of<Dim::Hidden> == dim_id{"Hidden"}
#include <deque>
#include <mutex>
#include <ostream>
#include <string>
#include <string_view>

#include <loom/core/fixed_string.hpp>

namespace loom {

// The run-time name of a dimension. Cheap to copy and compare; the characters live in
// static storage (a tag's template argument) or in the intern table.
class dim_id {
public:
    constexpr dim_id() = default;

    // `name` must outlive every copy; use `dim_id::intern` for names built at run time.
    explicit constexpr dim_id(std::string_view name) : name_(name) {}

    // A dim whose name was read at run time (a plan file, a command line).
    static dim_id intern(std::string_view name) {
        static std::mutex mutex;
        static std::deque<std::string> table;  // deque: references stay valid as it grows
        std::lock_guard lock(mutex);
        for (const auto& known : table)
            if (known == name) return dim_id{known};
        return dim_id{table.emplace_back(name)};
    }

    constexpr std::string_view name() const { return name_; }
    constexpr bool empty() const { return name_.empty(); }

    friend constexpr bool operator==(dim_id a, dim_id b) { return a.name_ == b.name_; }
    friend constexpr auto operator<=>(dim_id a, dim_id b) { return a.name_ <=> b.name_; }
    friend std::ostream& operator<<(std::ostream& os, dim_id d) { return os << d.name_; }

private:
    std::string_view name_;
};

// The tag type of a dimension. Users define their own the same way:
//   using Expert = loom::named_dim<"Expert">;
template <fixed_string Name>
struct named_dim {
    static constexpr std::string_view name = Name.view();
    static constexpr dim_id id{Name.view()};
};

template <class T>
concept dim_tag = requires {
    { T::name } -> std::convertible_to<std::string_view>;
    { T::id } -> std::convertible_to<dim_id>;
};

template <dim_tag Tag>
inline constexpr dim_id dim_id_of = Tag::id;

// The dimensions loom's own ops and models speak of.
namespace Dim {
using Batch = named_dim<"Batch">;
using Seq = named_dim<"Seq">;
using Hidden = named_dim<"Hidden">;
using Head = named_dim<"Head">;
using HeadDim = named_dim<"HeadDim">;
using FFN = named_dim<"FFN">;
using Vocab = named_dim<"Vocab">;
using Channel = named_dim<"Channel">;
using Height = named_dim<"Height">;
using Width = named_dim<"Width">;
using Expert = named_dim<"Expert">;
using Scalar = named_dim<"Scalar">;  // never an axis; names the absence of one in messages
}  // namespace Dim

}  // namespace loom
