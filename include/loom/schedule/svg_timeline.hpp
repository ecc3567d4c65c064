#pragma once
// A simulated schedule as an SVG timeline, like Figure 2 of the nnScaler paper: one row per
// device, one rectangle per block (forward rounds in shades of blue, backwards in orange),
// labelled with its micro-batch, and a time axis underneath.
//
//   std::ofstream("1f1b.svg") << svg_timeline(simulate(one_f_one_b(4, 8)));
//
// Geometry (svg_options, pixels): a block that runs [start, end) on device d is
//   <rect class="block" data-block="F(s1,m3)" data-device="d"
//         x="left + start * pixels_per_unit" y="top + d * (row_height + row_gap)"
//         width="(end - start) * pixels_per_unit" height="row_height" .../>
// Numbers are written with at most three decimals ("40", "12.5").
#include <cstddef>
#include <cstdio>
#include <string>
#include <string_view>

#include <loom/core/linkage.hpp>
#include <loom/schedule/simulate.hpp>

namespace loom::schedule {

struct svg_options {
    double pixels_per_unit = 40.0;
    double row_height = 28.0;
    double row_gap = 6.0;
    double left = 80.0;    // room for the device labels
    double top = 30.0;     // room for the title
    double right = 20.0;
    double bottom = 40.0;  // room for the time axis
};

namespace detail {

// 40 -> "40", 12.5 -> "12.5", 1/3 -> "0.333"
LOOM_INLINE std::string svg_number(double x);

LOOM_INLINE std::string xml_escape(std::string_view text);

inline std::string block_colour(const block& b) {
    static constexpr const char* forward_rounds[] = {"#4e79a7", "#76a5d6", "#a8c8ea", "#2f4b6e"};
    if (is_backward(b)) return "#f28e2b";
    return forward_rounds[static_cast<std::size_t>(b.round) % 4];
}

// A tick step of 1, 2, 5, 10, 20, 50, ... units that gives at most 20 ticks.
inline double tick_step(double makespan) {
    double step = 1.0;
    for (int i = 0; makespan / step > 20.0; ++i) step *= (i % 3 == 1) ? 2.5 : 2.0;
    return step;
}

}  // namespace detail

LOOM_INLINE std::string svg_timeline(const simulation& r, const svg_options& o = {});

}  // namespace loom::schedule

// Definitions: compiled here (header-only) or once in loom::compiled (core/linkage.hpp).
#if LOOM_HEADER_DEFINITIONS

namespace loom::schedule::detail {

LOOM_INLINE std::string svg_number(double x) {
    char buffer[64];
    std::snprintf(buffer, sizeof buffer, "%.3f", x);
    std::string s = buffer;
    while (!s.empty() && s.back() == '0') s.pop_back();
    if (!s.empty() && s.back() == '.') s.pop_back();
    return s == "-0" ? "0" : s;
}

LOOM_INLINE std::string xml_escape(std::string_view text) {
    std::string out;
    for (char c : text) {
        switch (c) {
            case '&': out += "&amp;"; break;
            case '<': out += "&lt;"; break;
            case '>': out += "&gt;"; break;
            case '"': out += "&quot;"; break;
            default: out += c;
        }
    }
    return out;
}
}  // namespace loom::schedule::detail

namespace loom::schedule {

LOOM_INLINE std::string svg_timeline(const simulation& r, const svg_options& o) {
    using detail::svg_number;
    const auto& p = r.source.shape;
    const double plot_width = r.makespan * o.pixels_per_unit;
    const double rows = p.devices * (o.row_height + o.row_gap);
    const double width = o.left + plot_width + o.right, height = o.top + rows + o.bottom;
    std::string svg = "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"" + svg_number(width) + "\" height=\"" +
                      svg_number(height) + "\" viewBox=\"0 0 " + svg_number(width) + " " + svg_number(height) +
                      "\" font-family=\"sans-serif\" font-size=\"12\">\n";
    svg += "<text x=\"" + svg_number(o.left) + "\" y=\"" + svg_number(o.top - 10) + "\" font-size=\"14\">" +
           detail::xml_escape(r.source.name.empty() ? "schedule" : r.source.name) + " (makespan " +
           svg_number(r.makespan) + ", bubble " + svg_number(100.0 * r.bubble_fraction) + "%)</text>\n";
    for (int d = 0; d < p.devices; ++d) {
        const double y = o.top + d * (o.row_height + o.row_gap);
        svg += "<text x=\"" + svg_number(o.left - 8) + "\" y=\"" + svg_number(y + o.row_height / 2 + 4) +
               "\" text-anchor=\"end\">device " + std::to_string(d) + "</text>\n";
        for (const block& b : r.source.device_order[static_cast<std::size_t>(d)]) {
            const timed_block& t = r.at(b);
            const double x = o.left + t.start * o.pixels_per_unit, w = (t.end - t.start) * o.pixels_per_unit;
            const std::string name = to_string(b, p.rounds);
            svg += "<rect class=\"block\" data-block=\"" + name + "\" data-device=\"" + std::to_string(d) + "\" x=\"" +
                   svg_number(x) + "\" y=\"" + svg_number(y) + "\" width=\"" + svg_number(w) + "\" height=\"" +
                   svg_number(o.row_height) + "\" fill=\"" + detail::block_colour(b) +
                   "\" stroke=\"white\"><title>" + name + " [" + svg_number(t.start) + ", " + svg_number(t.end) +
                   ")</title></rect>\n";
            svg += "<text x=\"" + svg_number(x + w / 2) + "\" y=\"" + svg_number(y + o.row_height / 2 + 4) +
                   "\" text-anchor=\"middle\" fill=\"" + (is_backward(b) ? "black" : "white") + "\">" +
                   std::to_string(b.micro) + "</text>\n";
        }
    }
    // the time axis
    const double axis_y = o.top + rows;
    svg += "<line class=\"axis\" x1=\"" + svg_number(o.left) + "\" y1=\"" + svg_number(axis_y) + "\" x2=\"" +
           svg_number(o.left + plot_width) + "\" y2=\"" + svg_number(axis_y) + "\" stroke=\"black\"/>\n";
    const double step = detail::tick_step(r.makespan);
    for (int k = 0; k * step <= r.makespan + 1e-9; ++k) {
        const double x = o.left + k * step * o.pixels_per_unit;
        svg += "<line class=\"tick\" x1=\"" + svg_number(x) + "\" y1=\"" + svg_number(axis_y) + "\" x2=\"" +
               svg_number(x) + "\" y2=\"" + svg_number(axis_y + 5) + "\" stroke=\"black\"/>\n";
        svg += "<text x=\"" + svg_number(x) + "\" y=\"" + svg_number(axis_y + 18) + "\" text-anchor=\"middle\">" +
               svg_number(k * step) + "</text>\n";
    }
    svg += "<text x=\"" + svg_number(o.left + plot_width / 2) + "\" y=\"" + svg_number(axis_y + 34) +
           "\" text-anchor=\"middle\">time</text>\n";
    svg += "</svg>\n";
    return svg;
}

}  // namespace loom::schedule
#endif  // LOOM_HEADER_DEFINITIONS
