#pragma once
// AdamW with PyTorch's torch.optim.AdamW semantics (decoupled weight decay), on the
// gradient g times a scale (global-norm clipping's coefficient, grad_clip.hpp; 1: none):
//   g <- g * scale
//   p <- p * (1 - lr * wd)
//   m <- b1 m + (1 - b1) g;  v <- b2 v + (1 - b2) g^2
//   p <- p - lr * (m / (1 - b1^t)) / (sqrt(v / (1 - b2^t)) + eps)
#include <cmath>
#include <cstdint>
#include <type_traits>
#include <vector>

#include <immintrin.h>

#include <loom/core/error.hpp>
#include <loom/runtime/host/cpu_isa.hpp>
#include <loom/runtime/host/thread_pool.hpp>
#include <loom/train/parameter_slot.hpp>

namespace loom::train {

struct adamw_options {
    double lr = 1e-3;
    double beta1 = 0.9;
    double beta2 = 0.999;
    double eps = 1e-8;
    double weight_decay = 0.01;
};

namespace detail {

// One AdamW update of elements [lo, hi), in the order of operations the scalar loop uses.
// The scalar loop does not vectorize: std::sqrt may set errno, which g++ keeps as a branch.
template <class T>
struct adamw_update {
    T decay, b1, b2, step_size, bias2_sqrt, eps, scale;

    void scalar(T* __restrict p, T* __restrict m, T* __restrict v, const T* __restrict grad, std::int64_t lo,
                std::int64_t hi) const {
        for (std::int64_t i = lo; i < hi; ++i) {
            const T g = grad[i] * scale;
            p[i] *= decay;
            m[i] = b1 * m[i] + (1 - b1) * g;
            v[i] = b2 * v[i] + (1 - b2) * g * g;
            p[i] -= step_size * m[i] / (std::sqrt(v[i]) / bias2_sqrt + eps);
        }
    }

    // The same operations on 8 (AVX2) or 16 (AVX-512) floats at a time, each one correctly
    // rounded as in scalar(), with no fused multiply-add: the result is bit for bit scalar()'s.
    [[gnu::target("avx2")]] void avx2(float* __restrict p, float* __restrict m, float* __restrict v,
                                      const float* __restrict g, std::int64_t lo, std::int64_t hi) const {
        const __m256 vdecay = _mm256_set1_ps(decay), vb1 = _mm256_set1_ps(b1), vb2 = _mm256_set1_ps(b2),
                     one_minus_b1 = _mm256_set1_ps(1 - b1), one_minus_b2 = _mm256_set1_ps(1 - b2),
                     vstep = _mm256_set1_ps(step_size), vbias2 = _mm256_set1_ps(bias2_sqrt), veps = _mm256_set1_ps(eps),
                     vscale = _mm256_set1_ps(scale);
        std::int64_t i = lo;
        for (; i + 8 <= hi; i += 8) {
            const __m256 gi = _mm256_mul_ps(_mm256_loadu_ps(g + i), vscale);
            const __m256 pi = _mm256_mul_ps(_mm256_loadu_ps(p + i), vdecay);
            const __m256 mi = _mm256_add_ps(_mm256_mul_ps(vb1, _mm256_loadu_ps(m + i)), _mm256_mul_ps(one_minus_b1, gi));
            const __m256 vi = _mm256_add_ps(_mm256_mul_ps(vb2, _mm256_loadu_ps(v + i)),
                                            _mm256_mul_ps(_mm256_mul_ps(one_minus_b2, gi), gi));
            const __m256 denominator = _mm256_add_ps(_mm256_div_ps(_mm256_sqrt_ps(vi), vbias2), veps);
            _mm256_storeu_ps(m + i, mi);
            _mm256_storeu_ps(v + i, vi);
            _mm256_storeu_ps(p + i, _mm256_sub_ps(pi, _mm256_div_ps(_mm256_mul_ps(vstep, mi), denominator)));
        }
        scalar(p, m, v, g, i, hi);
    }

