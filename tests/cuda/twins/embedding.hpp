#pragma once
// Host twin of the CUDA embedding kernels: the host backend's own kernels of embedding and
// embedding_grad (runtime/host/kernels/embedding.hpp), run in float through a two-node graph
// with the table's row_offset and vocabulary. Its gradient sums each row's positions in
// increasing order, the CUDA kernel's order, so float results agree bit for bit; bf16
// inputs are widened exactly and the twin's float result rounded once, as the kernel does.
// The host executor may bring in OpenBLAS's cblas.h, whose global `typedef uint16_t
// bfloat16` makes a plain `bfloat16` ambiguous under `using namespace loom`: write
// loom::bfloat16 where this header is included.
#include <algorithm>
#include <cstdint>
#include <utility>
#include <vector>

#include <loom/graph/builder.hpp>
#include <loom/ops/embedding.hpp>
#include <loom/runtime/compile.hpp>
#include <loom/runtime/host/bound_storage.hpp>
#include <loom/runtime/host/executor.hpp>

namespace loom::cuda_test {

// A table of `rows` rows of `cols` holding vocabulary rows [row_offset, row_offset + rows)
// of `vocab`, looked up at `positions` ids.
struct embedding_shape {
    std::int64_t positions, rows, cols, vocab, row_offset;
};

struct embedding_results {
    std::vector<float> out;     // [positions, cols]
    std::vector<float> dtable;  // [rows, cols]
};

// ids must lie in [0, vocab): the host kernels throw for any other id.
inline embedding_results host_embedding(const embedding_shape& s, const std::vector<std::int32_t>& ids,
                                        const std::vector<float>& table, const std::vector<float>& dy) {
    graph_builder b;
    auto t_ids = b.input("ids", shape{axis{Dim::Batch::id, s.positions}}, value_kind::index);
    auto t_table = b.input("table", {{Dim::Vocab::id, s.rows}, {Dim::Hidden::id, s.cols}});
    auto t_dy = b.input("dy", {{Dim::Batch::id, s.positions}, {Dim::Hidden::id, s.cols}});
    auto out = b.apply1<ops::Embedding>({t_ids, t_table}, {{"vocab", s.vocab}, {"row_offset", s.row_offset}});
    auto dtable = ops::embedding_grad(t_dy, t_ids, s.rows, Dim::Vocab::id, s.vocab, s.row_offset);
    const graph g = std::move(b).take();
    const program p =
        compile_program(g, {.prec = precision::f32, .include_backward = false, .outputs = {out.id, dtable.id}});
    host::executor<float> ex(p);
    host::bound_storage<float> st(p);
    st.bind_to(ex);
    std::copy(ids.begin(), ids.end(), st.index("ids").begin());
    std::copy(table.begin(), table.end(), st.real("table").begin());
    std::copy(dy.begin(), dy.end(), st.real("dy").begin());
    ex.run();
    const auto o = st.real(out.id), d = st.real(dtable.id);
    return {{o.begin(), o.end()}, {d.begin(), d.end()}};
}

}  // namespace loom::cuda_test
