#pragma once
// A fork-join thread pool for the host backend: persistent workers, one parallel_for.
//
//   loom::host::parallel_for(0, rows, 64, [&](std::int64_t lo, std::int64_t hi) { ... });
//
// Law: f is called on disjoint ranges [lo, hi) whose union is [begin, end); every range is at
// least `grain` long except when the whole range is shorter than `grain`. The call returns
// after every range is done, and the calling thread works on ranges too.
//
// Threading contract:
//  - Nested calls (from inside f, on a worker or on the calling thread, into this pool or
//    any other loom pool) run f(begin, end) serially on the thread that makes them, so a
//    parallel kernel may call another parallel kernel without deadlock or oversubscription.
//  - A range shorter than two grains runs inline as f(begin, end), without touching the
//    pool (which stays free for whatever f calls).
//  - Calls from several user threads at once are serialized: one job owns the pool at a
//    time and the other callers block until it finishes. A job never waits for another
//    caller's job, so concurrent callers cannot deadlock (unless f itself blocks on one).
//  - The first exception thrown by f is rethrown on the caller once every range has ended;
//    ranges not yet started when it was thrown are skipped.
//  - The destructor joins the workers. thread_pool::global() lives until static
//    destruction, so do not call parallel_for from other static destructors.
#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <cstdlib>
#include <exception>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <type_traits>
#include <utility>
#include <vector>

#include <loom/core/error.hpp>

namespace loom::host {

namespace detail {

// True while this thread runs a range of some pool's job (or is a pool worker), so nested
// parallel_for calls run inline instead of waiting on a pool that is busy with their parent.
inline bool& inside_parallel_region() noexcept {
    thread_local bool inside = false;
    return inside;
}

class region_guard {
   public:
    region_guard() noexcept : previous_(inside_parallel_region()) { inside_parallel_region() = true; }
    ~region_guard() { inside_parallel_region() = previous_; }
    region_guard(const region_guard&) = delete;
    region_guard& operator=(const region_guard&) = delete;

   private:
    bool previous_;
};

// Parses LOOM_NUM_THREADS; 0 when unset or empty.
inline unsigned thread_count_from_environment() {
    const char* text = std::getenv("LOOM_NUM_THREADS");
    if (text == nullptr || *text == '\0') return 0;
    char* end = nullptr;
    const long value = std::strtol(text, &end, 10);
    if (*end != '\0' || value < 1 || value > 4096) {
        throw usage_error(std::string("thread_pool: LOOM_NUM_THREADS='") + text +
                          "' is not a thread count; set it to an integer in [1, 4096] or unset it");
    }
    return static_cast<unsigned>(value);
}

}  // namespace detail

// LOOM_NUM_THREADS when set, otherwise the number of hardware threads (at least 1).
inline unsigned default_thread_count() {
    if (const unsigned from_environment = detail::thread_count_from_environment()) {
        return from_environment;
    }
    const unsigned hardware = std::thread::hardware_concurrency();
    return hardware == 0 ? 1u : hardware;
}

class thread_pool {
   public:
    // `threads` counts the calling thread, so thread_pool(1) starts no worker at all.
    explicit thread_pool(unsigned threads = default_thread_count()) : size_(threads) {
        if (threads == 0) {
            throw usage_error("thread_pool: threads = 0; pass at least 1 (the calling thread)");
        }
        workers_.reserve(threads - 1);
        try {
            for (unsigned i = 1; i < threads; ++i) {
                workers_.emplace_back([this] { worker_loop(); });
            }
        } catch (...) {
            shut_down();
            throw;
        }
    }

    ~thread_pool() { shut_down(); }

    thread_pool(const thread_pool&) = delete;
    thread_pool& operator=(const thread_pool&) = delete;

    unsigned size() const noexcept { return size_; }

    template <class F>
    void parallel_for(std::int64_t begin, std::int64_t end, std::int64_t grain, F&& f) {
        if (end <= begin) return;
        if (grain < 1) grain = 1;
        const std::int64_t length = end - begin;
        // Below two grains there is only one legal range (length / 2 < grain is
        // length < 2 * grain without overflow); nested calls must not wait on a pool whose
        // workers may be busy with their parent job. An inline call does not mark the thread
        // as inside a region: f may still use the (idle) pool.
        if (length / 2 < grain || size_ == 1 || detail::inside_parallel_region()) {
            f(begin, end);
            return;
        }
        // A few ranges per thread, handed out first come first served, so a thread that
        // starts late or runs on a busy core takes fewer of them.
        const std::int64_t most_ranges = length / grain;
        const std::int64_t ranges = std::min<std::int64_t>(most_ranges, ranges_per_thread * std::int64_t{size_});

        using functor = std::remove_reference_t<F>;
        job_description description;
        description.invoke = [](void* context, std::int64_t lo, std::int64_t hi) {
            (*static_cast<functor*>(context))(lo, hi);
        };
        description.context = const_cast<void*>(static_cast<const void*>(std::addressof(f)));
        description.begin = begin;
        description.length = length;
        description.ranges = ranges;
        run(description);
    }