    [[gnu::target("avx512f")]] void avx512(float* __restrict p, float* __restrict m, float* __restrict v,
                                           const float* __restrict g, std::int64_t lo, std::int64_t hi) const {
        const __m512 vdecay = _mm512_set1_ps(decay), vb1 = _mm512_set1_ps(b1), vb2 = _mm512_set1_ps(b2),
                     one_minus_b1 = _mm512_set1_ps(1 - b1), one_minus_b2 = _mm512_set1_ps(1 - b2),
                     vstep = _mm512_set1_ps(step_size), vbias2 = _mm512_set1_ps(bias2_sqrt), veps = _mm512_set1_ps(eps),
                     vscale = _mm512_set1_ps(scale);
        std::int64_t i = lo;
        for (; i + 16 <= hi; i += 16) {
            const __m512 gi = _mm512_mul_ps(_mm512_loadu_ps(g + i), vscale);
            const __m512 pi = _mm512_mul_ps(_mm512_loadu_ps(p + i), vdecay);
            const __m512 mi = _mm512_add_ps(_mm512_mul_ps(vb1, _mm512_loadu_ps(m + i)), _mm512_mul_ps(one_minus_b1, gi));
            const __m512 vi = _mm512_add_ps(_mm512_mul_ps(vb2, _mm512_loadu_ps(v + i)),
                                            _mm512_mul_ps(_mm512_mul_ps(one_minus_b2, gi), gi));
            // The masked form with every lane set: _mm512_sqrt_ps passes GCC 12 an undefined
            // source that it then warns about (-Wmaybe-uninitialized); the result is the same.
            const __m512 root = _mm512_mask_sqrt_ps(vi, static_cast<__mmask16>(0xFFFF), vi);
            const __m512 denominator = _mm512_add_ps(_mm512_div_ps(root, vbias2), veps);
            _mm512_storeu_ps(m + i, mi);
            _mm512_storeu_ps(v + i, vi);
            _mm512_storeu_ps(p + i, _mm512_sub_ps(pi, _mm512_div_ps(_mm512_mul_ps(vstep, mi), denominator)));
        }
        scalar(p, m, v, g, i, hi);
    }

    // The update built for `isa` (one this CPU runs); doubles take the scalar loop.
    void on(host::cpu_isa isa, T* p, T* m, T* v, const T* g, std::int64_t lo, std::int64_t hi) const {
        if constexpr (std::is_same_v<T, float>) {
            switch (isa) {
                case host::cpu_isa::avx512f: return avx512(p, m, v, g, lo, hi);
                case host::cpu_isa::avx2_fma: return avx2(p, m, v, g, lo, hi);
                case host::cpu_isa::portable: break;
            }
        }
        scalar(p, m, v, g, lo, hi);
    }
};

}  // namespace detail

template <class T>
class adamw {
public:
    explicit adamw(adamw_options options) : options_(options) {
        if (!(options.beta1 >= 0 && options.beta1 < 1 && options.beta2 >= 0 && options.beta2 < 1))
            throw usage_error("adamw: betas must lie in [0, 1); got beta1=" + std::to_string(options.beta1) +
                              ", beta2=" + std::to_string(options.beta2));
        if (options.lr < 0 || options.eps <= 0 || options.weight_decay < 0)
            throw usage_error("adamw: lr and weight_decay must be >= 0 and eps > 0");
    }

    void add(parameter_slot<T> slot) {
        m_.emplace_back(slot.value.size(), T(0));
        v_.emplace_back(slot.value.size(), T(0));
        slots_.push_back(std::move(slot));
    }

    // One update of every parameter at rate `lr`, each gradient multiplied by `grad_scale`
    // as it is read (the clipping coefficient: grad_clip.hpp's clip_scale).
    void step(double lr, double grad_scale = 1.0) {
        ++steps_;
        const double t = static_cast<double>(steps_);
        const T b1 = static_cast<T>(options_.beta1), b2 = static_cast<T>(options_.beta2);
        const T step_size = static_cast<T>(lr / (1 - std::pow(options_.beta1, t)));
        const T bias2_sqrt = static_cast<T>(std::sqrt(1 - std::pow(options_.beta2, t)));
        const T eps = static_cast<T>(options_.eps);
        const T scale = static_cast<T>(grad_scale);
        const host::cpu_isa isa = host::best_cpu_isa();
        for (std::size_t s = 0; s < slots_.size(); ++s) {
            auto& slot = slots_[s];
            T* __restrict m = m_[s].data();
            T* __restrict v = v_[s].data();
            T* __restrict p = slot.value.data();
            const T* __restrict g = slot.grad.data();
            const T decay = slot.weight_decay ? static_cast<T>(1 - lr * options_.weight_decay) : T(1);
            const detail::adamw_update<T> update{decay, b1, b2, step_size, bias2_sqrt, eps, scale};
            host::parallel_for(0, static_cast<std::int64_t>(slot.value.size()), 1 << 14,
                               [&](std::int64_t lo, std::int64_t hi) { update.on(isa, p, m, v, g, lo, hi); });
        }
    }
    void step() { step(options_.lr); }

    std::int64_t steps() const { return steps_; }
    void set_steps(std::int64_t steps) { steps_ = steps; }
    const adamw_options& options() const { return options_; }
    std::vector<T>& first_moment(std::size_t s) { return m_.at(s); }
    std::vector<T>& second_moment(std::size_t s) { return v_.at(s); }
    const std::vector<parameter_slot<T>>& slots() const { return slots_; }

private:
    adamw_options options_;
    std::vector<parameter_slot<T>> slots_;
    std::vector<std::vector<T>> m_, v_;
    std::int64_t steps_ = 0;
};

}  // namespace loom::train
