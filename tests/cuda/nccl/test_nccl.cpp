// The NCCL communicator on every rank of an MPI job, one GPU per rank: each collective,
// point-to-point messages around a ring, a sub-group, an overlapped all-reduce, and the
// errors of bad calls. CI runs it on one rank (the multi-GPU path is the same code); with
// no GPU every rank exits 77 and ctest reports the test skipped.
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <string>
#include <vector>

#include <loom/runtime/comm/mpi.hpp>
#include <loom/runtime/cuda/nccl_communicator.hpp>
#include <loom/runtime/cuda_gate.hpp>

namespace {

using loom::comm::dtype;
using loom::comm::group;

int failures = 0;

void expect(bool ok, const std::string& what, int rank) {
    if (!ok) {
        ++failures;
        std::fprintf(stderr, "rank %d: FAILED: %s\n", rank, what.c_str());
    }
}

std::vector<float> download(const loom::cuda::device_buffer& b, std::size_t n, loom::cuda::stream& s) {
    std::vector<float> host(n);
    loom::cuda::copy_to_host(host.data(), b.get(), n * sizeof(float), s.get());
    s.synchronize();
    return host;
}

loom::cuda::device_buffer upload(const std::vector<float>& host, loom::cuda::stream& s) {
    loom::cuda::device_buffer b(host.size() * sizeof(float));
    loom::cuda::copy_to_device(b.get(), host.data(), host.size() * sizeof(float), s.get());
    return b;
}

// Small integers in float: every sum is exact, whatever order NCCL adds in.
float value(int rank, std::size_t i) { return static_cast<float>(rank * 1000 + static_cast<int>(i % 997)); }

}  // namespace

