#pragma once
// Float64 central-difference gradient checks. A test builds a small graph whose
// differentiable operands are parameters; the check forms the scalar
//   L = sum_i sum(out_i * probe_i)
// with fixed random probes (so every output element matters with its own weight), runs
// loom's backward pass, and compares every parameter gradient with (L(x+h) - L(x-h)) / 2h.
#include <catch2/catch.hpp>

#include <cmath>
#include <functional>
#include <string>
#include <vector>

#include <loom/autograd/autograd.hpp>
#include <loom/graph/builder.hpp>
#include <loom/ops/mul.hpp>
#include <loom/ops/reduce.hpp>
#include <loom/runtime/compile.hpp>
#include <loom/runtime/host/bound_storage.hpp>
#include <loom/runtime/host/executor.hpp>
#include <loom/train/init.hpp>

namespace loom::testing {

struct gradcheck_options {
    double step = 1e-6;
    double rtol = 1e-6;
    double atol = 1e-9;
    std::uint64_t seed = 7;
    std::int64_t max_elements_per_parameter = 400;  // checked elements, spread evenly
};

using index_filler = std::function<void(const std::string& name, std::span<std::int32_t>)>;

struct gradcheck_report {
    std::int64_t checked = 0;
    double worst_error = 0;  // max |analytic - numeric| / (atol + rtol |numeric|)
};

template <class Build>
gradcheck_report check_gradients(Build&& build, index_filler fill_index = {}, gradcheck_options opt = {}) {
    graph_builder b;
    std::vector<tensor> outs = build(b);
    REQUIRE(!outs.empty());
    std::optional<tensor> loss;
    for (std::size_t i = 0; i < outs.size(); ++i) {
        tensor probe = b.input("probe." + std::to_string(i), outs[i].dims());
        tensor term = ops::sum(ops::mul(outs[i], probe));
        loss = loss ? ops::add(*loss, term) : term;
    }
    b.set_loss(*loss);
    build_backward(b);
    graph g = std::move(b).take();

    program p = compile_program(g, {.prec = precision::f64});
    host::executor<double> ex(p);
    host::bound_storage<double> st(p);
    st.bind_to(ex);
    for (tensor_id t : g.parameters) train::initialize(st.real(t), g.tensor(t).init, opt.seed, g.tensor(t).name);
    for (tensor_id t : g.inputs) {
        const tensor_desc& d = g.tensor(t);
        if (!st.has(t)) continue;
        if (d.kind == value_kind::index) {
            REQUIRE(fill_index);
            fill_index(d.name, st.index(t));
        } else {
            train::initialize(st.real(t), parameter_init::normal(1.0), opt.seed + 1, d.name);
        }
    }
    auto loss_value = [&] {
        ex.run();
        return st.real(g.loss)[0];
    };
    loss_value();
    // Read every analytic gradient before any perturbation reruns the program.
    std::vector<std::vector<double>> analytic_all;
    for (auto [param, grad] : g.gradients) analytic_all.emplace_back(st.real(grad).begin(), st.real(grad).end());
    gradcheck_report report;
    for (std::size_t gi = 0; gi < g.gradients.size(); ++gi) {
        const tensor_id param = g.gradients[gi].first;
        const std::vector<double>& analytic = analytic_all[gi];
        auto x = st.real(param);
        const auto n = static_cast<std::int64_t>(x.size());
        const std::int64_t stride = std::max<std::int64_t>(1, n / opt.max_elements_per_parameter);
        for (std::int64_t j = 0; j < n; j += stride) {
            const double saved = x[static_cast<std::size_t>(j)];
            x[static_cast<std::size_t>(j)] = saved + opt.step;
            const double up = loss_value();
            x[static_cast<std::size_t>(j)] = saved - opt.step;
            const double down = loss_value();
            x[static_cast<std::size_t>(j)] = saved;
            const double numeric = (up - down) / (2 * opt.step);
            const double got = analytic[static_cast<std::size_t>(j)];
            const double bound = opt.atol + opt.rtol * std::abs(numeric);
            report.worst_error = std::max(report.worst_error, std::abs(got - numeric) / bound);
            ++report.checked;
            INFO("gradient of '" << g.tensor(param).name << "' element " << j << ": analytic " << got
                                 << " numeric " << numeric);
            REQUIRE(std::abs(got - numeric) <= bound);
        }
    }
    return report;
}

}  // namespace loom::testing
