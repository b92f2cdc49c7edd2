// Renderings of a sweep summary: a table for people, CSV for tools, and a
// pivot as a terminal heatmap or an SVG file. Numbers shade from low to high;
// text values (circuit labels) get one colour each, with a legend.
#pragma once

#include <string>

#include "circuitlab/v1/experiment_service.pb.h"

namespace circuitlab::client {

// One value as printed ("-" for null).
std::string CellText(const google::protobuf::Value& v);

// Columns: run, state, each axis, each value column.
std::string SummaryTable(const v1::GetSweepSummaryResponse& summary);
// RFC 4180 CSV with a header row; empty fields for nulls.
std::string SummaryCsv(const v1::GetSweepSummaryResponse& summary);
// The pivot as a grid (y rows top to bottom descending, x columns), one cell
// per (x, y); `color` adds ANSI background colours.
std::string PivotText(const v1::PivotTable& pivot, bool color);
// A self-contained SVG heatmap with axis labels, cell values and a legend.
std::string PivotSvg(const v1::PivotTable& pivot, const std::string& title);

}  // namespace circuitlab::client
