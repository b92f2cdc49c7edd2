#include "client/lib/sweep_render.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdio>
#include <map>
#include <sstream>
#include <vector>

namespace circuitlab::client {
namespace {

using google::protobuf::Value;

bool IsNumber(const Value& v) { return v.kind_case() == Value::kNumberValue; }
bool IsEmpty(const Value& v) {
  return v.kind_case() == Value::kNullValue || v.kind_case() == Value::KIND_NOT_SET;
}

std::string StateName(v1::RunState s) {
  std::string name = v1::RunState_Name(s);
  return name.rfind("RUN_STATE_", 0) == 0 ? name.substr(10) : name;
}

// Terminal columns of a UTF-8 string.
size_t Columns(const std::string& s) {
  size_t n = 0;
  for (unsigned char c : s) n += (c & 0xC0) != 0x80;
  return n;
}

std::string Pad(const std::string& s, size_t width) {
  const size_t n = Columns(s);
  return n >= width ? s : s + std::string(width - n, ' ');
}

std::string Csv(const std::string& s) {
  if (s.find_first_of(",\"\n") == std::string::npos) return s;
  std::string out = "\"";
  for (char c : s) out += c == '"' ? std::string("\"\"") : std::string(1, c);
  return out + "\"";
}

std::string XmlEscape(const std::string& s) {
  std::string out;
  for (char c : s) {
    switch (c) {
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '&': out += "&amp;"; break;
      case '"': out += "&quot;"; break;
      default: out += c;
    }
  }
  return out;
}

// Categorical colours (Okabe-Ito, colour-blind safe) as RGB.
constexpr int kPalette[][3] = {{0, 114, 178}, {230, 159, 0},  {0, 158, 115}, {204, 121, 167},
                               {86, 180, 233}, {213, 94, 0},  {240, 228, 66}, {120, 120, 120}};

// Sequential colour for t in [0, 1] (dark blue to yellow).
void Ramp(double t, int rgb[3]) {
  t = std::clamp(t, 0.0, 1.0);
  const int lo[3] = {68, 1, 84}, mid[3] = {33, 145, 140}, hi[3] = {253, 231, 37};
  for (int i = 0; i < 3; ++i) {
    rgb[i] = t < 0.5 ? static_cast<int>(lo[i] + (mid[i] - lo[i]) * t * 2)
                     : static_cast<int>(mid[i] + (hi[i] - mid[i]) * (t - 0.5) * 2);
  }
}

// Colour of every cell plus the legend entries.
struct Colouring {
  std::vector<std::array<int, 3>> cells;  // per cell; {-1,..} for empty
  std::vector<std::pair<std::string, std::array<int, 3>>> legend;
  bool numeric = true;
  double lo = 0, hi = 0;
};

Colouring Colour(const v1::PivotTable& p) {
  Colouring c;
  std::map<std::string, size_t> category;
  for (const Value& v : p.cells()) {
    if (IsEmpty(v)) continue;
    if (!IsNumber(v)) c.numeric = false;
  }
  bool first = true;
  for (const Value& v : p.cells()) {
    if (!IsNumber(v)) continue;
    c.lo = first ? v.number_value() : std::min(c.lo, v.number_value());
    c.hi = first ? v.number_value() : std::max(c.hi, v.number_value());
    first = false;
  }
  for (const Value& v : p.cells()) {
    std::array<int, 3> rgb = {-1, -1, -1};
    if (!IsEmpty(v)) {
      if (c.numeric) {
        int x[3];
        Ramp(c.hi > c.lo ? (v.number_value() - c.lo) / (c.hi - c.lo) : 0.5, x);
        rgb = {x[0], x[1], x[2]};
      } else {
        const std::string key = CellText(v);
        auto it = category.find(key);
        if (it == category.end()) {
          const size_t k = category.size() % (sizeof(kPalette) / sizeof(kPalette[0]));
          it = category.emplace(key, k).first;
          c.legend.emplace_back(key, std::array<int, 3>{kPalette[k][0], kPalette[k][1], kPalette[k][2]});
        }
        rgb = {kPalette[it->second][0], kPalette[it->second][1], kPalette[it->second][2]};
      }
    }
    c.cells.push_back(rgb);
  }
  return c;
}

}  // namespace

std::string CellText(const Value& v) {
  switch (v.kind_case()) {
    case Value::kNumberValue: {
      const double x = v.number_value();
      char buf[32];
      if (x == std::floor(x) && std::abs(x) < 1e12) {
        std::snprintf(buf, sizeof(buf), "%.0f", x);
      } else {
        std::snprintf(buf, sizeof(buf), "%.4g", x);
      }
      return buf;
    }
    case Value::kStringValue: return v.string_value();
    case Value::kBoolValue: return v.bool_value() ? "true" : "false";
    default: return "-";
  }
}

std::string SummaryTable(const v1::GetSweepSummaryResponse& s) {
  std::vector<std::string> header = {"RUN", "STATE"};
  for (const std::string& a : s.axes()) header.push_back(a);
  for (const std::string& c : s.columns()) header.push_back(c);
  std::vector<std::vector<std::string>> rows;
  for (const v1::SweepRow& r : s.rows()) {
    std::vector<std::string> row = {r.run_id(), StateName(r.state())};
    for (const Value& v : r.swept()) row.push_back(CellText(v));
    for (const Value& v : r.values()) row.push_back(CellText(v));
    rows.push_back(std::move(row));
  }
  std::vector<size_t> width(header.size());
  for (size_t i = 0; i < header.size(); ++i) width[i] = Columns(header[i]);
  for (const auto& row : rows) {
    for (size_t i = 0; i < row.size() && i < width.size(); ++i) width[i] = std::max(width[i], Columns(row[i]));
  }
  std::ostringstream out;
  auto line = [&](const std::vector<std::string>& cells) {
    for (size_t i = 0; i < cells.size(); ++i) out << (i ? "  " : "") << Pad(cells[i], width[i]);
    out << "\n";
  };
  line(header);
  for (const auto& row : rows) line(row);
  return out.str();
}

std::string SummaryCsv(const v1::GetSweepSummaryResponse& s) {
  std::ostringstream out;
  out << "run_id,state";
  for (const std::string& a : s.axes()) out << "," << Csv(a);
  for (const std::string& c : s.columns()) out << "," << Csv(c);
  out << "\n";
  for (const v1::SweepRow& r : s.rows()) {
    out << r.run_id() << "," << StateName(r.state());
    for (const Value& v : r.swept()) out << "," << (IsEmpty(v) ? "" : Csv(CellText(v)));
    for (const Value& v : r.values()) out << "," << (IsEmpty(v) ? "" : Csv(CellText(v)));
    out << "\n";
  }
  return out.str();
}

std::string PivotText(const v1::PivotTable& p, bool color) {
  const int nx = p.x_values_size(), ny = p.y_values_size();
  if (nx == 0 || ny == 0) return "(empty pivot: no rows)\n";
  const Colouring col = Colour(p);
  size_t cell_w = 3, y_w = Columns(p.y());
  for (const Value& v : p.cells()) cell_w = std::max(cell_w, Columns(CellText(v)));
  for (const Value& v : p.x_values()) cell_w = std::max(cell_w, Columns(CellText(v)));
  for (const Value& v : p.y_values()) y_w = std::max(y_w, Columns(CellText(v)));
  cell_w = std::min<size_t>(cell_w, 14);
  std::ostringstream out;
  out << p.value() << " by " << p.y() << " (rows) and " << p.x() << " (columns)\n";
  for (int yi = ny - 1; yi >= 0; --yi) {  // largest y on top, like a plot
    out << Pad(CellText(p.y_values(yi)), y_w) << " |";
    for (int xi = 0; xi < nx; ++xi) {
      const int k = yi * nx + xi;
      std::string text = CellText(p.cells(k));
      if (Columns(text) > cell_w) text = text.substr(0, cell_w);
      const auto& rgb = col.cells[static_cast<size_t>(k)];
      out << " ";
      if (color && rgb[0] >= 0) {
        const bool light = rgb[0] * 0.299 + rgb[1] * 0.587 + rgb[2] * 0.114 > 140;
        out << "\033[48;2;" << rgb[0] << ";" << rgb[1] << ";" << rgb[2] << "m" << (light ? "\033[30m" : "\033[97m");
      }
      const size_t n = Columns(text);
      out << std::string((cell_w - n) / 2, ' ') << text << std::string(cell_w - n - (cell_w - n) / 2, ' ');
      if (color && rgb[0] >= 0) out << "\033[0m";
    }
    out << "\n";
  }
  out << std::string(y_w, ' ') << " +" << std::string(static_cast<size_t>(nx) * (cell_w + 1), '-') << "\n";
  out << std::string(y_w + 2, ' ');
  for (int xi = 0; xi < nx; ++xi) {
    std::string text = CellText(p.x_values(xi));
    if (Columns(text) > cell_w) text = text.substr(0, cell_w);
    const size_t n = Columns(text);
    out << " " << std::string((cell_w - n) / 2, ' ') << text << std::string(cell_w - n - (cell_w - n) / 2, ' ');
  }
  out << "   (" << p.x() << ")\n";
  if (!col.numeric && !col.legend.empty()) {
    out << "legend:";
    for (const auto& [name, rgb] : col.legend) {
      out << " ";
      if (color) out << "\033[48;2;" << rgb[0] << ";" << rgb[1] << ";" << rgb[2] << "m  \033[0m ";
      out << name;
    }
    out << "\n";
  } else if (col.numeric) {
    out << "range: " << CellText([&] { Value v; v.set_number_value(col.lo); return v; }()) << " .. "
        << CellText([&] { Value v; v.set_number_value(col.hi); return v; }()) << "\n";
  }
  return out.str();
}

std::string PivotSvg(const v1::PivotTable& p, const std::string& title) {
  const int nx = p.x_values_size(), ny = p.y_values_size();
  const Colouring col = Colour(p);
  const int cell = 56, left = 90, top = 50, legend_h = 30 + 20 * static_cast<int>(col.legend.size());
  const int width = left + nx * cell + 180, height = top + ny * cell + 60 + legend_h;
  std::ostringstream out;
  out << "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"" << width << "\" height=\"" << height
      << "\" font-family=\"sans-serif\" font-size=\"12\">\n";
  out << "<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n";
  out << "<text x=\"" << left << "\" y=\"22\" font-size=\"15\">" << XmlEscape(title) << "</text>\n";
  for (int yi = 0; yi < ny; ++yi) {
    const int row = ny - 1 - yi;  // largest y on top
    const int y = top + row * cell;
    out << "<text x=\"" << left - 8 << "\" y=\"" << y + cell / 2 + 4 << "\" text-anchor=\"end\">"
        << XmlEscape(CellText(p.y_values(yi))) << "</text>\n";
    for (int xi = 0; xi < nx; ++xi) {
      const int k = yi * nx + xi;
      const auto& rgb = col.cells[static_cast<size_t>(k)];
      const int x = left + xi * cell;
      out << "<rect x=\"" << x << "\" y=\"" << y << "\" width=\"" << cell - 2 << "\" height=\"" << cell - 2
          << "\" fill=\"";
      if (rgb[0] >= 0) {
        out << "rgb(" << rgb[0] << "," << rgb[1] << "," << rgb[2] << ")";
      } else {
        out << "#eeeeee";
      }
      out << "\"><title>" << XmlEscape(p.x() + "=" + CellText(p.x_values(xi)) + ", " + p.y() + "=" +
                                       CellText(p.y_values(yi)) + ": " + CellText(p.cells(k)))
          << "</title></rect>\n";
      const bool light = rgb[0] < 0 || rgb[0] * 0.299 + rgb[1] * 0.587 + rgb[2] * 0.114 > 140;
      std::string text = CellText(p.cells(k));
      if (text.size() > 8) text = text.substr(0, 8);
      out << "<text x=\"" << x + cell / 2 - 1 << "\" y=\"" << y + cell / 2 + 4 << "\" text-anchor=\"middle\" fill=\""
          << (light ? "black" : "white") << "\">" << XmlEscape(text) << "</text>\n";
    }
  }
  for (int xi = 0; xi < nx; ++xi) {
    out << "<text x=\"" << left + xi * cell + cell / 2 - 1 << "\" y=\"" << top + ny * cell + 16
        << "\" text-anchor=\"middle\">" << XmlEscape(CellText(p.x_values(xi))) << "</text>\n";
  }
  out << "<text x=\"" << left + nx * cell / 2 << "\" y=\"" << top + ny * cell + 38 << "\" text-anchor=\"middle\">"
      << XmlEscape(p.x()) << "</text>\n";
  out << "<text x=\"20\" y=\"" << top + ny * cell / 2 << "\" transform=\"rotate(-90 20 " << top + ny * cell / 2
      << ")\" text-anchor=\"middle\">" << XmlEscape(p.y()) << "</text>\n";
  int ly = top + ny * cell + 60;
  out << "<text x=\"" << left << "\" y=\"" << ly << "\">" << XmlEscape(p.value());
  if (col.numeric) out << ": " << CellText([&] { Value v; v.set_number_value(col.lo); return v; }()) << " (dark) .. "
                       << CellText([&] { Value v; v.set_number_value(col.hi); return v; }()) << " (light)";
  out << "</text>\n";
  for (const auto& [name, rgb] : col.legend) {
    ly += 20;
    out << "<rect x=\"" << left << "\" y=\"" << ly - 11 << "\" width=\"14\" height=\"14\" fill=\"rgb(" << rgb[0]
        << "," << rgb[1] << "," << rgb[2] << ")\"/><text x=\"" << left + 20 << "\" y=\"" << ly << "\">"
        << XmlEscape(name) << "</text>\n";
  }
  out << "</svg>\n";
  return out.str();
}

}  // namespace circuitlab::client
