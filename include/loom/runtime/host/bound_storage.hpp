#pragma once
// Owned storage for every tensor a program binds (inputs, parameters, gradients, outputs),
// zero-initialised and bound to an executor in one call. What tests and the single-device
// trainer use; plans give each device its own.
#include <cstdint>
#include <span>
#include <string>
#include <unordered_map>
#include <vector>

#include <loom/core/error.hpp>
#include <loom/runtime/host/executor.hpp>
#include <loom/runtime/program.hpp>

namespace loom::host {

template <class T>
class bound_storage {
public:
    explicit bound_storage(const program& p) : program_(&p) {
        const graph& g = *p.source;
        for (tensor_id t : p.bound) {
            const tensor_desc& d = g.tensor(t);
            auto n = static_cast<std::size_t>(d.dims.numel());
            if (d.kind == value_kind::index)
                index_[t].assign(n, 0);
            else
                real_[t].assign(n, T(0));
        }
    }

    std::span<T> real(tensor_id t) {
        auto it = real_.find(t);
        if (it == real_.end()) throw usage_error("bound_storage: '" + name(t) + "' is not a bound real tensor");
        return it->second;
    }
    std::span<std::int32_t> index(tensor_id t) {
        auto it = index_.find(t);
        if (it == index_.end()) throw usage_error("bound_storage: '" + name(t) + "' is not a bound index tensor");
        return it->second;
    }
    std::span<T> real(std::string_view tensor_name) { return real(find(tensor_name)); }
    std::span<std::int32_t> index(std::string_view tensor_name) { return index(find(tensor_name)); }
    bool has(tensor_id t) const { return real_.count(t) || index_.count(t); }

    void bind_to(executor<T>& e) {
        for (auto& [t, v] : real_) e.bind(t, v.data());
        for (auto& [t, v] : index_) e.bind(t, v.data());
    }

private:
    std::string name(tensor_id t) const { return program_->source->tensor(t).name; }
    tensor_id find(std::string_view tensor_name) const {
        if (auto t = program_->source->find_tensor(tensor_name)) return *t;
        throw usage_error("bound_storage: no tensor named '" + std::string(tensor_name) + "'");
    }
    const program* program_;
    std::unordered_map<tensor_id, std::vector<T>> real_;
    std::unordered_map<tensor_id, std::vector<std::int32_t>> index_;
};

}  // namespace loom::host
