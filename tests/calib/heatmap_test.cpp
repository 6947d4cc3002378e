// The heat map reads at a glance: one sequential scale, darkest for the smallest window and
// palest for full, the same in the cells and the legend.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <regex>

#include "headwise/report/calib_report.hpp"
#include "toy_model.hpp"

using namespace headwise;

namespace {

// Relative luminance of "#rrggbb".
double luminance(const std::string& hex) {
  const auto channel = [&](size_t at) { return std::stoi(hex.substr(at, 2), nullptr, 16) / 255.0; };
  return 0.2126 * channel(1) + 0.7152 * channel(3) + 0.0722 * channel(5);
}

// Hue in degrees of "#rrggbb" (HSV); a sequential scale keeps one hue and varies lightness.
double hue(const std::string& hex) {
  const double r = std::stoi(hex.substr(1, 2), nullptr, 16),
               g = std::stoi(hex.substr(3, 2), nullptr, 16),
               b = std::stoi(hex.substr(5, 2), nullptr, 16);
  const double hi = std::max({r, g, b}), lo = std::min({r, g, b}), c = hi - lo;
  if (c == 0) return 0;
  double h = hi == r ? std::fmod((g - b) / c, 6.0) : hi == g ? (b - r) / c + 2 : (r - g) / c + 4;
  return std::fmod(h * 60 + 360, 360);
}

}  // namespace

TEST_CASE("heat map: a sequential scale from the smallest window (dark) to full (pale)",
          "[calib]") {
  const auto spec = test::toy_spec({{{test::HeadRole::kLocal},
                                     {test::HeadRole::kLocal},
                                     {test::HeadRole::kLocal},
                                     {test::HeadRole::kLocal}}});
  for (const auto& levels :
       {std::vector<int64_t>{64, kFullWindow}, std::vector<int64_t>{64, 256, 1024, kFullWindow},
        std::vector<int64_t>{16, 64, 256, 1024, 4096, 16384, 65536, kFullWindow}}) {
    const measure::WindowLadder ladder{levels};
    // Head h at level h (the last level repeated when the ladder is shorter than the layer).
    std::vector<int64_t> heads;
    for (size_t h = 0; h < 4; ++h)
      heads.push_back(levels[std::min(h * (levels.size() - 1) / 3, levels.size() - 1)]);
    const std::string svg = report::window_heatmap_svg(spec, {{0, heads}}, ladder, "title");
    const std::regex cell(R"re(fill="(#[0-9a-f]{6})" stroke="white")re");
    std::vector<double> cells, hues;
    for (auto it = std::sregex_iterator(svg.begin(), svg.end(), cell); it != std::sregex_iterator();
         ++it) {
      cells.push_back(luminance((*it)[1]));
      hues.push_back(hue((*it)[1]));
    }
    REQUIRE(cells.size() == 4);
    INFO(svg);
    for (size_t h = 1; h < cells.size(); ++h) CHECK(cells[h] >= cells[h - 1]);
    CHECK(cells.back() > cells.front());  // full is paler than the smallest window
    const auto [low, high] = std::minmax_element(hues.begin(), hues.end());
    CHECK(*high - *low < 30);  // one hue, not a rainbow
  }
}

TEST_CASE("heat map: h2o heads are marked and coloured as the level their slots were cut from",
          "[calib]") {
  const auto spec = test::toy_spec({{{test::HeadRole::kLocal},
                                     {test::HeadRole::kLocal},
                                     {test::HeadRole::kLocal},
                                     {test::HeadRole::kLocal}}});
  const measure::WindowLadder ladder{{128, 512, 2048, kFullWindow}};
  const std::map<int64_t, std::vector<int64_t>> served{{0, {448, 448, 512, kFullWindow}}};
  const auto colours = [](const std::string& svg) {
    const std::regex cell(R"re(fill="(#[0-9a-f]{6})" stroke="white")re");
    std::vector<std::string> out;
    for (auto it = std::sregex_iterator(svg.begin(), svg.end(), cell); it != std::sregex_iterator();
         ++it)
      out.push_back((*it)[1]);
    return out;
  };
  using policy::KeepRule;
  const std::string marked = report::window_heatmap_svg(
      spec, served, ladder, "t",
      {{0, {KeepRule::kH2O, KeepRule::kH2O, KeepRule::kWindow, KeepRule::kWindow}}});
  INFO(marked);
  const auto cells = colours(marked);
  REQUIRE(cells.size() == 4);
  CHECK(cells[0] == cells[2]);  // 448 h2o slots cut from 512: 512's colour, not full's
  CHECK(cells[0] != cells[3]);
  const std::regex mark(R"re(>h</text>)re");
  CHECK(std::distance(std::sregex_iterator(marked.begin(), marked.end(), mark),
                      std::sregex_iterator()) == 2);
  CHECK(marked.find("448 slots of heavy hitters (h2o)") != std::string::npos);
  CHECK(marked.find("heavy hitters (h2o), not a window") !=
        std::string::npos);  // the legend says what h is
  // Without rules: no marks, no legend line.
  const std::string plain =
      report::window_heatmap_svg(spec, {{0, {512, 512, 512, kFullWindow}}}, ladder, "t");
  CHECK(plain.find(">h</text>") == std::string::npos);
  CHECK(plain.find("heavy hitters") == std::string::npos);
}
