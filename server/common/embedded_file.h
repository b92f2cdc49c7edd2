// A file compiled into the binary by cmake/embed_files.cmake (the dashboard,
// the recipes): its path relative to the directory it was embedded from,
// and its bytes.
#pragma once

#include <span>
#include <string_view>

namespace circuitlab {

struct EmbeddedFile {
  std::string_view name;  // "E.9.json", "vendor/uplot/uPlot.iife.min.js"
  std::string_view bytes;
};

}  // namespace circuitlab
