#pragma once
// From op kind to host kernel. Built-in ops are registered from ops::all_ops the first time
// the table is used; a user's own op registers with `register_host_kernel<MyOp>()`.
#include <mutex>
#include <string>
#include <unordered_map>

#include <boost/mp11/algorithm.hpp>

#include <loom/core/error.hpp>
#include <loom/ops/all.hpp>
#include <loom/runtime/host/kernel_call.hpp>
#include <loom/runtime/host/kernels/all.hpp>

namespace loom::host {

template <class T>
using kernel_fn = void (*)(const kernel_call<T>&);

template <class Op>
concept has_host_kernel = requires(const kernel_call<float>& f, const kernel_call<double>& d) {
    host_kernel<Op>::template run<float>(f);
    host_kernel<Op>::template run<double>(d);
};

// One table per precision, so that a program computing only in float never instantiates
// (or compiles) the double kernels.
template <class T>
class kernel_table {
public:
    static kernel_table& instance() {
        static kernel_table table;
        return table;
    }

    template <op_kind Op>
    void add() {
        static_assert(has_host_kernel<Op>,
                      "register_host_kernel: the op has no host kernel; specialise loom::host::host_kernel<Op> with "
                      "template <class T> static void run(const kernel_call<T>&)");
        std::lock_guard lock(mutex_);
        entries_[&op_def_of<Op>()] = &host_kernel<Op>::template run<T>;
    }

    kernel_fn<T> find(const op_def& op) {
        std::lock_guard lock(mutex_);
        auto it = entries_.find(&op);
        if (it == entries_.end())
            throw usage_error("host backend: no kernel for op '" + std::string(op.name) +
                              "'; include its kernel header and call loom::host::register_host_kernel<Op>()");
        return it->second;
    }

private:
    kernel_table();
    std::mutex mutex_;
    std::unordered_map<const op_def*, kernel_fn<T>> entries_;
};

// Out of the class body, so that an explicit instantiation declaration (below) keeps it,
// and with it every built-in kernel, out of the translation unit.
template <class T>
kernel_table<T>::kernel_table() {
    boost::mp11::mp_for_each<boost::mp11::mp_transform<boost::mp11::mp_identity, ops::all_ops>>([this](auto op) {
        using Op = typename decltype(op)::type;
        // Communication ops run on a communicator, not on a kernel.
        if constexpr (!requires { Op::communication; }) add<Op>();
    });
}

// Compiled kernels: a program linking loom::compiled (src/kernels_float.cpp and
// src/kernels_double.cpp; the library defines LOOM_COMPILED for its users) compiles the
// built-in kernels of both precisions once, there, instead of in every translation unit that
// runs a program. Without
// it loom stays header-only and each translation unit instantiates what it uses.
#if defined(LOOM_COMPILED)
extern template class kernel_table<float>;
extern template class kernel_table<double>;
#endif

template <op_kind Op>
void register_host_kernel() {
    kernel_table<float>::instance().template add<Op>();
    kernel_table<double>::instance().template add<Op>();
}

template <class T>
kernel_fn<T> kernel_for(const op_def& op) {
    return kernel_table<T>::instance().find(op);
}

}  // namespace loom::host