int main(int argc, char** argv) {
    loom::comm::mpi_environment mpi(argc, argv);
    if (loom::cuda_device_count() == 0) {
        std::puts("no CUDA device on this machine: the NCCL test is skipped (exit 77)");
        return 77;
    }
    try {
        loom::cuda::stream compute;  // declared first: it must outlive the communicator that orders against it
        loom::cuda::nccl_communicator c;
        c.set_stream(compute.get());
        const int rank = c.rank(), n = c.size();
        const std::size_t count = 1 << 20 | 3;

        {  // all_reduce_sum
            std::vector<float> mine(count);
            for (std::size_t i = 0; i < count; ++i) mine[i] = value(rank, i);
            auto buffer = upload(mine, compute);
            c.all_reduce_sum(buffer.get(), count, dtype::f32, c.world());
            const auto got = download(buffer, count, compute);
            bool ok = true;
            for (std::size_t i = 0; i < count; ++i) {
                float want = 0;
                for (int r = 0; r < n; ++r) want += value(r, i);
                ok = ok && got[i] == want;
            }
            expect(ok, "all_reduce_sum", rank);
        }
        {  // all_gather and reduce_scatter_sum
            const std::size_t per = 4099;
            std::vector<float> mine(per);
            for (std::size_t i = 0; i < per; ++i) mine[i] = value(rank, i);
            auto in = upload(mine, compute);
            loom::cuda::device_buffer out(per * n * sizeof(float));
            c.all_gather(in.get(), out.get(), per, dtype::f32, c.world());
            const auto gathered = download(out, per * n, compute);
            bool ok = true;
            for (int r = 0; r < n; ++r)
                for (std::size_t i = 0; i < per; ++i) ok = ok && gathered[r * per + i] == value(r, i);
            expect(ok, "all_gather", rank);

            std::vector<float> full(per * n);
            for (std::size_t i = 0; i < full.size(); ++i) full[i] = value(rank, i);
            auto full_in = upload(full, compute);
            loom::cuda::device_buffer chunk(per * sizeof(float));
            c.reduce_scatter_sum(full_in.get(), chunk.get(), per, dtype::f32, c.world());
            const auto got = download(chunk, per, compute);
            ok = true;
            for (std::size_t i = 0; i < per; ++i) {
                float want = 0;
                for (int r = 0; r < n; ++r) want += value(r, rank * per + i);
                ok = ok && got[i] == want;
            }
            expect(ok, "reduce_scatter_sum", rank);
        }
        {  // all_to_all and broadcast
            const std::size_t per = 513;
            std::vector<float> mine(per * n);
            for (std::size_t i = 0; i < mine.size(); ++i) mine[i] = value(rank, i);
            auto in = upload(mine, compute);
            loom::cuda::device_buffer out(per * n * sizeof(float));
            c.all_to_all(in.get(), out.get(), per, dtype::f32, c.world());
            const auto got = download(out, per * n, compute);
            bool ok = true;
            for (int j = 0; j < n; ++j)
                for (std::size_t i = 0; i < per; ++i) ok = ok && got[j * per + i] == value(j, rank * per + i);
            expect(ok, "all_to_all", rank);

            auto data = upload(std::vector<float>(per, static_cast<float>(rank + 1)), compute);
            c.broadcast(data.get(), per, dtype::f32, n - 1, c.world());
            const auto b = download(data, per, compute);
            ok = true;
            for (float x : b) ok = ok && x == static_cast<float>(n);
            expect(ok, "broadcast", rank);
        }
        if (n > 1) {  // a ring of messages both ways, and a sub-group
            c.connect_pairs();
            const std::size_t per = 10007;
            auto to_next = upload(std::vector<float>(per, static_cast<float>(rank)), compute);
            auto to_prev = upload(std::vector<float>(per, static_cast<float>(-rank)), compute);
            loom::cuda::device_buffer from_prev(per * sizeof(float)), from_next(per * sizeof(float));
            c.send(to_next.get(), per, dtype::f32, (rank + 1) % n, 0);
            c.send(to_prev.get(), per, dtype::f32, (rank + n - 1) % n, 1);
            c.recv(from_prev.get(), per, dtype::f32, (rank + n - 1) % n, 0);
            c.recv(from_next.get(), per, dtype::f32, (rank + 1) % n, 1);
            const auto a = download(from_prev, per, compute), b = download(from_next, per, compute);
            expect(a[0] == static_cast<float>((rank + n - 1) % n) && a[per - 1] == a[0], "send/recv forward", rank);
            expect(b[0] == static_cast<float>(-((rank + 1) % n)), "send/recv backward", rank);

            group evens;
            for (int r = 0; r < n; r += 2) evens.ranks.push_back(r);
            if (evens.contains(rank)) {
                auto x = upload(std::vector<float>(64, 1.0f), compute);
                c.all_reduce_sum(x.get(), 64, dtype::f32, evens);
                expect(download(x, 64, compute)[63] == static_cast<float>(evens.size()), "sub-group all_reduce",
                       rank);
            }
        }
        {  // an all-reduce overlapped with compute-stream work, then waited for
            auto x = upload(std::vector<float>(count, 1.0f), compute);
            auto t = c.begin_all_reduce_sum(x.get(), count, dtype::f32, c.world());
            auto y = upload(std::vector<float>(count, 2.0f), compute);  // runs beside the transfer
            c.wait(t);
            expect(download(x, count, compute)[count - 1] == static_cast<float>(n), "overlapped all_reduce", rank);
            expect(download(y, count, compute)[0] == 2.0f, "work beside the transfer", rank);
        }
        {  // bf16, and an overlapped all-gather in place (each rank's shard inside the output)
            const std::size_t per = 2053;
            std::vector<loom::bfloat16> mine(per * n);
            for (std::size_t i = 0; i < mine.size(); ++i) mine[i] = loom::bfloat16(static_cast<float>(rank + 1));
            loom::cuda::device_buffer x(mine.size() * sizeof(loom::bfloat16));
            loom::cuda::copy_to_device(x.get(), mine.data(), x.bytes(), compute.get());
            c.all_reduce_sum(x.get(), mine.size(), dtype::bf16, c.world());
            std::vector<loom::bfloat16> summed(mine.size());
            loom::cuda::copy_to_host(summed.data(), x.get(), x.bytes(), compute.get());
            compute.synchronize();
            // 1 + 2 + ... + n is exact in bf16 for the world sizes this runs on (up to 22 ranks).
            expect(static_cast<float>(summed.back()) == static_cast<float>(n * (n + 1) / 2), "bf16 all_reduce_sum", rank);

            std::vector<float> shards(per * n, -1.0f);
            for (std::size_t i = 0; i < per; ++i) shards[rank * per + i] = value(rank, i);
            auto whole = upload(shards, compute);
            auto t = c.begin_all_gather(whole.as<float>() + rank * per, whole.get(), per, dtype::f32, c.world());
            c.wait(t);
            const auto got = download(whole, per * n, compute);
            bool ok = true;
            for (int r = 0; r < n; ++r)
                for (std::size_t i = 0; i < per; ++i) ok = ok && got[r * per + i] == value(r, i);
            expect(ok, "all_gather in place, overlapped", rank);
        }
        {  // bad calls name the problem
            bool threw = false;
            try {
                c.all_reduce_sum(nullptr, 4, dtype::f32, group{{n}});
            } catch (const loom::usage_error& e) {
                threw = std::string(e.what()).find("outside the world") != std::string::npos;
            }
            expect(threw, "a group with a rank outside the world is refused", rank);
        }
        c.barrier(c.world());
        c.synchronize();
    } catch (const std::exception& e) {
        std::fprintf(stderr, "rank ?: %s\n", e.what());
        return 1;
    }
    if (failures == 0) std::puts("nccl_communicator: all checks passed");
    return failures == 0 ? 0 : 1;
}