    // The process-wide pool, created on first use with default_thread_count() threads.
    static thread_pool& global() {
        static thread_pool pool;
        return pool;
    }

   private:
    struct job_description {
        void (*invoke)(void*, std::int64_t, std::int64_t) = nullptr;
        void* context = nullptr;
        std::int64_t begin = 0;
        std::int64_t length = 0;
        std::int64_t ranges = 0;
    };

    // Spins this many polls before blocking: a worker woken for back-to-back jobs (the
    // layers of one step) skips the futex round trip, and gives its core back soon after.
    static constexpr int spin_polls = 1 << 14;
    static constexpr std::int64_t ranges_per_thread = 4;

    void run(const job_description& description) {
        std::lock_guard<std::mutex> one_job_at_a_time(submit_mutex_);
        {
            std::unique_lock<std::mutex> lock(mutex_);
            // Workers that took part in the previous job may still be leaving it.
            idle_cv_.wait(lock, [this] { return busy_workers_ == 0; });
            job_ = description;
            next_range_.store(0, std::memory_order_relaxed);
            unfinished_ranges_.store(description.ranges, std::memory_order_relaxed);
            failed_.store(false, std::memory_order_relaxed);
            failure_ = nullptr;
            generation_.store(generation_.load(std::memory_order_relaxed) + 1, std::memory_order_release);
        }
        work_cv_.notify_all();

        {
            detail::region_guard guard;
            work_on(description);
        }

        for (int poll = 0; poll < spin_polls; ++poll) {
            if (unfinished_ranges_.load(std::memory_order_acquire) == 0) break;
        }
        std::unique_lock<std::mutex> lock(mutex_);
        done_cv_.wait(lock, [this] { return unfinished_ranges_.load(std::memory_order_acquire) == 0; });
        if (failure_) {
            std::exception_ptr failure = std::move(failure_);
            failure_ = nullptr;
            std::rethrow_exception(failure);
        }
    }

    // Takes ranges until none is left. Range r is [begin + r*length/ranges, begin + (r+1)*length/ranges),
    // so every range has floor or ceil of length/ranges >= grain elements.
    void work_on(const job_description& description) {
        for (;;) {
            const std::int64_t r = next_range_.fetch_add(1, std::memory_order_relaxed);
            if (r >= description.ranges) return;
            if (!failed_.load(std::memory_order_relaxed)) {
                const std::int64_t lo = description.begin + r * description.length / description.ranges;
                const std::int64_t hi = description.begin + (r + 1) * description.length / description.ranges;
                try {
                    description.invoke(description.context, lo, hi);
                } catch (...) {
                    std::lock_guard<std::mutex> lock(mutex_);
                    if (!failure_) failure_ = std::current_exception();
                    failed_.store(true, std::memory_order_relaxed);
                }
            }
            if (unfinished_ranges_.fetch_sub(1, std::memory_order_acq_rel) == 1) {
                // Taking the mutex orders this notify after the caller's predicate check.
                std::lock_guard<std::mutex> lock(mutex_);
                done_cv_.notify_all();
            }
        }
    }

    void worker_loop() {
        detail::inside_parallel_region() = true;
        std::uint64_t seen = 0;
        for (;;) {
            for (int poll = 0; poll < spin_polls; ++poll) {
                if (generation_.load(std::memory_order_acquire) != seen) break;
            }
            job_description description;
            {
                std::unique_lock<std::mutex> lock(mutex_);
                work_cv_.wait(lock, [&] { return stopping_ || generation_.load(std::memory_order_relaxed) != seen; });
                if (stopping_) return;
                seen = generation_.load(std::memory_order_relaxed);
                description = job_;
                ++busy_workers_;
            }
            work_on(description);
            {
                std::lock_guard<std::mutex> lock(mutex_);
                --busy_workers_;
                if (busy_workers_ == 0) idle_cv_.notify_all();
            }
        }
    }

    void shut_down() noexcept {
        {
            std::lock_guard<std::mutex> lock(mutex_);
            stopping_ = true;
        }
        work_cv_.notify_all();
        for (std::thread& worker : workers_) {
            if (worker.joinable()) worker.join();
        }
        workers_.clear();
    }

    unsigned size_;
    std::vector<std::thread> workers_;

    std::mutex submit_mutex_;
    std::mutex mutex_;
    std::condition_variable work_cv_;
    std::condition_variable done_cv_;
    std::condition_variable idle_cv_;

    // Guarded by mutex_ (generation_ is also polled without it while spinning).
    job_description job_;
    std::atomic<std::uint64_t> generation_{0};
    unsigned busy_workers_ = 0;
    bool stopping_ = false;
    std::exception_ptr failure_;

    std::atomic<std::int64_t> next_range_{0};
    std::atomic<std::int64_t> unfinished_ranges_{0};
    std::atomic<bool> failed_{false};
};

// parallel_for on thread_pool::global().
template <class F>
void parallel_for(std::int64_t begin, std::int64_t end, std::int64_t grain, F&& f) {
    thread_pool::global().parallel_for(begin, end, grain, std::forward<F>(f));
}

}  // namespace loom::host
